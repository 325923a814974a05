#!/usr/bin/env python
"""CPU kernel benchmark: Kiln's default schedules vs numpy, onnxruntime and torch eager, on the kernels the
CPU backend has to win (softmax, rmsnorm, layernorm, matmul) and on small whole models where the per-call
overhead decides (the zoo's mlp, and an MNIST-sized MLP with batch 1).

Method (the same for every contender):

* the same number of threads for everyone (``--threads``, default 2): Kiln's threads per parallel loop,
  onnxruntime's intra-op threads, torch's threads, and OpenBLAS's (numpy) through
  ``OPENBLAS_NUM_THREADS``, set before numpy is imported;
* the same vector ISA where a peer can be told: with ``KILN_HOST_ISA=avx2`` (or ``sse``) numpy's OpenBLAS
  runs its Haswell (AVX2; Nehalem for SSE) kernels (``OPENBLAS_CORETYPE``), torch its AVX2 kernels
  (``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA``, ``MKL_ENABLE_INSTRUCTIONS``); on the full host OpenBLAS
  is told the host's best core (SkylakeX on AVX-512: OpenBLAS does not recognise every AVX-512 CPU and
  falls back to Haswell). onnxruntime's MLAS picks its kernels from the CPU's features and cannot be
  narrowed: it always uses the host's full ISA (the table says so). The script sets these variables
  itself, over any value in the environment (a machine may export ``OPENBLAS_CORETYPE=Haswell`` for
  everything), and names them in the command it prints; the OpenBLAS core actually used is read back
  (threadpoolctl) and printed;
* Kiln's and onnxruntime's bound outputs are 64-byte aligned alike (as ``run()``'s own arrays are), so
  streaming stores are not lost to a misaligned caller array;
* the load average of the machine before and after the run is printed with the table;
* every contender's output is checked against the numpy reference before it is timed;
* rounds are interleaved and each round starts at a different contender (round r runs them in the order
  rotated by r), so slow drift of a shared machine hits everyone alike;
* each round gives a median over repeats lasting at least ``--min-time`` seconds; the table shows the
  median over rounds and the spread (lowest and highest round median).

Kiln is timed three ways: ``kiln run()`` (the public call: fresh output arrays every call, nothing copied),
``kiln out=`` (``run(x, out=...)``: outputs written into caller arrays) and ``kiln bind()`` (inputs and
outputs bound once, each call one ctypes call: what onnxruntime's IOBinding does). onnxruntime runs with
IOBinding: inputs and outputs bound once to preallocated numpy arrays. numpy and torch eager allocate their
outputs per call.

    python scripts/bench_cpu_kernels.py                       # the host's ISA (AVX-512 here)
    KILN_HOST_ISA=avx2 python scripts/bench_cpu_kernels.py    # AVX2 code generated on this host
    python scripts/bench_cpu_kernels.py --workloads softmax_large rmsnorm --rounds 7 --out table.md
    python scripts/bench_cpu_kernels.py --threads 1 --clock cpu   # 1 thread, CPU time: for a loaded machine

``--runtimes`` compares instead how Kiln's parallel loops run (``bind()``, default schedules): the thread
pool (``compiler/backends/cpu/pool.py``, the default) against the same kernels built with OpenMP
(``KILN_CPU_PARALLEL=openmp``: ``#pragma omp parallel for schedule(static)``, libgomp), with onnxruntime
(IOBinding) as the reference, each contender in a process of its own, each round once on the machine as it
is ("quiet") and once while ``--load`` busy-loop processes run ("loaded", started before and killed after
that half of the round; the two halves alternate which comes first). It reports per-round medians, the
per-round ratios with their range, and the ratio of mean times per call (a median hides the few very slow
calls of a runtime whose caller waits at a barrier for a descheduled thread):

    python scripts/bench_cpu_kernels.py --runtimes --load 1 --out table.md

``--pools`` shows what a second Kiln model in the process costs the first: each zoo model is built twice
(A, and B: a second library of the same C), and A is timed alone and called in turn with B (A B A B: a
process serving two models, or a default and a tuned model), in rotated rounds, with the code of a git ref
(``--before``, default ``main``; exported with ``git archive`` into a temporary folder) and with this
checkout's, each in a process of its own, the two taking turns
(benchmarks/cpu_pools.md):

    python scripts/bench_cpu_kernels.py --pools --before main --out benchmarks/cpu_pools.md
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _threads_from_argv() -> int:
    for i, a in enumerate(sys.argv):
        if a == "--threads" and i + 1 < len(sys.argv):
            return int(sys.argv[i + 1])
        if a.startswith("--threads="):
            return int(a.split("=", 1)[1])
    return 2


def _host_isa() -> str:
    """The ISA level Kiln generates code for here (``$KILN_HOST_ISA`` or the CPU's best), read without
    importing numpy."""
    if os.environ.get("KILN_HOST_ISA"):
        return os.environ["KILN_HOST_ISA"].strip().lower()
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return ""
    return "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "sse"


# the peers' ISA, narrowed like Kiln's where they can be told (see the module docstring)
PEER_ISA_ENV = {
    "avx512": {"OPENBLAS_CORETYPE": "SkylakeX"},
    "avx2": {
        "OPENBLAS_CORETYPE": "Haswell",
        "ATEN_CPU_CAPABILITY": "avx2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    },
    "sse": {
        "OPENBLAS_CORETYPE": "Nehalem",
        "ATEN_CPU_CAPABILITY": "default",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
        "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
    },
}
for _k, _v in PEER_ISA_ENV.get(_host_isa(), {}).items():
    os.environ[_k] = _v
# OpenBLAS reads its thread count and core type when numpy is first imported
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(_threads_from_argv()))
os.environ.setdefault("OMP_NUM_THREADS", str(_threads_from_argv()))

import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

WORKLOADS = ["softmax_large", "rmsnorm", "layernorm", "bias_gelu", "matmul", "mlp", "mnist_mlp"]
RUNTIME_WORKLOADS = ["rmsnorm", "softmax_large", "layernorm", "matmul", "bias_gelu", "mlp", "mnist_mlp"]


def mnist_mlp():
    """784 -> 128 -> relu -> 64 -> relu -> 10 on one image: a model where dispatch overhead decides."""
    from compiler.builder import GraphBuilder

    b = GraphBuilder("mnist_mlp")
    rng = np.random.default_rng(17)
    h = b.input("x", (1, 784))
    for i, (n_in, n_out) in enumerate(((784, 128), (128, 64), (64, 10))):
        w = b.param(f"fc{i}.weight", (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32))
        bias = b.param(f"fc{i}.bias", (0.1 * rng.standard_normal(n_out)).astype(np.float32))
        h = b.add(b.matmul(h, w), bias)
        if i < 2:
            h = b.relu(h)
    return b.build([h])


def mnist_numpy(graph, inputs):
    p = {v.name: v.data for v in graph.params}

    def run():
        h = inputs[0]
        for i in range(3):
            h = h @ p[f"fc{i}.weight"] + p[f"fc{i}.bias"]
            if i < 2:
                h = np.maximum(h, 0)
        return h

    return run


def graph_for(name: str):
    from compiler.frontend.models import get_model

    return mnist_mlp() if name == "mnist_mlp" else get_model(name)


def command_line() -> str:
    """This run's command, with the environment variables that change what is measured."""
    names = ("KILN_HOST_ISA", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KILN_POOL_SPIN_US")
    env = [f"{k}={os.environ[k]}" for k in names if k in os.environ]
    return " ".join([*env, "python", "scripts/bench_cpu_kernels.py", *sys.argv[1:]])


def check(who: str, name: str, got, refs) -> None:
    got = got if isinstance(got, (list, tuple)) else [got]
    if len(got) != len(refs):
        raise SystemExit(f"{who} returns {len(got)} outputs for {name}, the reference {len(refs)}")
    for g, r in zip(got, refs):
        g = g.detach().numpy() if hasattr(g, "detach") else np.asarray(g)
        err = float(np.abs(g.reshape(r.shape) - r).max() / max(1.0, float(np.abs(r).max())))
        if not np.isfinite(err) or err > 1e-3:
            raise SystemExit(f"{who} computes {name} wrong: max relative error {err:.2e}")


def openblas_core() -> str:
    """The OpenBLAS core numpy's BLAS runs (e.g. ``Haswell``), or what numpy uses when it is not OpenBLAS."""
    from threadpoolctl import threadpool_info

    blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    if not blas:
        return "no BLAS found"
    info = blas[0]
    if info.get("internal_api") == "openblas":
        return f"OpenBLAS {info.get('version')} {info.get('architecture')} kernels"
    return str(info.get("internal_api"))


def ort_iobinding(graph, inputs, threads: int):
    """onnxruntime with inputs and outputs bound once to preallocated arrays; (run, outputs) or None."""
    try:
        from compiler.frontend.onnx_export import ort_session
    except ImportError:
        return None
    from compiler.dtypes import to_numpy
    from compiler.runtime.executor import aligned_empty

    sess = ort_session(graph, threads=threads)
    binding = sess.io_binding()
    for meta, x in zip(sess.get_inputs(), inputs):
        binding.bind_cpu_input(meta.name, x)
    outs = [aligned_empty(v.type.shape, to_numpy(v.type.dtype)) for v in graph.outputs]
    for meta, o in zip(sess.get_outputs(), outs):
        binding.bind_output(meta.name, "cpu", 0, o.dtype, list(o.shape), o.ctypes.data)

    def run():
        sess.run_with_iobinding(binding)
        return outs

    return run


def torch_eager(graph, inputs, threads: int):
    try:
        import torch
    except ImportError:
        return None
    from tuner.bench.torch_peer import graph_to_torch

    torch.set_num_threads(threads)
    fn = graph_to_torch(graph)
    args = [torch.from_numpy(np.ascontiguousarray(x)) for x in inputs]

    def run():
        with torch.no_grad():
            out = fn(*args)
        return list(out) if isinstance(out, tuple) else out

    return run


def numpy_reference(graph, inputs):
    """The 'numpy' peer: the graph's numpy reference op by op (as `kiln bench` times numpy); elementwise
    numpy is single-threaded whatever --threads says, its matmuls use OpenBLAS's threads."""
    from compiler.reference import run_reference

    return lambda: run_reference(graph, inputs)


CLOCKS = {"wall": time.perf_counter_ns, "cpu": time.thread_time_ns}


def round_samples(
    fn: Callable[[], object], min_time: float, max_iters: int = 2000, clock: str = "wall"
) -> list[float]:
    """Latencies (us) of one round: repeats lasting at least ``min_time`` seconds (3 at least), each timed
    on ``clock`` (``cpu``: the calling thread's CPU time, see ``--clock``)."""
    now = CLOCKS[clock]
    fn()
    samples = []
    start = time.perf_counter()
    while (time.perf_counter() - start < min_time or len(samples) < 3) and len(samples) < max_iters:
        t0 = now()
        fn()
        samples.append((now() - t0) / 1e3)
    return samples


def round_median(
    fn: Callable[[], object], min_time: float, max_iters: int = 2000, clock: str = "wall"
) -> float:
    """Median latency (us) of one round (:func:`round_samples`)."""
    return statistics.median(round_samples(fn, min_time, max_iters, clock))


def rotated_rounds(
    contenders: dict[str, Callable[[], object]],
    rounds: int,
    min_time: float,
    start: int = 0,
    clock: str = "wall",
):
    """{name: [round medians]}: round r times the contenders in their order rotated by ``start + r``."""
    names = list(contenders)
    per: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        k = (start + r) % len(names)
        for name in names[k:] + names[:k]:
            per[name].append(round_median(contenders[name], min_time, clock=clock))
    return per


def kiln_with_runtime(graph, target, runtime: str, threads: int):
    """The graph compiled with default schedules, its parallel loops on ``runtime`` (pool / openmp)."""
    from tuner.api import compile as kiln_compile

    old = os.environ.get("KILN_CPU_PARALLEL")
    os.environ["KILN_CPU_PARALLEL"] = runtime
    try:
        model = kiln_compile(graph, target)
    finally:
        if old is None:
            del os.environ["KILN_CPU_PARALLEL"]
        else:
            os.environ["KILN_CPU_PARALLEL"] = old
    model.num_threads = threads
    return model


class BusyLoad:
    """``n`` busy-loop processes while the context is open (killed by their pids on exit)."""

    def __init__(self, n: int) -> None:
        self.n, self.procs = n, []

    def __enter__(self) -> BusyLoad:
        import subprocess

        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(self.n)]
        time.sleep(0.2)  # the interpreters are spinning
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


RUNTIME_CONTENDERS = ("kiln pool", "kiln openmp", "onnxruntime")


def _contender_process(conn, who: str, name: str, threads: int) -> None:
    """One contender of --runtimes in a process of its own: build it, check its outputs, then answer each
    request ``min_time`` with one round median (None ends). Its threads (the pool's workers, libgomp's,
    onnxruntime's) spin or sleep in this process only, never during another contender's round."""
    try:
        from compiler.reference import random_inputs, run_reference
        from compiler.target import Target

        graph = graph_for(name)
        inputs = random_inputs(graph, seed=0)
        refs = run_reference(graph, inputs)
        if who == "onnxruntime":
            fn = ort_iobinding(graph, inputs, threads)
        else:
            model = kiln_with_runtime(graph, Target.host(), who.split()[1], threads)
            fn = model.bind(inputs, out=[np.empty_like(r) for r in refs])
        if fn is None:
            conn.send(("missing", f"{who} is not installed"))
            return
        check(who, name, fn(), refs)
    except BaseException as exc:  # check() raises SystemExit: the parent reports it
        conn.send(("error", f"{who} on {name}: {exc}"))
        return
    conn.send(("ready", None))
    while (min_time := conn.recv()) is not None:
        samples = round_samples(fn, min_time)
        conn.send((statistics.median(samples), statistics.fmean(samples)))


class Contenders:
    """The --runtimes contenders of one workload, each in its own spawned process."""

    def __init__(self, name: str, threads: int) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.conns, self.procs = {}, []
        for who in RUNTIME_CONTENDERS:
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_contender_process, args=(child, who, name, threads), daemon=True)
            proc.start()
            self.procs.append(proc)
            self.conns[who] = parent
        for who in list(self.conns):
            status, detail = self.conns[who].recv()
            if status == "error":
                self.close()
                raise SystemExit(detail)
            if status == "missing":
                print(detail, flush=True)
                del self.conns[who]

    def round(self, min_time: float, start: int) -> dict[str, tuple[float, float]]:
        """One round's (median, mean) latency per contender, in the order rotated by ``start``."""
        names = list(self.conns)
        k = start % len(names)
        out = {}
        for who in names[k:] + names[:k]:
            self.conns[who].send(min_time)
            out[who] = self.conns[who].recv()
        return out

    def close(self) -> None:
        for conn in self.conns.values():
            conn.send(None)
        for proc in self.procs:
            proc.join(timeout=30)


