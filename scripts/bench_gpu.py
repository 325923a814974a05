#!/usr/bin/env python
"""GPU benchmark: Kiln's CUDA schedules (default, and tuned with --db) vs torch eager, torch.compile
(default) and torch.compile max-autotune, with the device's ceilings measured in the same run: copy
bandwidth (bytes read + written), cuBLAS SGEMM (TF32 off), TF32 and FP16 GEMM 4096^3 through torch.

Workloads: memory-bound groups at shapes far larger than the L2 (softmax 8192x8192 and 1024x65536,
layernorm / rmsnorm / bias+GELU 16384x4096: 256 MiB per operand against the H100's 50 MB L2), SGEMM 4096^3,
the tensor-core GEMMs 4096^3 (``hgemm_4096``: float16 in and out, Kiln's tensor-core sketch vs cuBLAS FP16;
``tf32_gemm_4096``: float32 compiled for ``cuda+tf32`` vs cuBLAS TF32, torch with TF32 allowed for that
workload only), and the built-in models named by --models.

The GEMMs' reference is float32 ``a @ b`` of the same inputs (numpy has no fast float16 matmul), checked
with the tuner's tolerance for the output type (float16 1e-2, TF32 5e-3; others ``CHECK_TOL``).

Every contender's outputs are checked against the numpy reference before it is timed. Two times per
contender, both medians over ``--rounds`` rounds run in rotated order (A B C, B C A, ...):

* kernel: CUDA events around each single call with the L2 written over (a 2x L2 memset) before it, so
  memory-bound kernels read from DRAM; the spread is the interquartile range of all calls;
* wall: host time of ``--iters`` back-to-back calls over the synchronised total (launch overhead included,
  L2 warm).

Kiln runs plain (one launch per kernel from Python) and as a CUDA Graph replayed over its own input buffers
(no staging copies, no host synchronisation); torch.compile max-autotune uses CUDA graphs (inductor's
default for that mode). A contender that fails to build, computes a wrong result or fails while timed is
shown as failed with its reason, never dropped. The report (markdown --out, JSON --json) is rewritten after
every workload, so a run cut short keeps what it measured.

    python scripts/bench_gpu.py --out benchmarks/gpu.md --json $OUT/bench_gpu.json
    python scripts/bench_gpu.py --dry-run      # no GPU: build everything, time nothing
    python scripts/bench_gpu.py --models encoder_layer --db sqlite:///tune.db   # also Kiln with tuned records
    python scripts/bench_gpu.py --render bench.json --rounds 3 --out benchmarks/gpu.md   # the table of a
        # JSON a GPU run wrote (anywhere; --iters/--rounds/--ran say how that run measured)
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import shlex
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.bench_common import markdown_table

ZOO = ["softmax_large", "layernorm", "matmul", "attention", "encoder_layer"]
MEMORY_BOUND = {  # name -> (builder kind, shape): each operand is 256 MiB, far beyond any L2
    "softmax_8192x8192": ("softmax", (8192, 8192)),
    "softmax_1024x65536": ("softmax", (1024, 65536)),
    "layernorm_16384x4096": ("layernorm", (16384, 4096)),
    "rmsnorm_16384x4096": ("rmsnorm", (16384, 4096)),
    "bias_gelu_16384x4096": ("bias_gelu", (16384, 4096)),
}
GEMM = 4096
TARGETS = {  # the targets
    "memory": ("copy_gbs", 0.90),
    "matmul_4096": ("sgemm_tflops", 0.90),
    "hgemm_4096": ("fp16_tflops", 0.80),
    "tf32_gemm_4096": ("tf32_tflops", 0.80),
}
TF32_WORKLOADS = {"tf32_gemm_4096"}  # compiled for cuda+tf32; torch runs them with TF32 allowed
GEMM_DTYPES = {f"matmul_{GEMM}": "float32", "hgemm_4096": "float16", "tf32_gemm_4096": "float32"}
CHECK_TOL = 2e-3  # max |err| / max(1, max |ref|) for a contender to be timed
L2_FLUSH_FACTOR = 2


# ------------------------------------------------------------------ workloads
def memory_bound_graph(name: str, kind: str, shape: tuple[int, int]):
    from compiler.builder import GraphBuilder

    b = GraphBuilder(name)
    x = b.input("x", shape)
    n = shape[-1]
    if kind == "softmax":
        y = b.softmax(x, axis=-1)
    elif kind == "layernorm":
        g = b.param("gamma", np.linspace(0.5, 1.5, n, dtype=np.float32))
        y = b.layer_norm(x, g, b.param("beta", np.linspace(-0.5, 0.5, n, dtype=np.float32)), eps=1e-5)
    elif kind == "rmsnorm":
        y = b.rms_norm(x, b.param("w", np.linspace(0.5, 1.5, n, dtype=np.float32)), eps=1e-6)
    elif kind == "bias_gelu":
        y = b.gelu(b.add(x, b.param("bias", np.linspace(-0.1, 0.1, n, dtype=np.float32))))
    else:
        raise ValueError(f"unknown memory-bound workload kind {kind!r}")
    return b.build([y])


def workloads(models: list[str]) -> dict[str, Any]:
    """name -> Kiln graph: the large memory-bound shapes, SGEMM 4096^3, then the built-in ``models``."""
    from compiler.builder import GraphBuilder
    from compiler.frontend.models import get_model

    out = {name: memory_bound_graph(name, kind, shape) for name, (kind, shape) in MEMORY_BOUND.items()}
    for name, dtype in GEMM_DTYPES.items():
        b = GraphBuilder(name)
        out[name] = b.build([b.matmul(b.input("a", (GEMM, GEMM), dtype), b.input("b", (GEMM, GEMM), dtype))])
    for n in models:
        out[n] = get_model(n)
    return out


def target_spec(name: str) -> str:
    """The Kiln target a workload is compiled for: ``cuda+tf32`` for the TF32 GEMM, else ``cuda``."""
    return "cuda+tf32" if name in TF32_WORKLOADS else "cuda"


def check_tol(name: str, graph) -> float:
    """The relative tolerance a contender's outputs must meet: the tuner's for float16 and TF32 outputs."""
    from tuner.measure.check import rtol_for

    dtype = graph.outputs[0].dtype
    if name in TF32_WORKLOADS or dtype != "float32":
        return max(CHECK_TOL, rtol_for(dtype, name in TF32_WORKLOADS))
    return CHECK_TOL


def reference(name: str, graph, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The outputs to check against: float32 ``a @ b`` for the GEMMs, else the numpy reference."""
    if name in GEMM_DTYPES:
        a, b = (np.asarray(inputs[v.name], np.float32) for v in graph.inputs)
        return [(a @ b).astype(graph.outputs[0].dtype)]
    from compiler.reference import run_reference

    return [np.asarray(r) for r in run_reference(graph, list(inputs.values()))]


