"""LocalBuilder of cpu targets: check, schedule, lower, generate C and compile candidates in a pool of
worker processes.

Throughput: gcc dominates, and a gcc call has a fixed cost (process start, the math prelude) of about
60 ms, so the candidates of a batch are compiled together: the valid ones are cut into chunks of at most
``max_batch`` (at least one chunk per worker), each worker schedules, lowers and prints its chunk as ONE
translation unit (kernels ``cand<i>``) through the cpu backend and runs ONE gcc on it
(:func:`compiler.backends.cpu.gcc.compile_to`). When gcc fails, the kernels that own its error lines
(:func:`compiler.backends.cpu.gcc.errors_by_kernel`) get ``compile_error`` with their own lines and the rest
are compiled again; when the errors cannot be attributed (the prelude, the glue, a timeout), the candidates
are compiled one by one, so a bad candidate never sinks the others. gcc gets ``timeout_s`` for a whole
chunk (a chunk of normal candidates compiles in a few seconds): a candidate that takes gcc past it (about
one in 300-500 in the ONNX nets' search: scalar code with large register tiles) costs the chunk's timeout and
then its own, 2 x ``timeout_s`` instead of (k + 1) x; gcc's whole process group is killed each time.
Chunks of 2 compile 8 candidates in ~30% less gcc time than 8 single calls (50-150 ms of fixed cost per
call), which outweighs the extra timeout of the rare slow candidate.

Workers are spawned once and stay alive between batches; each one keeps the groups it has rebuilt (from
the workload's canonical JSON, so no model weights travel) by task. Timeouts: gcc gets
``timeout_s`` per translation unit (see above); a worker that does not answer within ``timeout_s * (2k +
1)`` for a chunk of k (a hang in scheduling or codegen) is killed and its chunk is retried one candidate at
a time; the candidate that still does not finish is ``compile_error`` ("build timed out").

Artifacts (``.c`` and ``.so``) go to a private temporary directory; ``release`` deletes them after the run
and ``close`` removes the directory.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from compiler.backends import get_backend
from compiler.backends.cpu import gcc
from compiler.errors import CompileError, ScheduleError
from compiler.fusion import group_from_workload
from db.status import Status
from tuner.measure import BuildResult, MeasureInput
from tuner.measure.pool import WorkerPool, serve
from tuner.measure.pool_builder import PoolBuilder, task_id

Codegen = Callable[[Sequence[Any], Any], str]  # (lowered PrimFuncs, target) -> C source


class LocalBuilder(PoolBuilder):
    """Builds CPU candidates with gcc in ``workers`` processes (default: one per available core).

    A batch is cut into at least ``chunks_per_worker`` chunks per worker (smaller chunks balance the
    workers better: compile times of candidates differ by 10x; each chunk costs one more gcc start) and
    chunks hold at most ``max_batch`` kernels. ``codegen`` replaces the cpu backend's ``codegen`` (a
    picklable module-level function ``(funcs, target) -> C source``; tests use it to inject invalid C)."""

    kind = "cpu"

    def __init__(
        self,
        workers: int | None = None,
        timeout_s: float = 30.0,
        max_batch: int = 8,
        chunks_per_worker: int = 2,
        codegen: Codegen | None = None,
        work_dir: str | Path | None = None,
    ) -> None:
        self.workers = workers or len(os.sched_getaffinity(0))
        self.timeout_s = float(timeout_s)
        self.max_batch = max(1, int(max_batch))
        self.chunks_per_worker = max(1, int(chunks_per_worker))
        self.codegen = codegen
        super().__init__(work_dir, "kiln-build-")
        self._batches = 0

    # ------------------------------------------------------------------ parent side
    def _compile(self, inputs: Sequence[MeasureInput], valid: list[int]) -> dict[int, BuildResult]:
        self._batches += 1
        n_chunks = max(
            min(self.workers * self.chunks_per_worker, len(valid)), -(-len(valid) // self.max_batch)
        )
        chunks = [valid[k::n_chunks] for k in range(n_chunks)]
        out: dict[int, BuildResult] = {}
        retry: list[int] = []
        for chunk, (kind, reply) in zip(chunks, self._run_jobs(inputs, chunks)):
            if kind == "ok" and reply[0] == "built":
                out.update({i: BuildResult(**fields) for i, fields in reply[1].items()})
            elif len(chunk) > 1:
                retry.extend(chunk)  # a hang or crash somewhere in the chunk: find it one by one
            else:
                out[chunk[0]] = self._failure(kind, reply)
        if retry:
            singles = [[i] for i in retry]
            for chunk, (kind, reply) in zip(singles, self._run_jobs(inputs, singles)):
                if kind == "ok" and reply[0] == "built":
                    out.update({i: BuildResult(**fields) for i, fields in reply[1].items()})
                else:
                    out[chunk[0]] = self._failure(kind, reply)
        return out

    def _failure(self, kind: str, reply: Any) -> BuildResult:
        if kind == "timeout":
            return BuildResult(
                Status.COMPILE_ERROR, f"build timed out ({reply}); the builder worker was killed"
            )
        if kind == "died":
            return BuildResult(Status.COMPILE_ERROR, f"builder worker {reply} while building this candidate")
        detail = reply[1] if isinstance(reply, tuple) and len(reply) > 1 else reply
        return BuildResult(Status.COMPILE_ERROR, f"builder worker error:\n{detail}")

    def _run_jobs(self, inputs: Sequence[MeasureInput], chunks: list[list[int]]) -> list[tuple[str, Any]]:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if self._pool is None:
            self._pool = WorkerPool(self.workers, _builder_main, (), "kiln-builder")
            self._pool.start()
        pool = self._pool

        def prepare(w: int, chunk: list[int]) -> dict[str, Any]:
            # task definitions travel with every job (a few KB); workers rebuild each group once
            tasks = {}
            items = []
            for i in chunk:
                task = inputs[i].task
                tid = task_id(task)
                if tid not in tasks:
                    tasks[tid] = (task.group.canonical(), task.sketch, task.target)
                items.append((i, tid, inputs[i].config))
            stem = self.work_dir / f"b{self._batches}_{chunk[0]}_{len(chunk)}"
            return {
                "tasks": tasks,
                "items": items,
                "stem": str(stem),
                "timeout": self.timeout_s,
                "codegen": self.codegen,
            }

        timeouts = [self.timeout_s * (2 * len(c) + 1) for c in chunks]
        return pool.run(chunks, prepare, timeouts)

    def release(self, results: Sequence[BuildResult]) -> None:
        for path in {r.artifact for r in results if r.artifact}:
            for p in (Path(path), Path(path).with_suffix(".c")):
                with contextlib.suppress(OSError):
                    p.unlink()


# ---------------------------------------------------------------------- worker side
def _builder_main(conn: Any) -> None:
    get_backend("cpu")  # its sketches, lowering and codegen are imported before announcing readiness
    serve(conn, _BuildWorker().handle)


class _BuildWorker:
    def __init__(self) -> None:
        self.tasks: dict[str, tuple[Any, Any, Any]] = {}

    def handle(self, req: dict[str, Any]) -> tuple[str, dict[int, dict[str, Any]]]:
        for tid, (canonical, sketch, target) in req["tasks"].items():
            if tid not in self.tasks:
                self.tasks[tid] = (group_from_workload(canonical), sketch, target)
        return "built", build_chunk(
            [(i, *self.tasks[tid], config) for i, tid, config in req["items"]],
            req["stem"],
            req["timeout"],
            req["codegen"],
        )


def build_chunk(
    items: list[tuple[int, Any, Any, Any, Any]], stem: str, timeout: float, codegen: Codegen | None = None
) -> dict[int, dict[str, Any]]:
    """Schedule, lower, print and compile ``items`` = [(index, group, sketch, target, config)] as one
    translation unit ``stem.c`` -> ``stem.so``; returns BuildResult fields by index."""
    backend = get_backend("cpu")
    gen = codegen or backend.codegen
    out: dict[int, dict[str, Any]] = {}
    funcs: dict[int, Any] = {}
    target = None
    spent: dict[int, float] = {}
    for i, group, sketch, tgt, config in items:
        t0 = time.perf_counter()
        target = tgt
        try:
            func = backend.lower(sketch.build(group, config, tgt).func)
            func.name = f"cand{i}"
            funcs[i] = func
        except ScheduleError as exc:
            out[i] = _fields(Status.INVALID_CONFIG, f"the sketch rejected the config while building: {exc}")
        except Exception as exc:
            out[i] = _fields(Status.COMPILE_ERROR, f"scheduling/lowering failed: {type(exc).__name__}: {exc}")
        spent[i] = time.perf_counter() - t0
    attempt = 0
    while funcs:
        t0 = time.perf_counter()
        try:
            source = gen(list(funcs.values()), target)
        except Exception:
            source = None
        if source is not None:
            so = f"{stem}_{attempt}.so"
            attempt += 1
            # the chunk gets ONE candidate's timeout, not one per kernel: a candidate that takes gcc past it
            # (scalar code with large register tiles) then costs the chunk's timeout and its own single
            # retry, not k timeouts first; the others compile in the one-by-one retry below
            error = _gcc(source, so, timeout)
            _charge(spent, funcs, time.perf_counter() - t0)
            if error is None:
                for i, f in funcs.items():
                    out[i] = _ok(so, f)
                break
            blamed = (
                blame(source, error, {f.name: i for i, f in funcs.items()})
                if len(funcs) > 1
                else {i: error for i in funcs}
            )
            if blamed:
                for i, msg in blamed.items():
                    out[i] = _fields(Status.COMPILE_ERROR, msg)
                    funcs.pop(i)
                continue
        # code generation failed for the batch, or gcc's errors belong to nobody in particular
        for i, f in funcs.items():
            t0 = time.perf_counter()
            so = f"{stem}_s{i}.so"
            try:
                error = _gcc(gen([f], target), so, timeout)
            except Exception as exc:
                error = f"code generation failed: {type(exc).__name__}: {exc}"
            out[i] = _ok(so, f) if error is None else _fields(Status.COMPILE_ERROR, error)
            spent[i] += time.perf_counter() - t0
        break
    for i in out:
        out[i]["seconds"] = spent.get(i, 0.0)
    return out


def _charge(spent: dict[int, float], funcs: dict[int, Any], seconds: float) -> None:
    for i in funcs:
        spent[i] += seconds / len(funcs)


def _ok(so: str, f: Any) -> dict[str, Any]:
    params = [[b.name, list(b.shape), b.dtype] for b in f.params]
    info = {"params": params, "num_inputs": f.num_inputs, "input_layouts": f.attrs.get("input_layouts") or {}}
    return _fields(Status.OK, "", so, f.name, info=info)


def _fields(
    status: Status,
    error: str,
    artifact: str | None = None,
    symbol: str | None = None,
    info: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {"status": status, "error": error, "artifact": artifact, "symbol": symbol, "info": info or {}}


def _gcc(source: str, so: str, timeout: float) -> str | None:
    """Compile ``source`` into ``so``; None, or gcc's error message (a timeout included)."""
    try:
        gcc.compile_to(source, so, timeout)
    except CompileError as exc:
        return str(exc)
    return None


def blame(source: str, message: str, names: dict[str, int]) -> dict[int, str]:
    """Which candidates (kernel name -> index in ``names``) own the error lines of gcc's ``message`` for
    ``source``, each with a message of its own lines; {} when some error belongs to no candidate (the
    prelude, the glue) or none has a line number (a timeout)."""
    by_kernel = gcc.errors_by_kernel(source, message)
    if any(name not in names for name in by_kernel):
        return {}
    return {names[name]: msg for name, msg in by_kernel.items()}
