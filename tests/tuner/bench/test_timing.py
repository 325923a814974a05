from __future__ import annotations

import pytest

from compiler.errors import KilnError
from tuner.bench.timing import (
    CpuSnapshot,
    ManualClock,
    cpu_snapshot,
    interleave,
    others_cpu,
    parse_slowdown,
    rotated_orders,
)


def test_parse_slowdown() -> None:
    assert parse_slowdown(None) == {} and parse_slowdown("") == {}
    assert parse_slowdown("kiln default=1.3,numpy=2") == {"kiln default": 1.3, "numpy": 2.0}
    for bad in ("kiln default", "=1.3", "numpy=fast"):
        with pytest.raises(KilnError, match="CONTENDER=FACTOR"):
            parse_slowdown(bad)
    with pytest.raises(KilnError, match="at least 1"):
        parse_slowdown("numpy=0.5")


def test_rounds_are_interleaved_in_rotated_order() -> None:
    clock = ManualClock()
    calls: list[str] = []

    def contender(name: str, us: float):  # type: ignore[no-untyped-def]
        def run() -> None:
            calls.append(name)
            clock.advance(us * 1e-6)

        return run

    timed = interleave(
        {"a": contender("a", 100), "b": contender("b", 200), "c": contender("c", 400)},
        rounds=3,
        min_time=0.00095,
        clocks={"a": clock, "b": clock, "c": clock},
    )
    runs = [calls[0]]  # the contenders in the order they ran, repeats collapsed
    for name in calls[1:]:
        if name != runs[-1]:
            runs.append(name)
    assert runs == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert runs == [name for order in rotated_orders(["a", "b", "c"], 3) for name in order]
    assert [len(r) for r in timed["a"].rounds] == [10, 10, 10]  # min_time / latency calls per round
    assert [len(r) for r in timed["c"].rounds] == [3, 3, 3]  # at least three calls
    assert timed["b"].round_medians == pytest.approx([200.0] * 3)


def test_slowdown_hook_stretches_each_call() -> None:
    clock = ManualClock()
    timed = interleave(
        {"x": lambda: clock.advance(1e-3), "y": lambda: clock.advance(1e-3)},
        rounds=2,
        min_time=0.01,
        clocks={"x": clock, "y": clock},
        slowdown={"x": 1.3},
    )
    assert timed["x"].samples == pytest.approx([1300.0] * len(timed["x"].samples))
    assert timed["y"].samples == pytest.approx([1000.0] * len(timed["y"].samples))


def test_others_cpu_is_the_machine_busy_time_less_this_process() -> None:
    before = CpuSnapshot(wall=10.0, busy=100.0, own=5.0)
    # in 2 s the CPUs were busy 3.5 s, 1.5 s of it this process's threads: another job kept one core busy
    assert others_cpu(before, CpuSnapshot(wall=12.0, busy=103.5, own=6.5)) == 1.0
    assert others_cpu(before, CpuSnapshot(wall=12.0, busy=101.0, own=6.5)) == 0.0  # tick rounding: not < 0
    assert others_cpu(before, before) is None and others_cpu(None, before) is None


def test_cpu_snapshot_counts_this_process_work() -> None:
    first = cpu_snapshot()
    if first is None:
        pytest.skip("no /proc/stat on this OS: the bench reports no other processes' CPU")
    end = first.own + 0.05
    while cpu_snapshot().own < end:  # type: ignore[union-attr]
        pass
    second = cpu_snapshot()
    assert second is not None and second.wall > first.wall and second.own >= end and second.busy >= first.busy
