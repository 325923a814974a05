"""How `kiln bench` times contenders: interleaved rounds in rotated order, every sample kept.

Every contender of a workload is timed in the same process, round by round; round ``r`` starts with the
``r``-th contender (A B C, B C A, C A B, ...), so slow drift of a shared machine and "who runs right after
whom" hit every contender alike. In a round a contender runs back to back until ``min_time`` seconds have
passed (at least three calls, at most ``max_calls``); every call's latency is kept, and the round's median
is what the spread and the regression test look at (calls in one round are not independent samples).
The load average is read before and after each workload.

Test hook: ``KILN_BENCH_SLOWDOWN="CONTENDER=FACTOR[,CONTENDER=FACTOR]"`` (e.g. ``"kiln default=1.3"``)
makes each call of that contender last FACTOR times as long (it waits after the call inside the timed
span). It exists so that the regression gate can be tested end to end; a run made with it records the
factors in its settings and the report says so.
"""

from __future__ import annotations

import os
import statistics
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from compiler.errors import KilnError

SLOWDOWN_ENV = "KILN_BENCH_SLOWDOWN"


class Clock(ABC):
    """Where sample times come from. ``now()`` is seconds (monotonic); ``wait_until(t)`` returns once
    ``now() >= t`` (the slowdown hook's wait)."""

    @abstractmethod
    def now(self) -> float: ...

    @abstractmethod
    def wait_until(self, deadline: float) -> None: ...


class PerfClock(Clock):
    """``time.perf_counter``; waiting spins (a sleep would hand the core to another process)."""

    def now(self) -> float:
        return time.perf_counter()

    def wait_until(self, deadline: float) -> None:
        while time.perf_counter() < deadline:
            pass


class ManualClock(Clock):
    """An in-memory clock for tests: time moves only when :meth:`advance` (or a wait) moves it."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds

    def wait_until(self, deadline: float) -> None:
        self.t = max(self.t, deadline)


PERF_CLOCK = PerfClock()


@dataclass
class Timed:
    """What was measured for one contender: every call's latency (us), grouped by round."""

    rounds: list[list[float]] = field(default_factory=list)

    @property
    def samples(self) -> list[float]:
        return [s for r in self.rounds for s in r]

    @property
    def round_medians(self) -> list[float]:
        return [statistics.median(r) for r in self.rounds]


def parse_slowdown(text: str | None) -> dict[str, float]:
    """``KILN_BENCH_SLOWDOWN``'s value as {contender: factor}; a malformed value is a KilnError."""
    if not text:
        return {}
    out: dict[str, float] = {}
    for part in text.split(","):
        name, sep, factor = part.rpartition("=")
        try:
            if not sep or not name.strip():
                raise ValueError
            value = float(factor)
        except ValueError:
            raise KilnError(
                f"{SLOWDOWN_ENV}={text!r}: each item must look like CONTENDER=FACTOR, e.g. 'kiln default=1.3'"
            ) from None
        if value < 1.0:
            raise KilnError(f"{SLOWDOWN_ENV}: factor {value} for {name.strip()!r} must be at least 1")
        out[name.strip()] = value
    return out


def slowdown_from_env() -> dict[str, float]:
    return parse_slowdown(os.environ.get(SLOWDOWN_ENV))


def _round(
    fn: Callable[[], Any], clock: Clock, min_time: float, max_calls: int, factor: float
) -> list[float]:
    samples: list[float] = []
    start = clock.now()
    while (clock.now() - start < min_time or len(samples) < 3) and len(samples) < max_calls:
        t0 = clock.now()
        fn()
        if factor != 1.0:
            clock.wait_until(t0 + (clock.now() - t0) * factor)
        samples.append((clock.now() - t0) * 1e6)
    return samples


def interleave(
    calls: Mapping[str, Callable[[], Any]],
    rounds: int,
    min_time: float,
    *,
    clocks: Mapping[str, Clock] | None = None,
    slowdown: Mapping[str, float] | None = None,
    max_calls: int = 10_000,
) -> dict[str, Timed]:
    """Time ``calls`` in ``rounds`` interleaved rounds, the order rotated every round (see the module doc).
    ``clocks`` gives a contender its own clock (default :data:`PERF_CLOCK`)."""
    names = list(calls)
    clocks = clocks or {}
    slowdown = slowdown or {}
    out = {name: Timed() for name in names}
    for order in rotated_orders(names, rounds):
        for name in order:
            clock = clocks.get(name, PERF_CLOCK)
            out[name].rounds.append(_round(calls[name], clock, min_time, max_calls, slowdown.get(name, 1.0)))
    return out


@dataclass(frozen=True)
class CpuSnapshot:
    """What the machine's CPUs had done at one wall time: ``busy`` seconds of all CPUs (``/proc/stat``:
    everything but idle and iowait) and ``own`` seconds of this process's threads (``os.times``: user +
    system; its child processes are not counted, so a leftover worker process counts as another job)."""

    wall: float
    busy: float
    own: float


def cpu_snapshot() -> CpuSnapshot | None:
    """The machine's and this process's CPU time now (None where there is no ``/proc/stat``)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(x) for x in fields[1:]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    # guest time is already inside user / nice
    busy = sum(ticks[:8]) - idle
    t = os.times()
    return CpuSnapshot(time.perf_counter(), busy / os.sysconf("SC_CLK_TCK"), t.user + t.system)


def others_cpu(before: CpuSnapshot | None, after: CpuSnapshot | None) -> float | None:
    """How many CPUs other processes kept busy, on average, between two snapshots (0: nobody else ran;
    1.0: one core's worth of another job); None without both snapshots or for an empty span. The load
    average cannot tell this: it lags by a minute and counts this process's own threads."""
    if before is None or after is None or after.wall <= before.wall:
        return None
    other = (after.busy - before.busy) - (after.own - before.own)
    return max(0.0, other / (after.wall - before.wall))


def load_average() -> float | None:
    """The one-minute load average (None where the OS has none)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def rotated_orders(names: Sequence[str], rounds: int) -> list[list[str]]:
    """The order of each round (what :func:`interleave` runs), for reports and tests."""
    names = list(names)
    return [names[r % len(names) :] + names[: r % len(names)] for r in range(rounds)] if names else []
