"""The contenders `kiln bench` times: Kiln (default schedules, tuned records) and its peers.

CPU: ``kiln default``, ``kiln tuned`` (best records of ``--db``), ``numpy``, ``onnxruntime``, ``torch
eager``, ``torch.compile``. CUDA: ``kiln``, ``kiln tuned``, ``torch eager``, ``torch.compile``,
``torch.compile max-autotune``, ``cupy`` (cuBLAS, for a workload that is one matrix product). Peers whose
package is not installed are reported as unavailable, with the package to install.

Every contender states in :attr:`Contender.note` what it does about threads and output buffers; the report
prints those notes. On the CPU every contender gets the same ``threads``: Kiln's thread-pool threads,
onnxruntime's intra-op threads, ``torch.set_num_threads``, and numpy's BLAS through threadpoolctl (numpy's
elementwise code is single-threaded whatever the setting: the note says so).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler.errors import KilnError
from tuner.bench.timing import PERF_CLOCK, Clock


@dataclass
class PreparedWorkload:
    """A workload ready to time: its graph, seeded inputs, the numpy reference's outputs, and what the graph
    says it costs (FLOPs of every node after the optimizing passes; bytes of inputs, params and outputs)."""

    name: str
    model: str
    graph: Any
    inputs: list[np.ndarray]
    refs: list[np.ndarray]
    flops: float
    contraction_flops: float
    bytes: float
    onnx_path: str | None = None


@dataclass
class BenchContext:
    """What every contender of a run shares: the target kind, the thread count, the tuning database."""

    target: str = "cpu"
    threads: int = 1
    db: Any = None  # an open TuningDatabase (``kiln tuned``) or None


@dataclass
class Prepared:
    """A contender ready to run one workload: ``call()`` runs it once and returns its outputs;
    ``to_numpy`` turns one output into a host numpy array for the check; ``clock`` times it; ``info`` is
    stored with the result (e.g. how many kernels came from tuning records)."""

    call: Callable[[], Sequence[Any]]
    clock: Clock = PERF_CLOCK
    to_numpy: Callable[[Any], np.ndarray] = np.asarray
    info: dict[str, Any] = field(default_factory=dict)


class Contender(ABC):
    """One way of computing a workload that `kiln bench` times.

    Contract:

    * ``name`` is unique per target; ``note`` says, for the report, how it uses threads and whether its
      outputs are preallocated (and why not, where it cannot);
    * :meth:`unavailable` returns why the contender cannot run in this process (a missing package, no
      ``--db``), else None; it is asked once per run and must be cheap;
    * :meth:`prepare` builds everything for one workload (compiling, warming up) outside the timed span and
      returns a :class:`Prepared`; its ``call()`` computes the workload's outputs from
      ``workload.inputs`` with ``ctx.threads`` threads, and may reuse the same output buffers every call. A
      workload the contender cannot compute raises :class:`KilnError` (or any exception) with the reason:
      it is recorded, never fatal to the run.

    The harness checks ``call()``'s outputs against the numpy reference before timing it.
    """

    name: str = ""
    note: str = ""

    def unavailable(self, ctx: BenchContext) -> str | None:
        return None

    @abstractmethod
    def prepare(self, workload: PreparedWorkload, ctx: BenchContext) -> Prepared: ...


def _missing(module: str, extra: str) -> str | None:
    from importlib.util import find_spec

    if find_spec(module) is None:
        return f'{module} is not installed (pip install -e ".[{extra}]")'
    return None


# ------------------------------------------------------------------------------------------------- CPU
class KilnContender(Contender):
    """Kiln's compiled model: default schedules, or the best records of the run's database (``tuned``)."""

    def __init__(self, tuned: bool, name: str | None = None, cuda_graph: bool = False) -> None:
        self.tuned = tuned
        self.cuda_graph = cuda_graph
        self.name = name or ("kiln tuned" if tuned else "kiln default")
        schedules = "best tuning records of --db" if tuned else "default schedules"
        if name is None or not name.startswith("kiln") or name in ("kiln default", "kiln tuned"):
            how = "Kiln's thread pool with the run's threads"
        else:
            how = "inputs on the device" + (", one CUDA Graph replay per call" if cuda_graph else "")
        self.note = f"{schedules}; {how}; outputs in the model's own preallocated buffers"

    def unavailable(self, ctx: BenchContext) -> str | None:
        if self.tuned and ctx.db is None:
            return "no --db to take tuning records from"
        if self.tuned and ctx.db.count_records("ok") == 0:
            return f"{ctx.db.url} holds no ok tuning records"
        return None

    def prepare(self, workload: PreparedWorkload, ctx: BenchContext) -> Prepared:
        from tuner.api import compile as kiln_compile

        model = kiln_compile(workload.graph, ctx.target, db=ctx.db if self.tuned else None)
        from_records = sum(1 for k in model.kernels if k.extra.get("origin") == "record")
        # a record confirmed not faster than the default keeps the default schedule (tuner.records): that
        # kernel was tuned, and "kiln tuned" runs it as compile would
        kept = sum(
            1
            for k in model.kernels
            if k.extra.get("origin") != "record" and (k.extra.get("record") or {}).get("kept_default")
        )
        if self.tuned and from_records + kept == 0:
            raise KilnError(f"no tuning records for any kernel of {workload.name} on {model.target.key}")
        info = {"kernels": len(model.kernels), "kernels_from_records": from_records}
        if kept:
            info["kernels_kept_default"] = kept
        if ctx.target == "cuda":
            import cupy as cp

            dev = [cp.asarray(x) for x in workload.inputs]

            def run_cuda() -> Sequence[Any]:
                out = model.run_device(dev, cuda_graph=self.cuda_graph)
                cp.cuda.Device().synchronize()
                return out

            return Prepared(run_cuda, to_numpy=lambda a: a.get(), info=info)
        model.num_threads = ctx.threads
        inputs = workload.inputs
        return Prepared(lambda: model.run(inputs, copy=False), info=info)


class NumpyContender(Contender):
    """The graph's numpy reference, op by op (what a straightforward numpy program does)."""

    name = "numpy"
    note = (
        "the graph's numpy reference op by op; elementwise numpy code is single-threaded whatever the "
        "setting, BLAS calls (matmul) use the run's threads (threadpoolctl); allocates outputs per call"
    )

    def prepare(self, workload: PreparedWorkload, ctx: BenchContext) -> Prepared:
        from threadpoolctl import threadpool_limits

        from compiler.reference import run_reference

        graph, inputs, threads = workload.graph, workload.inputs, ctx.threads

        def run() -> Sequence[Any]:
            with threadpool_limits(limits=threads, user_api="blas"):
                return run_reference(graph, inputs)

        return Prepared(run)


