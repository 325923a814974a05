#!/usr/bin/env python
"""Stride-2 max pools on the CPU: each window tap as two contiguous vector loads deinterleaved (the C
printer's stride-2 load) vs the same kernel with the tap gathered lane by lane (the printer without it).

The pools are conv_net's two (``tests/compiler/frontend/torch_nets.py``: 2x2 stride 2 on [8,32,32,32] and
[8,64,16,16]) plus a 3x3 stride-2 one; each is fused with a ReLU, scheduled with the pointwise sketch's
default for the host target (``KILN_HOST_ISA=avx2`` / ``sse`` emulate narrower ISAs), built twice from
one schedule, outputs checked against the reference, then timed in interleaved rounds in rotated order.

    taskset -c 0 python scripts/bench_pool_stride2.py --rounds 9
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from compiler.backends import get_backend, sketch_for
from compiler.backends.cpu import gcc as cbuild
from compiler.backends.cpu.codegen import CPrinter, generate_c
from compiler.builder import GraphBuilder
from compiler.fusion import fuse
from compiler.layouts import apply_input_layouts
from compiler.passes import optimize
from compiler.reference import run_reference
from compiler.target import Target

POOLS = {
    "conv_net pool1 2x2/2 [8,32,32,32]": ((8, 32, 32, 32), 2, 0),
    "conv_net pool2 2x2/2 [8,64,16,16]": ((8, 64, 16, 16), 2, 0),
    "3x3/2 [8,32,33,33]": ((8, 32, 33, 33), 3, 0),
}


def kernels(shape: tuple[int, ...], k: int, pad: int, target: Target, threads: int):
    b = GraphBuilder("pool")
    x = b.input("x", shape)
    graph = b.build([b.relu(b.max_pool2d(x, (k, k), (2, 2), (pad, pad)))])
    (group,) = [g for g in fuse(optimize(graph)).groups if g.kind == "pointwise" and not g.is_view]
    sketch = sketch_for(group, target)
    config = sketch.default(group, target)
    func = get_backend(target).lower(sketch.build(group, config, target).func)
    rng = np.random.default_rng(0)
    (inp,) = group.subgraph.inputs
    feeds = {inp.name: rng.standard_normal(shape).astype(np.float32)}
    (ref,) = run_reference(group.subgraph, feeds)
    (arg,) = (np.ascontiguousarray(a) for a in apply_input_layouts(func.attrs, list(feeds.values())))
    built = {}
    for name, patch in (("deinterleaved", None), ("lane by lane", lambda self, e, vt: None)):
        if patch is None:
            src = generate_c([func], target)
        else:
            with mock.patch.object(CPrinter, "stride2_load", patch):
                src = generate_c([func], target)
        out = np.full(ref.shape, np.nan, np.float32)
        lib = cbuild.build(src)
        lib.set_num_threads(threads)
        fn = lib.function(func.name, 2)
        fn(arg.ctypes.data, out.ctypes.data)
        np.testing.assert_array_equal(out, ref)  # checked before timing
        built[name] = (fn, ("__builtin_shuffle" in src))
    return config, built, arg, np.empty(ref.shape, np.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--calls", type=int, default=200, help="calls per round (the round's mean is kept)")
    args = ap.parse_args()
    target = Target.host()
    print(f"target: {target.device}, {target.vector_lanes_f32} f32 lanes, {args.threads} thread(s)")
    print("| pool | default config | deinterleaved us | lane by lane us | speedup |")
    print("|---|---|---:|---:|---:|")
    for label, (shape, k, pad) in POOLS.items():
        config, built, arg, out = kernels(shape, k, pad, target, args.threads)
        names = list(built)
        times: dict[str, list[float]] = {n: [] for n in names}
        for r in range(args.rounds):
            for n in names[r % 2 :] + names[: r % 2]:  # rotated order
                fn = built[n][0]
                t0 = time.perf_counter()
                for _ in range(args.calls):
                    fn(arg.ctypes.data, out.ctypes.data)
                times[n].append((time.perf_counter() - t0) / args.calls * 1e6)
        med = {n: statistics.median(v) for n, v in times.items()}
        cells = [f"{med[n]:.1f} ({min(times[n]):.1f}-{max(times[n]):.1f})" for n in names]
        shuffled = "" if built["deinterleaved"][1] else " (no stride-2 load emitted)"
        cfg = f"vector {config['vector']}, parallel {config['parallel']}"
        print(
            f"| {label}{shuffled} | {cfg} | {cells[0]} | {cells[1]} | {med[names[1]] / med[names[0]]:.2f}x |"
        )


if __name__ == "__main__":
    main()