def _ratio(peer: list[float], pool_times: list[float]) -> str:
    """The median of the per-round ratios peer / pool with their range."""
    r = [a / b for a, b in zip(peer, pool_times, strict=True)]
    return f"{statistics.median(r):.2f}x ({min(r):.2f}..{max(r):.2f})"


def runtimes_main(args) -> int:
    """--runtimes: Kiln's thread pool vs OpenMP vs onnxruntime, quiet and under a busy-loop load."""
    from compiler.backends.cpu import pool
    from compiler.target import Target
    from scripts.bench_common import machine_line, markdown_table

    target = Target.host()
    conditions = ("quiet", "loaded")
    load_before = os.getloadavg()
    rows = []
    for name in args.workloads or RUNTIME_WORKLOADS:
        contenders = Contenders(name, args.threads)
        per: dict[tuple[str, str], list[tuple[float, float]]] = {}
        try:
            for r in range(args.rounds):
                for cond in conditions if r % 2 == 0 else conditions[::-1]:
                    with BusyLoad(args.load if cond == "loaded" else 0):
                        for who, stats in contenders.round(args.min_time, start=r).items():
                            per.setdefault((cond, who), []).append(stats)
        finally:
            contenders.close()
        for cond in conditions:
            row = {"workload": name, "machine": cond}
            medians = {who: [m for m, _ in per[(cond, who)]] for who in contenders.conns}
            means = {who: [m for _, m in per[(cond, who)]] for who in contenders.conns}
            for who in contenders.conns:
                v = medians[who]
                mid = statistics.median(v)
                fmt = ",.0f" if mid >= 100 else ".1f"
                row[who] = f"{mid:{fmt}} ({min(v):{fmt}}..{max(v):{fmt}})"
            for peer in ("kiln openmp", "onnxruntime"):
                if peer in contenders.conns:
                    row[f"pool vs {peer.split()[-1]}"] = _ratio(medians[peer], medians["kiln pool"])
            row["pool vs openmp, mean per call"] = _ratio(means["kiln openmp"], means["kiln pool"])
            rows.append(row)
            print(row, flush=True)
    load_after = os.getloadavg()
    columns = ["workload", "machine", "kiln pool", "kiln openmp", "onnxruntime", "pool vs openmp"]
    columns += ["pool vs onnxruntime", "pool vs openmp, mean per call"]
    columns = [c for c in columns if any(c in r for r in rows)]
    spin = os.environ.get("KILN_POOL_SPIN_US")
    text = (
        "# Kiln's parallel loops: thread pool vs OpenMP (default schedules, bind()) vs onnxruntime\n\n"
        f"Machine: {machine_line()} (shared with other users: 'quiet' is the machine as it was, not idle; "
        f"load average (1 min) {load_before[0]:.1f} before, {load_after[0]:.1f} after the run); "
        f"Kiln target `{target.key}`. `{command_line()}`; {args.threads} threads for every contender "
        f"(OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}, pool spin "
        f"{spin if spin is not None else pool.SPIN_US} us). Each of {args.rounds} rounds "
        f"times every contender once on the machine as it was ('quiet') and once while {args.load} "
        "busy-loop process(es) ran ('loaded'), the halves alternating which comes first and the contenders "
        "in rotated order; median over rounds of per-round medians in microseconds, lowest..highest round "
        "median in brackets. Ratios (> 1: the pool is faster) are medians of the per-round ratios, lowest.."
        "highest in brackets; the last column compares the mean time per call instead of the median (it "
        "counts the rare very slow calls that a median hides: on a busy machine a runtime whose caller waits "
        "for a descheduled thread makes few, very slow calls). Every contender runs in a process of its own "
        "(its idle threads spin or sleep there, not in the next contender's round). Outputs checked against "
        "the numpy reference first. Both Kiln builds run the same kernels (default schedules) with inputs "
        "and outputs bound once; onnxruntime with IOBinding.\n\n"
        f"{markdown_table(rows, columns)}\n"
    )
    return _emit(text, args.out)


