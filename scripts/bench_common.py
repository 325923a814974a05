"""Shared pieces of Kiln's benchmark scripts: timing, peers (numpy, onnxruntime, torch) and ceilings.

Timing: every contender is timed in the same process, in interleaved rounds (A, B, C, A, B, C, ...),
median of the per-round medians, so slow drift of this shared machine hits everyone alike. Outputs are
preallocated/reused where the contender allows it, and each benchmark table says so.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np

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


def interleaved(contenders: dict[str, Callable[[], object]], rounds: int = 3, min_time: float = 0.05) -> dict:
    """{name: median of per-round medians (us)} with the contenders interleaved round by round."""
    per: dict[str, list[float]] = {k: [] for k in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            per[name].append(time_fn(fn, min_time))
    return {k: statistics.median(v) for k, v in per.items()}


def copy_bandwidth_gbs(mib: int = 256) -> float:
    """DRAM copy bandwidth with numpy (bytes read + written per second)."""
    a = np.ones(mib * (1 << 20) // 4, np.float32)
    b = np.empty_like(a)
    us = time_fn(lambda: np.copyto(b, a), min_time=0.3)
    return 2 * a.nbytes / (us * 1e-6) / 1e9


def numpy_sgemm_gflops(n: int = 1024) -> float:
    a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((n, n)).astype(np.float32)
    c = np.empty((n, n), np.float32)
    us = time_fn(lambda: np.matmul(a, b, out=c), min_time=0.3)
    return 2 * n**3 / (us * 1e-6) / 1e9


def ort_runner(graph, inputs: list[np.ndarray]) -> Callable[[], object] | None:
    try:
        from compiler.frontend.onnx_export import ort_feeds, ort_session
    except ImportError:
        return None
    sess = ort_session(graph, threads=THREADS)
    feeds = ort_feeds(sess, inputs)
    return lambda: sess.run(None, feeds)


def torch_runners(graph, inputs: list[np.ndarray]) -> dict[str, Callable[[], object]]:
    """torch eager and torch.compile of the same graph, when torch is importable (else {})."""
    try:
        import torch
    except ImportError:
        return {}
    from scripts.torch_peer import eager_and_compiled, graph_to_torch

    torch.set_num_threads(THREADS)
    return eager_and_compiled(graph_to_torch(graph), [torch.from_numpy(x) for x in inputs], graph.name)


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    head = "| " + " | ".join(columns) + " |"
    sep = "|" + "|".join("---:" if i else "---" for i in range(len(columns))) + "|"
    lines = [head, sep]
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(c, "")) for c in columns) + " |")
    return "\n".join(lines)