def traffic_bytes(graph) -> int:
    """Bytes a perfect kernel moves: every input and param read once, every output written once."""
    vals = [*graph.inputs, *graph.params, *graph.outputs]
    return sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in vals)


def flops(graph) -> float:
    from compiler.fusion import node_flops
    from compiler.passes import optimize

    g = optimize(graph)
    return float(sum(node_flops(n) for n in g.nodes if n.op in ("matmul", "batch_matmul", "conv2d")))


def is_compute_bound(graph) -> bool:
    fl = flops(graph)
    return bool(fl) and fl / traffic_bytes(graph) > 50


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


# --------------------------------------------------------------- outcomes
@dataclass
class Failed:
    """A contender (or ceiling) that could not be measured: the stage and a one-line reason."""

    stage: str
    error: str

    def cell(self) -> str:
        return f"failed ({self.stage}: {self.error[:60]})"


def attempt(stage: str, fn: Callable[[], Any]) -> Any:
    """``fn()``, or a Failed naming ``stage`` and the exception (never raised)."""
    try:
        return fn()
    except Exception as exc:  # every failure becomes data in the table
        last = traceback.format_exception_only(type(exc), exc)[-1].strip().splitlines()[0]
        return Failed(stage, last)


def max_rel_err(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    errs = [0.0]
    for g, w in zip(got, want):
        g64, w64 = np.asarray(g, np.float64).reshape(w.shape), np.asarray(w, np.float64)
        errs.append(float(np.abs(g64 - w64).max() / max(1.0, float(np.abs(w64).max()))))
    return max(errs)


def rotated(names: list[str], k: int) -> list[str]:
    """Round ``k``'s order: the list rotated by k (every contender goes first once every len(names))."""
    if not names:
        return []
    k %= len(names)
    return names[k:] + names[:k]


@dataclass
class Timing:
    kernel_us: list[float] = field(default_factory=list)  # one per call (L2 flushed before each)
    wall_us: list[float] = field(default_factory=list)  # one per round (per call, L2 warm)

    def summary(self) -> dict[str, Any]:
        q = np.percentile(self.kernel_us, [25, 75]) if self.kernel_us else [float("nan")] * 2
        return {
            "status": "ok",
            "kernel_us": statistics.median(self.kernel_us) if self.kernel_us else None,
            "kernel_iqr_us": [float(q[0]), float(q[1])],
            "wall_us": statistics.median(self.wall_us) if self.wall_us else None,
            "calls": len(self.kernel_us),
        }


# -------------------------------------------------------------------- timing (GPU)
class Clock:
    """CUDA-event and host timers on the current stream, with an L2 flush buffer of 2x the L2."""

    def __init__(self, l2_bytes: int) -> None:
        import cupy as cp

        self.cp = cp
        self.scratch = cp.empty(max(L2_FLUSH_FACTOR * l2_bytes, 1 << 20), dtype=cp.uint8)

    def kernel_us(self, fn: Callable[[], object], calls: int) -> list[float]:
        """Per-call device time of ``calls`` calls, the L2 written over before each (events recorded
        around the call only; one host synchronisation at the end)."""
        cp = self.cp
        pairs = []
        for _ in range(calls):
            self.scratch.fill(0)
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            fn()
            end.record()
            pairs.append((start, end))
        pairs[-1][1].synchronize()
        return [cp.cuda.get_elapsed_time(s, e) * 1e3 for s, e in pairs]

    def wall_us(self, fn: Callable[[], object], iters: int) -> float:
        """Host time per call of ``iters`` back-to-back calls (synchronised before and after)."""
        dev = self.cp.cuda.Device()
        dev.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        dev.synchronize()
        return (time.perf_counter() - t0) * 1e6 / iters


def time_contenders(clock: Clock, contenders: dict[str, Callable], iters: int, rounds: int) -> dict:
    """Rotated rounds; a contender failing while timed becomes Failed("time", ...)."""
    timings: dict[str, Timing] = {k: Timing() for k in contenders}
    failed: dict[str, Failed] = {}
    for r in range(rounds):
        for name in rotated(list(contenders), r):
            if name in failed:
                continue
            fn, t = contenders[name], timings[name]

            def one(fn=fn, t=t) -> None:
                t.kernel_us += clock.kernel_us(fn, iters)
                t.wall_us.append(clock.wall_us(fn, iters))

            res = attempt("time", one)
            if isinstance(res, Failed):
                failed[name] = res
    return {k: (failed[k] if k in failed else timings[k].summary()) for k in contenders}


# ------------------------------------------------------------------ ceilings (GPU)
def copy_bandwidth_gbs(clock: Clock, mib: int = 1024) -> float:
    cp = clock.cp
    n = mib * (1 << 20) // 4
    a, b = cp.ones(n, cp.float32), cp.empty(n, cp.float32)
    t = statistics.median(clock.kernel_us(lambda: b.__setitem__(Ellipsis, a), 10))
    return 2 * a.nbytes / (t * 1e-6) / 1e9


def gemm_tflops(clock: Clock, dtype: str, tf32: bool, n: int = GEMM) -> float:
    """cuBLAS through torch.matmul at n^3: float32 with TF32 off/on, or float16."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        dt = {"float32": torch.float32, "float16": torch.float16}[dtype]
        a, b = torch.randn(n, n, device="cuda", dtype=dt), torch.randn(n, n, device="cuda", dtype=dt)
        c = torch.empty(n, n, device="cuda", dtype=dt)
        t = statistics.median(clock.kernel_us(lambda: torch.matmul(a, b, out=c), 10))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False
    return 2 * n**3 / (t * 1e-6) / 1e12


def ceilings(clock: Clock) -> dict[str, Any]:
    out: dict[str, Any] = {"copy_gbs": attempt("copy", lambda: copy_bandwidth_gbs(clock))}
    for key, dtype, tf32 in (
        ("sgemm_tflops", "float32", False),
        ("tf32_tflops", "float32", True),
        ("fp16_tflops", "float16", False),
    ):
        out[key] = attempt(key, lambda d=dtype, t=tf32: gemm_tflops(clock, d, t))
    return out


# -------------------------------------------------------------------- contenders (GPU)
def kiln_contenders(graph, inputs: dict[str, np.ndarray], db, target: str = "cuda") -> dict[str, Any]:
    """name -> callable (or Failed): Kiln default and tuned, plain and as a CUDA Graph over its own input
    buffers (filled once), compiled for ``target`` (``cuda`` or ``cuda+tf32``)."""
    import cupy as cp

    from compiler.build import compile as kiln_compile
    from tuner.api import compile as tuned_compile

    dev = {k: cp.asarray(v) for k, v in inputs.items()}
    builds = {"kiln": lambda: kiln_compile(graph, target)}
    if db is not None:
        builds["kiln tuned"] = lambda: tuned_compile(graph, target, db=db)
    out: dict[str, Any] = {}
    for label, build in builds.items():
        model = attempt("build", build)
        if isinstance(model, Failed):
            out[label] = out[f"{label} graph"] = model
            continue
        out[label] = lambda m=model: m.run_device(dev)
        staged = attempt("build", model.graph_inputs)
        if isinstance(staged, Failed):
            out[f"{label} graph"] = staged
            continue
        for k, buf in staged.items():
            buf[...] = dev[k]
        out[f"{label} graph"] = lambda m=model, s=staged: m.run_device(s, cuda_graph=True)
    return out


def torch_contenders(
    graph, inputs: dict[str, np.ndarray], modes: list[str], tf32: bool = False
) -> dict[str, Any]:
    """torch eager and torch.compile in each mode (TF32 as ``tf32`` says: off but for the TF32 GEMM), or
    Failed for what cannot be built."""
    import torch

    from tuner.bench.torch_peer import graph_to_torch

    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    fn = graph_to_torch(params_as_inputs(graph))
    args = [torch.from_numpy(np.ascontiguousarray(inputs[v.name])).cuda() for v in graph.inputs]
    args += [torch.from_numpy(np.ascontiguousarray(p.data)).cuda() for p in graph.params]

    def runner(f):
        def run():
            with torch.no_grad():
                return f(*args)

        return run

    out: dict[str, Any] = {"torch eager": runner(fn)}
    for mode in modes:
        label = "torch.compile" if mode == "default" else f"torch.compile {mode}"

        def build(mode=mode):
            compiled = torch.compile(fn, mode=None if mode == "default" else mode)
            run = runner(compiled)
            run()  # compile (and autotune) now, not while timed
            return run

        out[label] = attempt("build", build)
    return out


def host_outputs(result) -> list[np.ndarray]:
    xs = result if isinstance(result, (list, tuple)) else [result]
    out = []
    for v in xs:
        if hasattr(v, "detach"):
            out.append(v.detach().float().cpu().numpy())
        elif hasattr(v, "get"):
            out.append(v.get())
        else:
            out.append(np.asarray(v))
    return out


def checked(
    contenders: dict[str, Any], want: list[np.ndarray], tol: float = CHECK_TOL
) -> tuple[dict[str, Callable], dict]:
    """(contenders that compute ``want`` within ``tol``, name -> Failed or max relative error for every
    contender)."""
    ok, notes = {}, {}
    for name, fn in contenders.items():
        if isinstance(fn, Failed):
            notes[name] = fn
            continue
        got = attempt("run", lambda fn=fn: host_outputs(fn()))
        if isinstance(got, Failed):
            notes[name] = got
            continue
        err = max_rel_err(got, want)
        if not err <= tol:
            notes[name] = Failed("check", f"max rel err {err:.2e} > {tol:g}")
            continue
        ok[name], notes[name] = fn, err
    return ok, notes


# ------------------------------------------------------------------------ report
def rate(result: dict, kind: str, fl: float, by: int) -> float | None:
    """TFLOP/s (compute) or GB/s (memory) of a timed result's kernel time."""
    us = result.get("kernel_us") if isinstance(result, dict) else None
    if not us:
        return None
    return fl / (us * 1e-6) / 1e12 if kind == "compute" else by / (us * 1e-6) / 1e9


def ceiling_for(name: str, kind: str) -> tuple[str, float] | None:
    if name in TARGETS:
        return TARGETS[name]
    return TARGETS["memory"] if kind == "memory" and name in MEMORY_BOUND else None


def workload_row(name: str, entry: dict, ceil: dict) -> dict[str, str]:
    """One markdown row: each contender's kernel/wall time (or its failure), Kiln's best rate and its
    fraction of the ceiling, Kiln vs torch.compile max-autotune, the issue's target."""
    row = {"workload": name}
    res = entry["contenders"]
    for who, r in res.items():
        if isinstance(r, Failed):
            row[who] = r.cell()
        elif isinstance(r, dict) and r.get("status") == "failed":
            row[who] = Failed(r["stage"], r["error"]).cell()
        else:
            row[who] = f"{r['kernel_us']:,.1f} / {r['wall_us']:,.1f}"
    timed = {k: v for k, v in res.items() if isinstance(v, dict) and v.get("status") == "ok"}
    kiln = {k: v for k, v in timed.items() if k.startswith("kiln")}
    if not kiln:
        row["kiln rate"] = "no Kiln result"
        return row
    best_name = min(kiln, key=lambda k: kiln[k]["kernel_us"])
    best = kiln[best_name]
    r = rate(best, entry["kind"], entry["flops"], entry["bytes"])
    unit = "TFLOP/s" if entry["kind"] == "compute" else "GB/s"
    row["kiln rate"] = f"{r:,.1f} {unit} ({best_name})"
    target = ceiling_for(name, entry["kind"])
    key = target[0] if target else ("sgemm_tflops" if entry["kind"] == "compute" else "copy_gbs")
    c = ceil.get(key)
    if isinstance(c, (int, float)) and c > 0:
        row["of ceiling"] = f"{r / c:.0%} of {key.split('_')[0]}"
        if target:
            row["target"] = f">= {target[1]:.0%}: {'met' if r / c >= target[1] else 'NOT met'}"
    else:
        row["of ceiling"] = f"n/a ({key} not measured)"
    peer = timed.get("torch.compile max-autotune")
    if peer:
        row["vs max-autotune"] = f"{peer['kernel_us'] / best['kernel_us']:.2f}x"
    return row


def jsonable(x: Any) -> Any:
    if isinstance(x, Failed):
        return {"status": "failed", "stage": x.stage, "error": x.error}
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    return x


class Report:
    """The results so far, rewritten to ``md``/``json`` after every workload."""

    def __init__(self, header: str, ceil: dict, md: str | None, js: str | None, device: str) -> None:
        self.header, self.ceil, self.md, self.js, self.device = header, ceil, md, js, device
        self.entries: dict[str, dict] = {}
        self.rows: list[dict] = []

    def add(self, name: str, entry: dict) -> None:
        self.entries[name] = entry
        self.rows.append(workload_row(name, entry, self.ceil))
        self.write()

    def columns(self) -> list[str]:
        who: list[str] = []
        for e in self.entries.values():
            who += [k for k in e["contenders"] if k not in who]
        return ["workload", *who, "kiln rate", "of ceiling", "vs max-autotune", "target"]

    def table(self) -> str:
        return markdown_table(self.rows, self.columns())

    def write(self) -> None:
        if self.md:
            Path(self.md).write_text(f"# GPU benchmark\n\n{self.header}\n\n{self.table()}\n")
        if self.js:
            data = {"device": self.device, "ceilings": jsonable(self.ceil), "results": jsonable(self.entries)}
            Path(self.js).write_text(json.dumps(data, indent=2))


def header(
    device: str, ceil: dict, args: argparse.Namespace, when: str | None = None, source: str | None = None
) -> str:
    """The report's first paragraph; ``when`` and ``source`` replace today's date and this run's command
    (``--render`` of another run's JSON)."""

    def fig(key: str, unit: str) -> str:
        v = ceil.get(key)
        if isinstance(v, (int, float)):
            return f"{v:,.1f} {unit}"
        return v.cell() if isinstance(v, Failed) else "not measured"

    return (
        f"{device}, {when or datetime.date.today().isoformat()}. Ceilings measured in this run: device copy "
        f"{fig('copy_gbs', 'GB/s')} (read + write), cuBLAS 4096^3 SGEMM (TF32 off) "
        f"{fig('sgemm_tflops', 'TFLOP/s')}, "
        f"TF32 {fig('tf32_tflops', 'TFLOP/s')}, FP16 {fig('fp16_tflops', 'TFLOP/s')}. Cells: kernel / wall "
        f"microseconds per call, medians; kernel = CUDA events around one call after an L2 flush "
        f"({args.iters} calls x {args.rounds} rounds), wall = host time of {args.iters} back-to-back calls "
        "(launch overhead included, L2 warm); rounds in rotated order. Rates use Kiln's best kernel time. "
        + (source or "Command: python scripts/bench_gpu.py " + " ".join(sys.argv[1:]))
    )


# ------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=ZOO, help="built-in models besides the target shapes")
    ap.add_argument("--only", nargs="*", help="only these workloads (names of the table)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--compile-modes",
        nargs="*",
        default=["default", "max-autotune"],
        help="torch.compile modes to compare with (none: no torch.compile)",
    )
    ap.add_argument("--out", help="write the markdown report here (after every workload)")
    ap.add_argument("--json", help="write raw results here (after every workload)")
    ap.add_argument("--dry-run", action="store_true", help="build Kiln models and torch graphs, time nothing")
    ap.add_argument("--render", metavar="JSON", help="the markdown of a GPU run's --json (no GPU needed)")
    ap.add_argument("--ran", default="", help="with --render: the run's command and date, for the header")
    ap.add_argument(
        "--db", help="tuning database URL: also time Kiln compiled with its records ('kiln tuned'), read only"
    )
    args = ap.parse_args()
    if args.render:
        return render(args)
    with contextlib.ExitStack() as stack:
        db = None
        if args.db:
            from db.database import TuningDatabase

            db = stack.enter_context(TuningDatabase.open(args.db, create=False))
        return run(args, db)


def render(args: argparse.Namespace) -> int:
    """The report of a JSON written by ``--json`` (a GPU run), rendered where no GPU is needed."""
    try:
        data = json.loads(Path(args.render).read_text())
        device, ceil, entries = data["device"], data["ceilings"], data["results"]
    except (OSError, ValueError, KeyError) as exc:
        raise SystemExit(f"bench_gpu --render {args.render}: not a bench_gpu --json file ({exc})") from exc
    source = f"Rendered from that run's JSON by `python scripts/bench_gpu.py {shlex.join(sys.argv[1:])}`."
    text = header(device, ceil, args, when="measured by " + (args.ran or "a GPU run"), source=source)
    report = Report(text, ceil, args.out, None, device)
    for name, entry in entries.items():
        report.add(name, entry)
    print(f"# GPU benchmark\n\n{report.header}\n\n{report.table()}")
    return 0


def selected(args: argparse.Namespace) -> dict[str, Any]:
    graphs = workloads(args.models)
    if args.only:
        unknown = sorted(set(args.only) - set(graphs))
        if unknown:
            raise SystemExit(f"bench_gpu: unknown workload(s) {unknown}; known: {sorted(graphs)}")
        graphs = {k: v for k, v in graphs.items() if k in args.only}
    return graphs


def dry_run(graphs: dict[str, Any], db) -> None:
    from compiler.build import compile as kiln_compile
    from tuner.api import compile as tuned_compile

    for name, graph in graphs.items():
        t0 = time.perf_counter()
        model = kiln_compile(graph, target_spec(name))
        kernels = sum(len(v) for v in model.kernel_launches.values())
        sketches = sorted({k.sketch for k in model.kernels if getattr(k, "sketch", None)})
        note = f", sketches {', '.join(sketches)}" if sketches else ""
        if db is not None:
            tuned = tuned_compile(graph, target_spec(name), db=db)
            note += (
                f", {sum(1 for k in tuned.kernels if k.extra.get('origin') == 'record')} kernels from records"
            )
        took = time.perf_counter() - t0
        print(f"  {name}: {kernels} kernels, {len(model.source) // 1024} KiB of CUDA, {took:.1f} s{note}")


def run(args: argparse.Namespace, db) -> int:
    from compiler.backends.cuda.device import current_cuda_target, why_unavailable
    from compiler.reference import random_inputs

    graphs = selected(args)
    reason = why_unavailable()
    if args.dry_run or reason is not None:
        if not args.dry_run:
            print(f"bench_gpu: no GPU here ({reason}); building only", file=sys.stderr)
        dry_run(graphs, db)
        return 0 if args.dry_run else 2

    target = current_cuda_target()
    clock = Clock(target.l2_bytes)
    ceil = ceilings(clock)
    device = f"{target.device} ({target.arch})"
    report = Report(header(device, ceil, args), ceil, args.out, args.json, device)
    print(report.header)
    modes = [m for m in args.compile_modes if m != "none"]
    for name, graph in graphs.items():
        inputs = dict(zip((v.name for v in graph.inputs), random_inputs(graph, seed=0)))
        want = reference(name, graph, inputs)
        tf32 = name in TF32_WORKLOADS
        contenders = {
            **kiln_contenders(graph, inputs, db, target_spec(name)),
            **attempt_torch(graph, inputs, modes, tf32),
        }
        ok, notes = checked(contenders, want, check_tol(name, graph))
        timed = time_contenders(clock, ok, args.iters, args.rounds)
        results = {k: timed.get(k, notes[k]) for k in contenders}
        for k, v in results.items():
            if isinstance(v, dict):
                v["max_rel_err"] = notes[k]
        entry = {
            "kind": "compute" if is_compute_bound(graph) else "memory",
            "flops": flops(graph),
            "bytes": traffic_bytes(graph),
            "contenders": results,
        }
        report.add(name, entry)
        print("  " + " | ".join(f"{k}: {v}" for k, v in report.rows[-1].items()), flush=True)
    print("\n" + report.table())
    return 0


def attempt_torch(
    graph, inputs: dict[str, np.ndarray], modes: list[str], tf32: bool = False
) -> dict[str, Any]:
    res = attempt("build", lambda: torch_contenders(graph, inputs, modes, tf32))
    return {"torch eager": res} if isinstance(res, Failed) else res


if __name__ == "__main__":
    raise SystemExit(main())