# --pools: one model alone vs the same model with a second Kiln library in the process (see the docstring)
POOL_WORKLOADS = ["mlp", "rmsnorm", "layernorm", "resblock"]
POOL_MODES = ("alone", "in turn with B", "after a round of B")
# The child: run with a source tree first on sys.path (``before``: ``git archive`` of a ref; ``after``: this
# checkout), so it only uses what both trees have. Protocol on stdin/stdout, one JSON line each: it prints
# {"ready": ...} after building and checking, then answers every {"min_time": s, "start": k} line with one
# round median per mode (modes in the order rotated by k), and ends on an empty line.
_POOLS_CHILD = r"""
import json, os, statistics, sys, time
import numpy as np
from compiler.backends.cpu import gcc
from compiler.build import compile as kiln_compile
from compiler.frontend.models import get_model
from compiler.reference import random_inputs, run_reference
from compiler.runtime.executor import aligned_empty

name, threads = sys.argv[1], int(sys.argv[2])
graph = get_model(name)
inputs = random_inputs(graph, seed=0)
refs = run_reference(graph, inputs)
a, b = kiln_compile(graph, "cpu"), kiln_compile(graph, "cpu")
b.library = gcc.build(b.source + "\n/* model B: a second library of the same model */\n")
assert a.library is None or a.library.path != b.library.path
a.num_threads = b.num_threads = threads
# 64-byte aligned outputs, as run() gives (a misaligned one loses the kernels' streaming stores)
fa = a.bind(inputs, out=[aligned_empty(r.shape, r.dtype) for r in refs])
fb = b.bind(inputs, out=[aligned_empty(r.shape, r.dtype) for r in refs])
for who, fn in (("A", fa), ("B", fb)):
    for got, ref in zip(fn(), refs):
        err = float(np.max(np.abs(got - ref)) / max(1.0, float(np.max(np.abs(ref)))))
        if not err <= 1e-3:
            raise SystemExit(f"model {who} of {name}: max error {err:.3g} against the numpy reference")

def one_round(mode, min_time):
    if mode == "after a round of B":  # what kiln bench does: B's calls back to back, then A's round
        end = time.perf_counter() + min_time
        while time.perf_counter() < end:
            fb()
    samples, end = [], time.perf_counter() + min_time
    while time.perf_counter() < end or len(samples) < 3:
        t0 = time.perf_counter_ns()
        fa()
        samples.append((time.perf_counter_ns() - t0) / 1e3)
        if mode == "in turn with B":
            fb()
    return statistics.median(samples)

modes = json.loads(sys.argv[3])
print(json.dumps({"ready": True, "threads": len(os.listdir("/proc/self/task"))}), flush=True)
for line in sys.stdin:
    if not line.strip():
        break
    req = json.loads(line)
    k = req["start"] % len(modes)
    print(json.dumps({m: one_round(m, req["min_time"]) for m in modes[k:] + modes[:k]}), flush=True)
"""


