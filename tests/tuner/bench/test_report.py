from __future__ import annotations

import io
from pathlib import Path

from tests.tuner.bench.fakes import MissingContender, WrongContender
from tuner.bench import report
from tuner.bench.contenders import BenchContext, InMemoryContender
from tuner.bench.runner import run_suite
from tuner.bench.suite import Suite, Workload
from tuner.bench.timing import ManualClock


def _run(kiln_us: float = 1000.0):  # type: ignore[no-untyped-def]
    clock = ManualClock()
    contenders = [
        InMemoryContender("kiln default", kiln_us, noise=0.0, clock=clock),
        InMemoryContender("numpy", 4000.0, noise=0.0, clock=clock),
        WrongContender(),
        MissingContender(),
    ]
    suite = Suite("t", (Workload("softmax", "softmax"), Workload("matmul", "matmul")))
    run = run_suite(
        suite, contenders, BenchContext("cpu", 2), target_key="cpu/test",
        environment={"cpu": {"model": "Test CPU", "isa": ["avx2"], "threads": 2},
                     "libraries": {"numpy": "2"}},
        settings={"rounds": 4, "min_time": 0.01, "threads": 2, "tuning": [
            {"workload": "softmax", "runs": 1, "measured": 37, "ok": 30, "seconds": 10.0}]},
        command_line="bench --suite t", measure_ceilings=False, log=io.StringIO(),
    )  # fmt: skip
    run.id = 3
    return run


def test_markdown_report() -> None:
    text = report.markdown(_run())
    assert "Command: `kiln bench --suite t` (stored as run 3)" in text
    assert "Test CPU, AVX2, 2 threads" in text
    assert "| `softmax` | 1,000 ±0% | 4,000 ±0% | 4.00x (numpy) |" in text and "4.00x (numpy)" in text
    assert "GFLOP/s" in text.split("| `matmul`")[1].splitlines()[0]  # 1024^3 matmul: compute-bound
    assert "GB/s" in text.split("| `softmax`")[1].splitlines()[0]
    assert "- `missing`: unavailable: missingpkg is not installed" in text
    assert "- `wrong` on `softmax`: wrong_result" in text
    assert "| `softmax` | 1 | 37 | 30 | 10 | 3.7 |" in text  # measured trials, from the database rows
    assert "rotated every round" in text
    # other processes' CPU during each workload's rounds (measured from /proc/stat, whatever it is here)
    assert "CPU that other processes used while each workload's rounds ran" in text
    assert "`softmax` " in text.split("CPU that other processes used")[1]


def test_charts(tmp_path: Path) -> None:
    first, second = _run(), _run(1200.0)
    second.id = 4
    report.bars_chart(second, tmp_path / "bars.png")
    report.history_chart([first, second], tmp_path / "history.png")
    for name in ("bars.png", "history.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
