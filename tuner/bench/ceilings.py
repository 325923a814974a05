"""Ceilings measured in the same run as the contenders, with the same threads.

* Copy bandwidth at a given working set: ``threads`` Python threads each copy their slice of a source
  array into a destination (``np.copyto`` releases the GIL), many times per timed span so thread start-up is
  amortized; bytes read + written per second. Measured at each workload's own working set (its inputs,
  params and outputs: cache-resident when it fits in the caches, as it does for Kiln's repeated calls) and
  at two reference points, a 4 MiB cache-resident set and a 512 MiB DRAM set.
* SGEMM: numpy's BLAS on a 1024^3 float32 product, its threads limited to ``threads`` with threadpoolctl.

Rates are medians over ``rounds`` spans. :class:`CopyCeiling` and :class:`SgemmCeiling` are the same two
measurements as callables, so that the harness times them in the workload's own interleaved rounds, under
the same load as the contenders.
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time

import numpy as np

CACHE_SET = 4 << 20
DRAM_SET = 512 << 20


def copy_gbs(working_set: int, threads: int, rounds: int = 5, min_bytes: int = 256 << 20) -> float:
    """Copy bandwidth (GB/s, read + write) of ``threads`` threads over a ``working_set``-byte set (half
    source, half destination)."""
    n = max(threads * 16, working_set // 8)  # float32 elements per array
    src = np.ones(n, np.float32)
    dst = np.empty_like(src)
    bounds = np.linspace(0, n, threads + 1).astype(int)
    reps = max(1, min_bytes // (2 * src.nbytes))
    barrier = threading.Barrier(threads + 1)

    def work(i: int) -> None:
        s, d = src[bounds[i] : bounds[i + 1]], dst[bounds[i] : bounds[i + 1]]
        for _ in range(rounds + 1):
            barrier.wait()
            for _ in range(reps):
                np.copyto(d, s)
            barrier.wait()

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    spans = []
    for r in range(rounds + 1):  # the first span warms up
        barrier.wait()
        t0 = time.perf_counter()
        barrier.wait()
        if r:
            spans.append(time.perf_counter() - t0)
    for t in pool:
        t.join()
    return 2 * src.nbytes * reps / statistics.median(spans) / 1e9


def sgemm_gflops(threads: int, n: int = 1024, rounds: int = 5) -> float:
    """numpy/BLAS SGEMM GFLOP/s on n^3 with ``threads`` BLAS threads."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    c = np.empty((n, n), np.float32)
    spans = []
    with threadpool_limits(limits=threads, user_api="blas"):
        np.matmul(a, b, out=c)
        for _ in range(rounds):
            t0 = time.perf_counter()
            np.matmul(a, b, out=c)
            spans.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(spans) / 1e9


def machine_ceilings(threads: int) -> dict[str, float]:
    """The reference ceilings of a CPU run."""
    return {
        "copy_cache_gbs": copy_gbs(CACHE_SET, threads),
        "copy_dram_gbs": copy_gbs(DRAM_SET, threads, rounds=3, min_bytes=DRAM_SET),
        "sgemm_gflops": sgemm_gflops(threads),
        "copy_cache_set_bytes": float(CACHE_SET),
        "copy_dram_set_bytes": float(DRAM_SET),
    }


class CopyCeiling:
    """One call copies a ``working_set``-byte set (half source, half destination) ``reps`` times with
    ``threads`` persistent threads (enough reps to move ~64 MiB, so the threads' hand-off is amortized);
    :meth:`gbs` turns a call's latency into GB/s (read + write). :meth:`close` ends the threads."""

    def __init__(self, working_set: int, threads: int, min_bytes: int = 64 << 20) -> None:
        n = max(threads * 16, working_set // 8)
        self.src = np.ones(n, np.float32)
        self.dst = np.empty_like(self.src)
        self.reps = max(1, min_bytes // (2 * self.src.nbytes))
        bounds = np.linspace(0, n, threads + 1).astype(int)
        self._slices = [(self.src[a:b], self.dst[a:b]) for a, b in itertools.pairwise(bounds)]
        self._start = threading.Barrier(threads + 1)
        self._done = threading.Barrier(threads + 1)
        self._stop = False
        self._pool = [threading.Thread(target=self._work, args=(i,), daemon=True) for i in range(threads)]
        for t in self._pool:
            t.start()

    def _work(self, i: int) -> None:
        s, d = self._slices[i]
        while True:
            self._start.wait()
            if self._stop:
                return
            for _ in range(self.reps):
                np.copyto(d, s)
            self._done.wait()

    def __call__(self) -> None:
        self._start.wait()
        self._done.wait()

    def gbs(self, call_us: float) -> float:
        return 2 * self.src.nbytes * self.reps / (call_us * 1e-6) / 1e9

    def close(self) -> None:
        self._stop = True
        self._start.wait()
        for t in self._pool:
            t.join()


class SgemmCeiling:
    """One call is a 1024^3 float32 SGEMM through numpy's BLAS with ``threads`` threads; :meth:`gflops`
    turns a call's latency into GFLOP/s."""

    def __init__(self, threads: int, n: int = 1024) -> None:
        rng = np.random.default_rng(0)
        self.n, self.threads = n, threads
        self.a = rng.standard_normal((n, n)).astype(np.float32)
        self.b = rng.standard_normal((n, n)).astype(np.float32)
        self.c = np.empty((n, n), np.float32)

    def __call__(self) -> None:
        from threadpoolctl import threadpool_limits

        with threadpool_limits(limits=self.threads, user_api="blas"):
            np.matmul(self.a, self.b, out=self.c)

    def gflops(self, call_us: float) -> float:
        return 2 * self.n**3 / (call_us * 1e-6) / 1e9


def cuda_ceilings(copy_mib: int = 1024, n: int = 4096, rounds: int = 5) -> dict[str, float]:
    """The GPU's ceilings: device-to-device copy (GB/s, read + written) of ``copy_mib`` MiB and cuBLAS
    SGEMM through ``cupy.matmul`` on n^3 (TF32 off: CuPy's default), timed with CUDA events."""
    import cupy as cp

    def span_ms(fn) -> float:  # type: ignore[no-untyped-def]
        fn()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        times = []
        for _ in range(rounds):
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end))
        return statistics.median(times)

    a = cp.ones(copy_mib * (1 << 20) // 4, cp.float32)
    b = cp.empty_like(a)
    copy_ms = span_ms(lambda: b.__setitem__(Ellipsis, a))
    x = cp.random.standard_normal((n, n), dtype=cp.float32)
    y = cp.random.standard_normal((n, n), dtype=cp.float32)
    z = cp.empty((n, n), cp.float32)
    mm_ms = span_ms(lambda: cp.matmul(x, y, out=z))
    return {
        "copy_dram_gbs": 2 * a.nbytes / (copy_ms * 1e-3) / 1e9,
        "copy_dram_set_bytes": float(2 * a.nbytes),
        "sgemm_gflops": 2 * n**3 / (mm_ms * 1e-3) / 1e9,
    }
