#!/usr/bin/env python
"""The Q/K/V horizontal fusion's GEMM on the CPU, default schedules: one ``x @ [Wq; Wk; Wv]^T + b`` GEMM
(M x 3N x K) against the three ``x @ W^T + b`` GEMMs (M x N x K) it replaces.

Contenders (each does the same work: 3 x M x N x K multiply-adds plus the bias):

* ``merged``: the one wide GEMM;
* ``three in sequence``: three GEMMs with three different weights, called one after the other (what the
  unfused model runs: each call finds the previous one's weights in the caches, not its own);
* ``one x3``: one narrow GEMM timed alone, its time tripled (what a per-group timing sees: the same
  weights every call, cache-warm).

Every contender's output is checked against numpy first; rounds are interleaved in rotated order; each
round gives the minimum over ``--repeats`` calls; the table shows the median over rounds, the spread, and
the ratio to ``merged`` per round (median and range). The load average is printed before and after.

    python scripts/bench_wide_gemm.py
    KILN_HOST_ISA=avx2 python scripts/bench_wide_gemm.py --rounds 21
    python scripts/bench_wide_gemm.py --m 128 --n 768 --k 768 --threads 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numpy as np


def gemm_graph(m: int, n: int, k: int, seed: int):
    from compiler.builder import GraphBuilder

    b = GraphBuilder(f"gemm_{n}_{seed}")
    rng = np.random.default_rng(seed)
    x = b.input("x", (1, m, k))
    w = b.param("w", (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32))
    bias = b.param("b", rng.standard_normal(n).astype(np.float32))
    return b.build([b.add(b.matmul(x, w, transpose_b=True), bias)])


def bound(graph, x: np.ndarray, target, threads: int, call: str) -> Callable[[], list[np.ndarray]]:
    """The graph compiled with default schedules, called through ``bind()`` (inputs and outputs bound once)
    or ``run()`` (fresh output arrays every call); its output checked against numpy."""
    from tuner.api import compile as kiln_compile

    model = kiln_compile(graph, target)
    model.num_threads = threads
    fn = model.bind({"x": x}) if call == "bind" else lambda: model.run({"x": x})
    w, b = (p.data for p in graph.params)
    np.testing.assert_allclose(fn()[0], x @ w.T + b, rtol=1e-3, atol=1e-3)
    return fn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, default=128)
    ap.add_argument("--n", type=int, default=768, help="one projection's width (the merged GEMM has 3N)")
    ap.add_argument("--k", type=int, default=768)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=31)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--call", choices=("bind", "run"), default="bind", help="how each GEMM is called")
    args = ap.parse_args()

    from compiler.target import Target

    target = Target.host()
    print(f"load before: {os.getloadavg()}  target: {target.key}")
    x = np.random.default_rng(0).standard_normal((1, args.m, args.k)).astype(np.float32)
    merged = bound(gemm_graph(args.m, 3 * args.n, args.k, 0), x, target, args.threads, args.call)
    narrow = [
        bound(gemm_graph(args.m, args.n, args.k, s), x, target, args.threads, args.call) for s in (1, 2, 3)
    ]

    def in_sequence() -> None:
        for fn in narrow:
            fn()

    contenders: dict[str, tuple[Callable[[], object], int]] = {
        "merged": (merged, 1),
        "three in sequence": (in_sequence, 1),
        "one x3": (narrow[0], 3),
    }
    names = list(contenders)
    per: dict[str, list[float]] = {k: [] for k in names}
    for r in range(args.rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            fn, times = contenders[name]
            samples = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                fn()
                samples.append(time.perf_counter() - t0)
            per[name].append(min(samples) * 1e6 * times)
    print(f"load after: {os.getloadavg()}")
    print(f"M={args.m} N=3x{args.n} K={args.k}, {args.threads} threads, {args.rounds} rounds, {args.call}()")
    print("| contender | median us [min, max] | ratio to merged, median [range] |")
    print("|---|---|---|")
    for name in names:
        t = per[name]
        ratios = [a / b for a, b in zip(t, per["merged"])]
        print(
            f"| {name} | {statistics.median(t):.1f} [{min(t):.1f}, {max(t):.1f}] | "
            f"{statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}] |"
        )


if __name__ == "__main__":
    main()
