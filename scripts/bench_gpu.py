#!/usr/bin/env python
"""GPU benchmark: Kiln's default CUDA schedules vs torch eager and torch.compile, with the device's
ceilings measured in the same run: device-to-device copy bandwidth (bytes read + written) and cuBLAS
SGEMM through torch.matmul with TF32 off.

Every contender's output is checked against torch's before it is timed. Timing: CUDA events around
``--iters`` back-to-back calls (inputs already on the device, outputs reused), ``--rounds`` interleaved
rounds, median of the rounds. Kiln is timed plain (one Python launch per kernel) and replaying a CUDA
Graph of the whole model. Memory-bound workloads are quoted as GB/s and as a fraction of the copy
bandwidth, matmuls as TFLOP/s and as a fraction of cuBLAS.

    python scripts/bench_gpu.py --out benchmarks/gpu.md --json $OUT/bench_gpu.json
    python scripts/bench_gpu.py --dry-run      # no GPU: build everything, time nothing
    python scripts/bench_gpu.py --models matmul --db sqlite:///tune.db   # also Kiln with tuned records
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.bench_common import markdown_table

ZOO = [
    "softmax_large",
    "rmsnorm",
    "layernorm",
    "bias_gelu",
    "matmul",
    "mlp",
    "attention",
    "encoder_layer",
    "resblock",
]
TARGETS = {  # the targets: workload -> (ceiling, fraction)
    "rmsnorm_8192x4096": ("copy", 0.70),
    "softmax_8192x4096": ("copy", 0.70),
    "matmul_4096": ("cublas", 0.40),
}


# ------------------------------------------------------------------ workloads
def workloads(names: list[str]) -> dict[str, object]:
    """name -> Kiln graph: the issue's target shapes plus built-in models."""
    from compiler.builder import GraphBuilder
    from compiler.frontend.models import get_model

    out = {}
    b = GraphBuilder("rmsnorm_8192x4096")
    x = b.input("x", (8192, 4096))
    w = b.param("w", np.linspace(0.5, 1.5, 4096, dtype=np.float32))
    out[b.name] = b.build([b.rms_norm(x, w, eps=1e-6)])
    b = GraphBuilder("softmax_8192x4096")
    out[b.name] = b.build([b.softmax(b.input("x", (8192, 4096)), axis=-1)])
    b = GraphBuilder("matmul_4096")
    out[b.name] = b.build([b.matmul(b.input("a", (4096, 4096)), b.input("b", (4096, 4096)))])
    for n in names:
        out[n] = get_model(n)
    return out


def traffic_bytes(graph) -> int:
    """Bytes a perfect kernel moves: every input and param read once, every output written once."""
    vals = [*graph.inputs, *graph.params, *graph.outputs]
    return sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in vals)


def flops(graph) -> float:
    from compiler.fusion import node_flops
    from compiler.passes import optimize

    g = optimize(graph)
    return float(sum(node_flops(n) for n in g.nodes if n.op in ("matmul", "batch_matmul", "conv2d")))


def params_as_inputs(graph):
    """The same graph with params turned into inputs (so torch gets them as device tensors)."""
    from compiler.builder import GraphBuilder

    b = GraphBuilder(graph.name)
    env = {}
    for v in [*graph.inputs, *graph.params]:
        env[v] = b.input(v.name or f"v{len(env)}", v.shape, v.dtype)
    for n in graph.nodes:
        env[n.output] = b.add_node(n.op, [env[v] for v in n.inputs], n.attrs, n.name)
    return b.build([env[v] for v in graph.outputs])


# -------------------------------------------------------------------- timing
def cuda_time_us(fn: Callable[[], object], iters: int, rounds: int) -> list[float]:
    """Per-call microseconds of ``fn`` for each round (CUDA events around ``iters`` calls)."""
    import cupy as cp

    out = []
    for _ in range(rounds):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        out.append(cp.cuda.get_elapsed_time(start, end) * 1e3 / iters)
    return out