def ort_session(source: Any, threads: int) -> Any:
    """An onnxruntime CPU session (ORT_ENABLE_ALL, sequential, ``threads`` intra-op threads) on an ONNX file
    path or serialized model bytes."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    # its idle pool threads sleep instead of spinning (as every OpenMP runtime of the run does, see
    # OMP_WAIT_POLICY in `kiln bench`): spinning threads would take the cores of the next contender
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])


class OnnxRuntimeContender(Contender):
    """onnxruntime on the workload's ONNX file (or the built-in model exported with ``export_onnx``),
    through IOBinding: inputs bound once, outputs written into preallocated arrays."""

    name = "onnxruntime"
    note = (
        "CPU provider, ORT_ENABLE_ALL, sequential, intra-op threads = the run's threads (not spinning when "
        "idle); IOBinding with preallocated output arrays (no allocation per call)"
    )

    def unavailable(self, ctx: BenchContext) -> str | None:
        return _missing("onnxruntime", "dev") or _missing("onnx", "onnx")

    def prepare(self, workload: PreparedWorkload, ctx: BenchContext) -> Prepared:
        if workload.onnx_path is not None:
            sess = ort_session(workload.onnx_path, ctx.threads)
        else:
            from compiler.frontend.onnx_export import export_onnx

            sess = ort_session(export_onnx(workload.graph).SerializeToString(), ctx.threads)
        names = [i.name for i in sess.get_inputs()]
        if len(names) != len(workload.inputs):
            raise KilnError(f"the ONNX model takes inputs {names}, the graph {len(workload.inputs)}")
        binding = sess.io_binding()
        for name, arr in zip(names, workload.inputs):
            binding.bind_cpu_input(name, np.ascontiguousarray(arr))
        outs = [np.empty_like(r) for r in workload.refs]
        for meta, arr in zip(sess.get_outputs(), outs):
            binding.bind_output(meta.name, "cpu", 0, arr.dtype, list(arr.shape), arr.ctypes.data)

        def run() -> Sequence[Any]:
            sess.run_with_iobinding(binding)
            return outs

        return Prepared(run)


def _torch_to_numpy(t: Any) -> np.ndarray:
    return t.detach().float().cpu().numpy() if hasattr(t, "detach") else np.asarray(t)


class TorchContender(Contender):
    """The graph as torch ops (:mod:`tuner.bench.torch_peer`), eager or through ``torch.compile``."""

    def __init__(self, compile_mode: str | None, device: str = "cpu") -> None:
        self.compile_mode = compile_mode
        self.device = device
        if compile_mode is None:
            self.name = "torch eager"
        else:
            self.name = "torch.compile" + ("" if compile_mode == "default" else f" {compile_mode}")
        how = (
            "eager"
            if compile_mode is None
            else f"torch.compile(mode={compile_mode}), dynamic=False, warmed up"
        )
        threads = "torch.set_num_threads(the run's threads)" if device == "cpu" else "the GPU"
        self.note = f"{how}, no_grad; {threads}; allocates outputs per call (torch ops return new tensors)"

    def unavailable(self, ctx: BenchContext) -> str | None:
        return _missing("torch", "torch")

    def prepare(self, workload: PreparedWorkload, ctx: BenchContext) -> Prepared:
        import torch

        from tuner.bench.torch_peer import graph_to_torch, params_as_inputs

        if self.device == "cpu":
            torch.set_num_threads(ctx.threads)
            fn = graph_to_torch(workload.graph)
            args = [torch.from_numpy(np.ascontiguousarray(x)) for x in workload.inputs]
        else:
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            fn = graph_to_torch(params_as_inputs(workload.graph))
            args = [torch.from_numpy(np.ascontiguousarray(x)).cuda() for x in workload.inputs]
            args += [torch.from_numpy(np.ascontiguousarray(p.data)).cuda() for p in workload.graph.params]
        if self.compile_mode is not None:
            mode = None if self.compile_mode == "default" else self.compile_mode
            fn = torch.compile(fn, mode=mode, dynamic=False)
        sync = torch.cuda.synchronize if self.device == "cuda" else None

        def run() -> Sequence[Any]:
            with torch.no_grad():
                out = fn(*args)
            if sync is not None:
                sync()
            return out if isinstance(out, tuple) else (out,)

        run()  # compiles (torch.compile) outside the timed span
        return Prepared(run, to_numpy=_torch_to_numpy)


# ------------------------------------------------------------------------------------------------ CUDA
class CupyMatmulContender(Contender):
    """cuBLAS through ``cupy.matmul(a, b, out=c)``, for a workload that is one matrix product."""

    name = "cupy"
    note = "cupy.matmul (cuBLAS, TF32 off) into a preallocated output; only for a single-matmul workload"

    def unavailable(self, ctx: BenchContext) -> str | None:
        from compiler.backends.cuda.device import why_unavailable

        return why_unavailable()

    def prepare(self, workload: PreparedWorkload, ctx: BenchContext) -> Prepared:
        import cupy as cp

        nodes = workload.graph.nodes
        if len(nodes) != 1 or nodes[0].op not in ("matmul", "batch_matmul") or len(workload.inputs) != 2:
            raise KilnError(f"{workload.name} is not a single matrix product of two inputs (cuBLAS applies)")
        attrs = nodes[0].attrs
        a, b = (cp.asarray(x) for x in workload.inputs)
        a = a.swapaxes(-1, -2) if attrs.get("transpose_a") else a
        b = b.swapaxes(-1, -2) if attrs.get("transpose_b") else b
        out = cp.empty(workload.refs[0].shape, cp.float32)

        def run() -> Sequence[Any]:
            cp.matmul(a, b, out=out)
            cp.cuda.Device().synchronize()
            return (out,)

        return Prepared(run, to_numpy=lambda x: x.get())


# -------------------------------------------------------------------------------------------- registry
CPU_CONTENDERS: dict[str, Callable[[], Contender]] = {
    "kiln default": lambda: KilnContender(tuned=False),
    "kiln tuned": lambda: KilnContender(tuned=True),
    "numpy": NumpyContender,
    "onnxruntime": OnnxRuntimeContender,
    "torch eager": lambda: TorchContender(None),
    "torch.compile": lambda: TorchContender("default"),
}
CUDA_CONTENDERS: dict[str, Callable[[], Contender]] = {
    "kiln": lambda: KilnContender(tuned=False, name="kiln"),
    "kiln graph": lambda: KilnContender(tuned=False, name="kiln graph", cuda_graph=True),
    "kiln tuned": lambda: KilnContender(tuned=True, name="kiln tuned"),
    "kiln tuned graph": lambda: KilnContender(tuned=True, name="kiln tuned graph", cuda_graph=True),
    "torch eager": lambda: TorchContender(None, "cuda"),
    "torch.compile": lambda: TorchContender("default", "cuda"),
    "torch.compile max-autotune": lambda: TorchContender("max-autotune", "cuda"),
    "cupy": CupyMatmulContender,
}
REGISTRY: dict[str, dict[str, Callable[[], Contender]]] = {"cpu": CPU_CONTENDERS, "cuda": CUDA_CONTENDERS}


def create_contenders(target: str, names: Sequence[str] | None) -> list[Contender]:
    """The contenders ``names`` of ``target`` (None: all of them), in the order given."""
    table = REGISTRY.get(target)
    if table is None:
        raise KilnError(f"kiln bench has no contenders for target {target!r}; targets: {', '.join(REGISTRY)}")
    wanted = list(table) if names is None else list(names)
    unknown = [n for n in wanted if n not in table]
    if unknown:
        raise KilnError(
            f"unknown contender(s) {', '.join(repr(n) for n in unknown)} for --target {target}; "
            f"known: {', '.join(table)}"
        )
    return [table[n]() for n in wanted]


# ----------------------------------------------------------------------------------- in-memory (tests)
class InMemoryContender(Contender):
    """A contender for tests: it "computes" the reference outputs and takes ``latency_us`` (times a seeded
    log-normal noise of ``noise``) on a :class:`~tuner.bench.timing.ManualClock`, so verdicts can be tested
    without timing anything real."""

    def __init__(
        self, name: str, latency_us: float, noise: float = 0.02, seed: int = 0, clock: Any = None
    ) -> None:
        from tuner.bench.timing import ManualClock

        self.name = name
        self.note = f"in-memory test contender: {latency_us:g} us ± {noise:.0%}"
        self.latency_us = latency_us
        self.noise = noise
        self.rng = np.random.default_rng(seed)
        self.clock = clock or ManualClock()

    def prepare(self, workload: PreparedWorkload, ctx: BenchContext) -> Prepared:
        refs = workload.refs

        def run() -> Sequence[Any]:
            self.clock.advance(self.latency_us * 1e-6 * float(self.rng.lognormal(0.0, self.noise)))
            return refs

        return Prepared(run, clock=self.clock)
