"""What scripts/bench_torch.py shares with older benchmark scripts: the thread count, a machine line, the
git commit, a timing loop, a markdown table and printing (and saving) a report. The regression benchmarks
(contenders, methodology, ceilings, storage, reports) are `kiln bench` (tuner/bench/); scripts/bench_cpu.py,
bench_onnx.py and bench_gpu.py wrap it.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

THREADS = len(os.sched_getaffinity(0))


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def git_commit() -> str:
    """HEAD's commit, ``+dirty`` when tracked files differ from it ("unknown" without git)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(
            ["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
        )
    except OSError:
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def short_commit(commit: str) -> str:
    """A :func:`git_commit` string as reports print it: 12 hex digits, ``+dirty`` kept."""
    return commit[:12] + ("+dirty" if commit.endswith("+dirty") else "")


def machine_line() -> str:
    return f"{cpu_name()}, {THREADS} threads, {datetime.date.today().isoformat()}"


def time_fn(fn: Callable[[], object], min_time: float = 0.05, max_iters: int = 200) -> float:
    """Median latency in microseconds over repeats that last at least ``min_time`` seconds."""
    fn()
    samples = []
    start = time.perf_counter()
    while (time.perf_counter() - start < min_time or len(samples) < 3) and len(samples) < max_iters:
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e6


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    head = "| " + " | ".join(columns) + " |"
    sep = "|" + "|".join("---:" if i else "---" for i in range(len(columns))) + "|"
    lines = [head, sep]
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(c, "")) for c in columns) + " |")
    return "\n".join(lines)


def emit_report(lines: list[str], out: str | None) -> None:
    """Print a markdown report, and write it to ``out`` too when given."""
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        Path(out).write_text(text)
        print(f"wrote {out}")
