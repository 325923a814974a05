"""LocalBuilder of cuda targets: check, schedule, lower, generate CUDA and compile candidates with NVRTC in a
pool of worker processes.

Each valid candidate is one job (NVRTC has no process start to amortize, and one translation unit per
candidate makes the compiler's errors the candidate's own): the worker rebuilds the candidate's group once
per task (from the workload's canonical JSON), schedules it with the config, lowers it through the cuda
backend, names its kernel after the candidate (:func:`kernel_name`), prints the CUDA source and compiles it
with :func:`compiler.backends.cuda.nvrtc.build` (cubins cached on disk by source + options + arch). A worker
that does not answer within ``timeout_s`` is killed (``compile_error``: "build timed out") and restarted.

NVRTC's errors are ``compile_error`` naming the kernel and quoting the compiler's lines. When a GPU is
visible (or a simulated CuPy), the compiled kernels' attributes are read: ``info["kernels"]`` holds each
kernel's launch (grid, block, dynamic shared memory) and ``num_regs``, ``shared_size_bytes``,
``local_size_bytes`` (spills), ``max_threads_per_block``; a kernel whose block is larger than its registers
allow is ``invalid_config``. The source is written to ``<work_dir>/<kernel>.cu``: the artifact the runner
loads (from the module cache); ``release`` deletes it and ``close`` removes the directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from compiler.backends import get_backend
from compiler.errors import CompileError, ScheduleError
from compiler.fusion import group_from_workload
from compiler.target import Target
from db.status import Status
from tuner.measure import BuildResult, MeasureInput
from tuner.measure.cuda.device import require, use_cupy_module
from tuner.measure.pool import WorkerPool, serve
from tuner.measure.pool_builder import PoolBuilder, task_id

ATTRIBUTES = (
    "num_regs",
    "shared_size_bytes",
    "local_size_bytes",
    "const_size_bytes",
    "max_threads_per_block",
)


def kernel_name(inp: MeasureInput) -> str:
    """The kernel name of a candidate: ``cand_`` and a hash of its workload, sketch, target and config."""
    digest = hashlib.sha256(repr(inp.key).encode()).hexdigest()[:16]
    return f"cand_{digest}"


class LocalBuilder(PoolBuilder):
    """Builds CUDA candidates with NVRTC in ``workers`` processes (default: up to 4, one per core).

    ``timeout_s`` bounds one candidate's scheduling, code generation and compilation. ``cupy_module`` names
    a module the workers import as ``cupy`` (the tests' simulated CuPy); without it, CuPy must be
    installed and a GPU visible (a one-line CudaUnavailable when they are not: compiling for the current
    device and reading the kernels' attributes need it)."""

    kind = "cuda"

    def __init__(
        self,
        workers: int | None = None,
        timeout_s: float = 60.0,
        cupy_module: str | None = None,
        work_dir: str | Path | None = None,
    ) -> None:
        require("building CUDA candidates", cupy_module, gpu=True)  # nvrtc.build needs the device
        self.workers = workers or min(4, len(os.sched_getaffinity(0)))
        self.timeout_s = float(timeout_s)
        self.cupy_module = cupy_module
        super().__init__(work_dir, "kiln-cuda-build-")

    def _compile(self, inputs: Sequence[MeasureInput], valid: list[int]) -> dict[int, BuildResult]:
        return {
            i: self._result(kind, reply) for i, (kind, reply) in zip(valid, self._run_jobs(inputs, valid))
        }

    def _result(self, kind: str, reply: Any) -> BuildResult:
        if kind == "ok" and isinstance(reply, tuple) and reply and reply[0] == "built":
            return BuildResult(**reply[1])
        if kind == "timeout":
            return BuildResult(
                Status.COMPILE_ERROR, f"build timed out ({reply}); the builder worker was killed"
            )
        if kind == "died":
            return BuildResult(Status.COMPILE_ERROR, f"builder worker {reply} while building this candidate")
        detail = reply[1] if isinstance(reply, tuple) and len(reply) > 1 else reply
        return BuildResult(Status.COMPILE_ERROR, f"builder worker error:\n{detail}")

    def _run_jobs(self, inputs: Sequence[MeasureInput], valid: list[int]) -> list[tuple[str, Any]]:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if self._pool is None:
            self._pool = WorkerPool(self.workers, _builder_main, (self.cupy_module,), "kiln-cuda-builder")
            self._pool.start()

        def prepare(w: int, i: int) -> dict[str, Any]:
            task = inputs[i].task
            return {
                "task_id": task_id(task),
                "task": (task.group.canonical(), task.sketch, task.target),
                "config": inputs[i].config,
                "name": kernel_name(inputs[i]),
                "dir": str(self.work_dir),
            }

        return self._pool.run(valid, prepare, [self.timeout_s] * len(valid))

    def release(self, results: Sequence[BuildResult]) -> None:
        for r in results:
            if r.artifact:
                with contextlib.suppress(OSError):
                    Path(r.artifact).unlink()


# ---------------------------------------------------------------------- worker side
def _builder_main(conn: Any, cupy_module: str | None) -> None:
    cp = use_cupy_module(cupy_module)
    get_backend("cuda")  # its sketches, lowering and codegen are imported before announcing readiness
    serve(conn, _BuildWorker(cp).handle)


class _BuildWorker:
    def __init__(self, cp: Any) -> None:
        self.cp = cp
        self.groups: dict[str, Any] = {}

    def handle(self, req: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        canonical, sketch, target = req["task"]
        if req["task_id"] not in self.groups:
            self.groups[req["task_id"]] = group_from_workload(canonical)
        t0 = time.perf_counter()
        fields = build_one(self.cp, self.groups[req["task_id"]], sketch, target, req["config"], req["name"])
        if fields["status"] == Status.OK:
            path = Path(req["dir"]) / f"{req['name']}.cu"
            path.write_text(fields.pop("source"))
            fields["artifact"] = str(path)
        fields.pop("source", None)
        fields["seconds"] = time.perf_counter() - t0
        return "built", fields


def shared_overflow(launches: list[dict[str, Any]], target: Target) -> str:
    """Why a kernel of ``launches`` cannot be launched on ``target`` for its shared memory (the lowered
    tiles, padding and cp.async rings, static + dynamic, over the device's per-block opt-in limit), or "".
    The sketches' checks estimate the tiles before scheduling; lowering can allocate more (a cooperative
    copy rounded up to the block's threads), which only the lowered kernel shows."""
    limit = target.max_shared_bytes_optin
    for info in launches:
        if info["shared_bytes"] > limit:
            return (
                f"kernel {info['name']} needs {info['shared_bytes']} bytes of shared memory per block, "
                f"over the {limit} bytes {target.device} allows (opt-in limit)"
            )
    return ""


def build_one(cp: Any, group: Any, sketch: Any, target: Any, config: Any, name: str) -> dict[str, Any]:
    """Schedule, lower, print and compile one candidate as kernel ``name``; BuildResult fields (and
    ``source``)."""
    from compiler.backends.cuda import nvrtc
    from compiler.backends.cuda.codegen import kernel_launches, kernel_names
    from compiler.backends.cuda.device import device_arch, why_unavailable
    from compiler.backends.cuda.lower import kernel_parts
    from compiler.loopir.stmt import PrimFunc

    backend = get_backend("cuda")
    try:
        func = backend.lower(sketch.build(group, config, target).func)
        func.name = name
        source = backend.codegen([func], target)
        launches = kernel_launches(func)
    except ScheduleError as exc:
        return _fields(Status.INVALID_CONFIG, f"the sketch rejected the config while building: {exc}")
    except Exception as exc:
        return _fields(
            Status.COMPILE_ERROR, f"scheduling/lowering/codegen failed: {type(exc).__name__}: {exc}"
        )
    over = shared_overflow(launches, target)
    if over:  # the driver would refuse the launch (CUDA_ERROR_INVALID_VALUE): not worth compiling
        return _fields(Status.INVALID_CONFIG, over)
    register = getattr(cp, "register_kernels", None)  # a simulated CuPy runs the loop IR of each kernel
    if register is not None:
        parts = kernel_parts(func.body)
        register(
            source,
            {k: PrimFunc(k, func.params, p, func.num_inputs) for k, p in zip(kernel_names(func), parts)},
        )
    arch = device_arch(target)
    try:
        module = nvrtc.build(source, arch)
    except CompileError as exc:
        return _fields(Status.COMPILE_ERROR, str(exc))
    kernels = []
    for info in launches:
        entry = {k: info[k] for k in ("name", "grid", "block", "dynamic_shared_bytes") if k in info}
        entry["grid"], entry["block"] = list(entry["grid"]), list(entry["block"])
        if why_unavailable() is None:  # reading attributes loads the module: it needs a device
            try:
                fn = module.function(info["name"])
                attrs = fn.attributes
                entry.update({k: int(attrs[k]) for k in ATTRIBUTES if k in attrs})
                nvrtc.check_resources(fn, info["name"], info)
            except CompileError as exc:
                return _fields(Status.INVALID_CONFIG, f"launch exceeds the kernel's resources: {exc}")
            except Exception as exc:  # a driver that cannot load the module: the runner will say so
                entry["attributes_error"] = f"{type(exc).__name__}: {exc}"
        kernels.append(entry)
    info = {
        "arch": arch,
        "kernels": kernels,
        "params": [[b.name, list(b.shape), b.dtype] for b in func.params],
        "num_inputs": func.num_inputs,
        "input_layouts": func.attrs.get("input_layouts") or {},
    }
    out = _fields(Status.OK, "", symbol=name, info=info)
    out["source"] = source
    return out


def _fields(
    status: Status, error: str, symbol: str | None = None, info: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {"status": status, "error": error, "artifact": None, "symbol": symbol, "info": info or {}}