class PoolsChild:
    """One ``_POOLS_CHILD`` process running the code of ``tree`` (its own cwd and PYTHONPATH)."""

    def __init__(self, tree: Path, name: str, threads: int) -> None:
        import json
        import subprocess

        env = {**os.environ, "PYTHONPATH": str(tree)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _POOLS_CHILD, name, str(threads), json.dumps(POOL_MODES)],
            cwd=tree,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            raise SystemExit(f"the {name} process of {tree} failed (exit status {self.proc.returncode})")
        self.ready = json.loads(line)

    def round(self, min_time: float, start: int) -> dict[str, float]:
        import json

        self.proc.stdin.write(json.dumps({"min_time": min_time, "start": start}) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def cpu_seconds(self) -> float:
        """CPU time the child's threads have used so far (``/proc/PID/stat``: user + system)."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def threads(self) -> int:
        """The child's threads now (main thread, pool workers, and what numpy/OpenBLAS started)."""
        return len(os.listdir(f"/proc/{self.proc.pid}/task"))

    def close(self) -> None:
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        self.proc.wait(timeout=60)


def _git(*args: str) -> str:
    import subprocess

    root = Path(__file__).resolve().parent.parent
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout


def pools_main(args) -> int:
    """--pools: a model alone vs called in turn with a second Kiln model, main's code vs this checkout's."""
    import subprocess
    import tempfile

    from compiler.target import Target
    from scripts.bench_common import machine_line, markdown_table
    from tuner.bench.timing import CpuSnapshot, cpu_snapshot, others_cpu

    root = Path(__file__).resolve().parent.parent
    before_sha = _git("rev-parse", args.before).strip()
    dirty = "+dirty" if _git("status", "--porcelain").strip() else ""
    after_sha = _git("rev-parse", "HEAD").strip()[:10] + dirty
    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="kiln-before-") as tmp:
        archive = subprocess.run(
            ["git", "-C", str(root), "archive", before_sha, "compiler"], capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        trees = {"before": Path(tmp), "after": root}
        for name in args.workloads or POOL_WORKLOADS:
            children = {code: PoolsChild(tree, name, args.threads) for code, tree in trees.items()}
            per: dict[str, dict[str, list[float]]] = {c: {m: [] for m in POOL_MODES} for c in trees}
            snap0, mine0 = cpu_snapshot(), sum(c.cpu_seconds() for c in children.values())
            try:
                for r in range(args.rounds):
                    codes = list(trees) if r % 2 == 0 else list(trees)[::-1]
                    for code in codes:
                        for mode, med in children[code].round(args.min_time, start=r).items():
                            per[code][mode].append(med)
                threads = {code: child.threads() for code, child in children.items()}
                snap1, mine1 = cpu_snapshot(), sum(c.cpu_seconds() for c in children.values())
            finally:
                for child in children.values():
                    child.close()
            for code in trees:
                row = {"workload": name, "code": code}
                for mode in POOL_MODES:
                    v = per[code][mode]
                    mid = statistics.median(v)
                    fmt = ",.0f" if mid >= 100 else ".1f"
                    row[f"A {mode} us"] = f"{mid:{fmt}} ({min(v):{fmt}}..{max(v):{fmt}})"
                for mode, col in ((POOL_MODES[1], "in turn / alone"), (POOL_MODES[2], "after B / alone")):
                    ratios = [t / a for t, a in zip(per[code][mode], per[code][POOL_MODES[0]])]
                    mid = statistics.median(ratios)
                    row[col] = f"{mid:.2f}x ({min(ratios):.2f}..{max(ratios):.2f})"
                row["threads in the process"] = threads[code]
                if snap0 is not None and snap1 is not None:  # this script and its two children are not others
                    mine = CpuSnapshot(snap1.wall, snap1.busy, snap1.own + mine1 - mine0)
                    row["others' CPU"] = f"{others_cpu(snap0, mine):.2f}"
                rows.append(row)
                print(row, flush=True)
    load_after = os.getloadavg()
    columns = ["workload", "code", *(f"A {m} us" for m in POOL_MODES), "in turn / alone", "after B / alone"]
    columns += ["threads in the process", "others' CPU"]
    text = (
        "# Two Kiln models in one process: one model alone vs called in turn with a second one\n\n"
        f"Machine: {machine_line()} (shared with other users; load average (1 min) {load_before[0]:.1f} "
        f"before, {load_after[0]:.1f} after the run); Kiln target `{Target.host().key}`. "
        f"`{command_line()}`; {args.threads} threads per model.\n\n"
        f"`before` is the code of `{args.before}` ({before_sha[:10]}: every kernel library carries a thread "
        f"pool of its own), `after` this checkout ({after_sha}: one pool per process, a runtime library "
        "that every kernel library calls). For each workload and each code a process of its own builds the "
        "zoo model twice with default schedules: A, and B, the same C with a comment added, so B is a "
        "second library (as a default and a tuned model, or the rules' and the searched plan, are). Both "
        "are checked against the numpy reference, then each round times A's calls (inputs and 64-byte "
        "aligned outputs bound once) back to back (`alone`; B loaded, idle) and with one call of B after "
        "each call of A (`in turn with B`, A's calls timed; a process serving two models) and right "
        "after a round of B's calls back to back (`after a round of B`: what `kiln bench` and "
        "scripts/bench_fusion.py do with a default and a tuned model), the modes in rotated order, the "
        f"two codes' processes taking turns ({args.rounds} rounds of {args.min_time} s per mode). "
        "Median over rounds of per-round medians in microseconds, lowest..highest round median in "
        "brackets; `in turn / alone` and `after B / alone` are medians of the per-round ratios (1.00x: the "
        "second model costs A nothing), lowest..highest in brackets. `threads in the process`: the child's "
        "threads after the run (the main thread, OpenBLAS's, and the pool workers: one pool per library "
        "before, one per process after). `others' CPU`: the CPU other processes used while the workload's "
        "rounds ran (`/proc/stat` less this script and its two processes; in cores' worth, of "
        f"{os.cpu_count()}: 1.00 is one core kept busy by another engineer's job).\n\n"
        f"{markdown_table(rows, columns)}\n"
    )
    return _emit(text, args.out)


def _emit(text: str, out: str | None) -> int:
    """Print a mode's report and write it to ``out`` when given; the mode's exit status."""
    print(text)
    if out:
        Path(out).write_text(text)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", nargs="*", default=None, help=f"default {WORKLOADS}")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.25, help="seconds per contender per round")
    ap.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall: elapsed time; cpu: the calling thread's CPU time (only with --threads 1, where every "
        "contender computes on the calling thread: robust to other processes sharing the cores)",
    )
    ap.add_argument("--no-torch", action="store_true", help="leave torch eager out")
    ap.add_argument("--out", help="also write the markdown table here")
    ap.add_argument(
        "--runtimes",
        action="store_true",
        help=f"thread pool vs OpenMP vs onnxruntime, quiet and loaded (workloads {RUNTIME_WORKLOADS})",
    )
    ap.add_argument("--load", type=int, default=1, help="--runtimes: busy-loop processes in loaded rounds")
    ap.add_argument(
        "--pools",
        action="store_true",
        help=f"a model alone vs in turn with a second Kiln model, --before's code vs this checkout's "
        f"(workloads {POOL_WORKLOADS})",
    )
    ap.add_argument("--before", default="main", help="--pools: the git ref of the code to compare with")
    args = ap.parse_args()
    if args.runtimes:
        return runtimes_main(args)
    if args.pools:
        return pools_main(args)
    if args.clock == "cpu" and args.threads != 1:
        ap.error(
            f"--clock cpu needs --threads 1 (with {args.threads} threads the work of the other threads is "
            "not on the calling thread's clock)"
        )

    from compiler.reference import random_inputs, run_reference
    from compiler.runtime.executor import aligned_empty
    from compiler.target import Target
    from scripts.bench_common import machine_line, markdown_table
    from tuner.api import compile as kiln_compile

    target = Target.host()
    load_before = os.getloadavg()
    rows = []
    for name in args.workloads or WORKLOADS:
        graph = graph_for(name)
        inputs = random_inputs(graph, seed=0)
        refs = run_reference(graph, inputs)
        model = kiln_compile(graph, target)
        model.num_threads = args.threads
        bound = [aligned_empty(r.shape, r.dtype) for r in refs]
        contenders: dict[str, Callable[[], object]] = {
            "kiln run()": lambda m=model, x=inputs: m.run(x),
            "kiln out=": lambda m=model, x=inputs, o=bound: m.run(x, out=o),
            "kiln bind()": model.bind(inputs, out=[aligned_empty(r.shape, r.dtype) for r in refs]),
        }
        np_fn = mnist_numpy(graph, inputs) if name == "mnist_mlp" else numpy_reference(graph, inputs)
        if np_fn is not None:
            contenders["numpy"] = np_fn
        ort = ort_iobinding(graph, inputs, args.threads)
        if ort is not None:
            contenders["onnxruntime"] = ort
        if not args.no_torch:
            eager = torch_eager(graph, inputs, args.threads)
            if eager is not None:
                contenders["torch eager"] = eager
        for who, fn in contenders.items():
            check(who, name, fn(), refs)
        per = rotated_rounds(contenders, args.rounds, args.min_time, clock=args.clock)
        med = {k: statistics.median(v) for k, v in per.items()}
        peers = {k: v for k, v in med.items() if not k.startswith("kiln")}
        best = min(peers, key=peers.get) if peers else None
        row = {"workload": name}
        for k, v in per.items():
            fmt = ",.0f" if med[k] >= 100 else ".1f"
            row[k] = f"{med[k]:{fmt}} ({min(v):{fmt}}..{max(v):{fmt}})"
        if "onnxruntime" in med:
            row["run() vs onnxruntime"] = f"{med['onnxruntime'] / med['kiln run()']:.2f}x"
            row["bind() vs onnxruntime"] = f"{med['onnxruntime'] / med['kiln bind()']:.2f}x"
        if best is not None:
            row["bind() vs best peer"] = f"{peers[best] / med['kiln bind()']:.2f}x ({best})"
        rows.append(row)
        print(row, flush=True)

    columns = ["workload", "kiln run()", "kiln out=", "kiln bind()", "numpy", "onnxruntime", "torch eager"]
    columns = [c for c in columns if any(c in r for r in rows)]
    ratios = ("run() vs onnxruntime", "bind() vs onnxruntime", "bind() vs best peer")
    columns += [c for c in ratios if any(c in r for r in rows)]
    load_after = os.getloadavg()
    narrowed = os.environ.get("KILN_HOST_ISA")
    isa = (
        f"Kiln's code is narrowed by KILN_HOST_ISA={narrowed} on this host; numpy runs {openblas_core()}, "
        f"torch eager is limited to {os.environ.get('ATEN_CPU_CAPABILITY', 'its default')} kernels "
        "(ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA / MKL_ENABLE_INSTRUCTIONS); onnxruntime (MLAS) cannot be "
        "narrowed and uses the host's full ISA"
        if narrowed
        else f"numpy runs {openblas_core()}; onnxruntime and torch use the host's full ISA"
    )
    text = (
        f"# Kiln CPU kernels (default schedules) vs peers\n\n"
        f"Machine: {machine_line()}; Kiln target `{target.key}` ({target.vector_bytes * 8}-bit vectors; "
        f"{isa}). Load average (1 min) {load_before[0]:.1f} before, {load_after[0]:.1f} after the run "
        f"({os.cpu_count()} CPUs). "
        f"`{command_line()}` (which sets "
        + (", ".join(f"{k}={v}" for k, v in PEER_ISA_ENV.get(_host_isa(), {}).items()) or "nothing")
        + f" for the peers); {args.threads} threads for every "
        f"contender; {'CPU time of the calling thread' if args.clock == 'cpu' else 'wall-clock time'}. "
        f"Median over {args.rounds} interleaved rounds (rotated order) of per-round medians, in "
        f"microseconds, with the lowest..highest round median in brackets. Outputs checked against the "
        f"numpy reference first. `kiln run()` returns fresh arrays each call (no copy); `kiln out=` writes "
        f"into caller arrays; `kiln bind()` and onnxruntime (IOBinding) run on arrays bound once (64-byte "
        f"aligned); numpy and torch eager allocate per call.\n\n"
        f"{markdown_table(rows, columns)}\n"
    )
    return _emit(text, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