def interleaved(contenders: dict[str, Callable[[], object]], iters: int, rounds: int) -> dict[str, float]:
    import cupy as cp

    for fn in contenders.values():  # warm-up (and compile)
        for _ in range(3):
            fn()
    cp.cuda.Device().synchronize()
    per: dict[str, list[float]] = {k: [] for k in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            per[name] += cuda_time_us(fn, iters, 1)
    return {k: statistics.median(v) for k, v in per.items()}


def copy_bandwidth_gbs(mib: int = 1024, iters: int = 20) -> float:
    import cupy as cp

    n = mib * (1 << 20) // 4
    a, b = cp.ones(n, cp.float32), cp.empty(n, cp.float32)
    t = statistics.median(cuda_time_us(lambda: b.__setitem__(Ellipsis, a), iters, 5))
    return 2 * a.nbytes / (t * 1e-6) / 1e9


def cublas_tflops(n: int = 4096, iters: int = 20) -> float:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    a = torch.randn(n, n, device="cuda")
    b = torch.randn(n, n, device="cuda")
    c = torch.empty(n, n, device="cuda")
    t = statistics.median(cuda_time_us(lambda: torch.matmul(a, b, out=c), iters, 5))
    return 2 * n**3 / (t * 1e-6) / 1e12


# -------------------------------------------------------------------- contenders
def torch_contenders(graph, inputs: dict[str, np.ndarray], compile_mode: str | None) -> dict[str, Callable]:
    import torch

    from scripts.torch_peer import eager_and_compiled, graph_to_torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    flat = params_as_inputs(graph)
    args = [torch.from_numpy(np.ascontiguousarray(inputs[v.name])).cuda() for v in graph.inputs]
    args += [torch.from_numpy(np.ascontiguousarray(p.data)).cuda() for p in graph.params]
    return eager_and_compiled(graph_to_torch(flat), args, graph.name, compile_mode)


def as_numpy(x) -> list[np.ndarray]:
    xs = x if isinstance(x, (list, tuple)) else [x]
    out = []
    for v in xs:
        if hasattr(v, "detach"):
            out.append(v.detach().float().cpu().numpy())
        elif hasattr(v, "get"):
            out.append(v.get())
        else:
            out.append(np.asarray(v))
    return out


def check(name: str, who: str, got, want) -> float:
    errs = []
    for g, w in zip(as_numpy(got), as_numpy(want)):
        errs.append(float(np.abs(g.reshape(w.shape) - w).max() / max(1.0, np.abs(w).max())))
    err = max(errs)
    if err > 2e-3:
        raise SystemExit(f"{who} computes {name} wrong: max rel err {err:.2e}")
    return err


def _torch_on_cpu(graph) -> str:
    """Dry run: the torch peer (params as inputs) on the CPU agrees with the numpy reference."""
    try:
        import torch

        from scripts.torch_peer import graph_to_torch
    except ImportError:
        return ""
    if sum(int(np.prod(v.shape)) for v in graph.inputs) > 1 << 22:
        return ""
    from compiler.reference import random_inputs, run_reference

    inputs = dict(zip((v.name for v in graph.inputs), random_inputs(graph, seed=0)))
    args = [torch.from_numpy(inputs[v.name]) for v in graph.inputs]
    args += [torch.from_numpy(np.ascontiguousarray(p.data)) for p in graph.params]
    with torch.no_grad():
        got = graph_to_torch(params_as_inputs(graph))(*args)
    err = check(graph.name, "torch (cpu)", got, run_reference(graph, list(inputs.values())))
    return f", torch peer ok (err {err:.1e})"


# ------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=ZOO, help="built-in models besides the target shapes")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--compile-mode", default="default", help="torch.compile mode (max-autotune, none to skip)"
    )
    ap.add_argument("--out", help="write the markdown report here")
    ap.add_argument("--json", help="write raw results here")
    ap.add_argument("--dry-run", action="store_true", help="build Kiln models and torch graphs, time nothing")
    ap.add_argument(
        "--db", help="tuning database URL: also time Kiln compiled with its records ('kiln tuned'), read only"
    )
    args = ap.parse_args()
    with contextlib.ExitStack() as stack:
        db = None
        if args.db:
            from db.database import TuningDatabase

            db = stack.enter_context(TuningDatabase.open(args.db, create=False))
        return run(args, db)


def _tuned_kernels(model) -> str:
    return f"{sum(1 for k in model.kernels if k.extra.get('origin') == 'record')}/{len(model.kernels)}"


def run(args: argparse.Namespace, db) -> int:

    from compiler.backends.cuda.device import current_cuda_target, why_unavailable
    from compiler.build import compile as kiln_compile
    from compiler.reference import random_inputs
    from tuner.api import compile as tuned_compile

    graphs = workloads(args.models)
    reason = why_unavailable()
    if args.dry_run or reason is not None:
        if not args.dry_run:
            print(f"bench_gpu: no GPU here ({reason}); building only", file=sys.stderr)
        for name, graph in graphs.items():
            t0 = time.perf_counter()
            model = kiln_compile(graph, "cuda")
            kernels = sum(len(v) for v in model.kernel_launches.values())
            note = _torch_on_cpu(graph)
            if db is not None:
                note += f", {_tuned_kernels(tuned_compile(graph, 'cuda', db=db))} kernels from records"
            took = time.perf_counter() - t0
            print(f"  {name}: {kernels} kernels, {len(model.source) // 1024} KiB of CUDA, {took:.1f} s{note}")
        return 0 if args.dry_run else 2

    import cupy as cp

    target = current_cuda_target()
    copy_gbs = copy_bandwidth_gbs()
    sgemm = cublas_tflops()
    print(
        f"{target.device} ({target.arch}): copy {copy_gbs:.0f} GB/s, "
        f"cuBLAS SGEMM (TF32 off) {sgemm:.1f} TFLOP/s"
    )
    compile_mode = None if args.compile_mode == "none" else args.compile_mode
    rows, raw = [], {}
    for name, graph in graphs.items():
        inputs = dict(zip((v.name for v in graph.inputs), random_inputs(graph, seed=0)))
        model = kiln_compile(graph, "cuda")
        dev_inputs = {k: cp.asarray(v) for k, v in inputs.items()}
        contenders = {
            "kiln": lambda m=model, x=dev_inputs: m.run_device(x),
            "kiln graph": lambda m=model, x=dev_inputs: m.run_device(x, cuda_graph=True),
        }
        tuned = tuned_compile(graph, "cuda", db=db) if db is not None else None
        if tuned is not None:
            contenders["kiln tuned"] = lambda m=tuned, x=dev_inputs: m.run_device(x)
            contenders["kiln tuned graph"] = lambda m=tuned, x=dev_inputs: m.run_device(x, cuda_graph=True)
        contenders.update(torch_contenders(graph, inputs, compile_mode))
        want = contenders["torch eager"]()
        errs = {who: check(name, who, fn(), want) for who, fn in contenders.items()}
        times = interleaved(contenders, args.iters, args.rounds)
        best_default = min(times["kiln"], times["kiln graph"])
        best_kiln = min(v for k, v in times.items() if k.startswith("kiln"))
        row = {"workload": name, **{k: f"{v:,.1f}" for k, v in times.items()}}
        if tuned is not None:
            best_tuned = min(times["kiln tuned"], times["kiln tuned graph"])
            row["tuned kernels"] = _tuned_kernels(tuned)
            row["tuned vs default"] = f"{best_default / best_tuned:.2f}x"
        fl, by = flops(graph), traffic_bytes(graph)
        if fl and fl / by > 50:
            tf = fl / (best_kiln * 1e-6) / 1e12
            row["kiln rate"] = f"{tf:.1f} TFLOP/s"
            row["of ceiling"] = f"{tf / sgemm:.0%} of cuBLAS"
            frac = tf / sgemm
        else:
            gbs = by / (best_kiln * 1e-6) / 1e9
            row["kiln rate"] = f"{gbs:,.0f} GB/s"
            row["of ceiling"] = f"{gbs / copy_gbs:.0%} of copy"
            frac = gbs / copy_gbs
        row["vs eager"] = f"{times['torch eager'] / best_kiln:.2f}x"
        if "torch.compile" in times:
            row["vs compile"] = f"{times['torch.compile'] / best_kiln:.2f}x"
        if name in TARGETS:
            row["target"] = f">= {TARGETS[name][1]:.0%}: {'met' if frac >= TARGETS[name][1] else 'NOT met'}"
        rows.append(row)
        raw[name] = {"us": times, "max_rel_err": errs, "flops": fl, "bytes": by, "fraction_of_ceiling": frac}
        if tuned is not None:
            raw[name]["tuned_kernels"] = row["tuned kernels"]
        print(f"  {name}: " + ", ".join(f"{k} {v:,.1f} us" for k, v in times.items()))
    cols = ["workload", "kiln", "kiln graph"]
    if db is not None:
        cols += ["kiln tuned", "kiln tuned graph", "tuned kernels", "tuned vs default"]
    cols += ["torch eager", "torch.compile", "kiln rate", "of ceiling", "vs eager", "vs compile", "target"]
    table = markdown_table(rows, cols)
    head = (
        f"{target.device} ({target.arch}), {datetime.date.today().isoformat()}: "
        f"device copy {copy_gbs:,.0f} GB/s "
        f"(read + write), cuBLAS SGEMM 4096^3 TF32 off {sgemm:.1f} TFLOP/s. Median microseconds per call "
        f"({args.iters} calls x {args.rounds} interleaved rounds, CUDA events, inputs on the device, outputs "
        "reused, no L2 flush); torch.compile mode: "
        f"{args.compile_mode}. Kiln rates and the vs columns use the fastest Kiln contender"
        + (f"; tuned: records of {args.db}." if db is not None else ".")
    )
    print("\n" + head + "\n\n" + table)
    if args.out:
        Path(args.out).write_text(f"# GPU benchmark\n\n{head}\n\n{table}\n")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"device": target.device, "copy_gbs": copy_gbs, "sgemm_tflops": sgemm, "results": raw},
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
