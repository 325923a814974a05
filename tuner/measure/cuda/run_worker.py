"""The CUDA runner's worker process: owns the CUDA context, verifies and times candidates with CuPy.

Requests (one reply each):

``("task", key, inputs, refs, out_names, in_names)``
    Upload a task's random inputs (kept, with host copies to check they are not modified) and keep its
    numpy reference outputs; each output lives inside a device slab with ``GUARD`` canary bytes before and
    after it.
``("layout", key, position, layout_key, array)``
    Upload input ``position`` of a task in another layout (pre-packed weights a kernel asks for).
``("drop", key)``
    Forget a task.
``("run", key, source_path, arch, kernels, layouts, settings)``
    Load the module (NVRTC, from the module cache), check each kernel's resources against its launch
    (``invalid_config``), poison the outputs with NaN, refill the guards, launch once and synchronize, then
    check the guards, the inputs and the outputs against the reference (``runtime_error`` /
    ``wrong_result``). Only then time: warm-up launches for ``warmup_ms``, then ``repeats`` samples of
    ``number`` back-to-back launches between two CUDA events (``number`` chosen so a sample takes about
    ``sample_ms``), the L2 cache written over before each sample when ``flush_l2``. Replies ``(status,
    latencies_us, error, extra)``; ``extra["restart"]`` says the context may be poisoned (a CUDA error
    during a launch: an illegal address is sticky), so the parent kills this process.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from tuner.measure.check import CANARY, GUARD, POISON, compare
from tuner.measure.cuda.device import use_cupy_module
from tuner.measure.pool import serve


def main(conn: Any, cupy_module: str | None) -> None:
    cp = use_cupy_module(cupy_module)
    serve(conn, _RunWorker(cp).handle)


class _Output:
    def __init__(self, cp: Any, name: str, ref: np.ndarray) -> None:
        self.name, self.ref = name, ref
        nbytes = max(ref.nbytes, ref.dtype.itemsize)
        padded = -(-nbytes // 256) * 256
        self.slab = cp.empty(GUARD + padded + GUARD, dtype=np.uint8)
        self.before = self.slab[:GUARD]
        self.after = self.slab[GUARD + nbytes : GUARD + nbytes + GUARD]
        self.array = self.slab[GUARD : GUARD + nbytes].view(ref.dtype)[: max(ref.size, 1)].reshape(ref.shape)

    def poison(self) -> None:
        self.before.fill(CANARY)
        self.after.fill(CANARY)
        value = POISON.get(self.ref.dtype.name)
        if value is not None:
            self.array.fill(value)
        else:
            self.slab[GUARD : GUARD + self.ref.nbytes].fill(CANARY)

    def guard_problem(self) -> str | None:
        for region, where in ((self.before, "before"), (self.after, "after")):
            host = np.asarray(region.get())
            bad = np.flatnonzero(host != CANARY)
            if bad.size:
                span = GUARD - int(bad[0]) if where == "before" else int(bad[-1]) + 1
                return (
                    f"out-of-bounds write: the kernel wrote {bad.size} byte(s) within {span} bytes {where} "
                    f"output buffer '{self.name}' ({self.ref.dtype.name}{list(self.ref.shape)})"
                )
        return None


class _Task:
    def __init__(self, cp: Any, inputs: list[np.ndarray], refs: list[np.ndarray], out_names, in_names):
        self.inputs = [(cp.asarray(a), a) for a in inputs]  # (device copy, pristine host copy)
        self.relaid: dict[tuple[int, str], tuple[Any, np.ndarray]] = {}
        self.in_names = list(in_names)
        self.outputs = [_Output(cp, n, r) for n, r in zip(out_names, refs)]

    def arrays(self, layouts: dict[int, str]) -> list[tuple[Any, np.ndarray]]:
        return [self.relaid[(k, layouts[k])] if k in layouts else a for k, a in enumerate(self.inputs)]


class _RunWorker:
    def __init__(self, cp: Any) -> None:
        self.cp = cp
        self.tasks: dict[str, _Task] = {}
        self.scratch: Any = None

    def handle(self, req: tuple[Any, ...]) -> Any:
        kind = req[0]
        if kind == "task":
            _, key, inputs, refs, out_names, in_names = req
            self.tasks[key] = _Task(self.cp, inputs, refs, out_names, in_names)
            return ("loaded", key)
        if kind == "layout":
            _, key, pos, layout_key, array = req
            self.tasks[key].relaid[(int(pos), layout_key)] = (self.cp.asarray(array), array.copy())
            return ("loaded", key)
        if kind == "drop":
            self.tasks.pop(req[1], None)
            return ("dropped", req[1])
        if kind == "run":
            return self.run(*req[1:])
        return ("error", f"unknown request {kind!r}")

    def run(
        self,
        key: str,
        source_path: str,
        arch: str,
        kernels: list[dict[str, Any]],
        layouts: dict[int, str],
        settings: dict[str, Any],
    ) -> tuple[Any, ...]:
        from compiler.backends.cuda import nvrtc
        from compiler.errors import CompileError

        cp = self.cp
        task = self.tasks[key]
        inputs = task.arrays(layouts)
        try:
            with open(source_path) as f:
                source = f.read()
            module = nvrtc.build(source, arch)
            fns = [(module.function(k["name"]), k) for k in kernels]
        except Exception as exc:
            return ("runtime_error", None, f"cannot load the built module: {type(exc).__name__}: {exc}", {})
        try:
            for fn, k in fns:
                nvrtc.prepare_kernel(fn, k["name"], k)
        except CompileError as exc:
            return ("invalid_config", None, f"launch exceeds the kernel's resources: {exc}", {})
        except Exception as exc:
            return ("runtime_error", None, f"cannot prepare the kernel: {type(exc).__name__}: {exc}", {})
        args = tuple(a for a, _ in inputs) + tuple(o.array for o in task.outputs)

        def launch() -> None:
            for fn, k in fns:
                nvrtc.launch(fn, k, args)

        stage = "the verification run"
        try:
            for o in task.outputs:
                o.poison()
            launch()
            cp.cuda.Device().synchronize()
            problem = self._check(task, inputs, bool(settings.get("tf32")))
            if problem is not None:
                return problem
            stage = "timing"
            lat, number = self._time(launch, settings)
            for o in task.outputs:
                msg = o.guard_problem()
                if msg is not None:
                    return ("runtime_error", None, msg + " (while timing)", {})
        except Exception as exc:  # a CUDA error: the context may be poisoned (sticky), so this process goes
            return (
                "runtime_error",
                None,
                f"CUDA error during {stage}: {type(exc).__name__}: {exc}",
                {"restart": True},
            )
        return ("ok", lat, "", {"number": number, "pid": os.getpid()})

    def _time(self, launch: Any, settings: dict[str, Any]) -> tuple[list[float], int]:
        cp = self.cp
        stream = cp.cuda.get_current_stream()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        calls, spent_ms = 0, 0.0
        start.record(stream)
        while calls < 1 or spent_ms < settings["warmup_ms"]:
            launch()
            calls += 1
            end.record(stream)
            end.synchronize()
            spent_ms = cp.cuda.get_elapsed_time(start, end)
        per_call_ms = max(spent_ms / calls, 1e-4)
        number = max(1, min(int(settings["max_number"]), math.ceil(settings["sample_ms"] / per_call_ms)))
        flush_bytes = int(settings.get("flush_bytes") or 0)
        if flush_bytes and (self.scratch is None or self.scratch.size != flush_bytes):
            self.scratch = cp.empty(flush_bytes, dtype=np.uint8)
        lat = []
        for r in range(int(settings["repeats"])):
            if flush_bytes:
                self.scratch.fill(r & 0xFF)
            start.record(stream)
            for _ in range(number):
                launch()
            end.record(stream)
            end.synchronize()
            lat.append(cp.cuda.get_elapsed_time(start, end) * 1e3 / number)
        return lat, number

    def _check(
        self, task: _Task, inputs: list[tuple[Any, np.ndarray]], tf32: bool = False
    ) -> tuple[Any, ...] | None:
        for o in task.outputs:
            msg = o.guard_problem()
            if msg is not None:
                return ("runtime_error", None, msg, {})
        for name, (dev, host) in zip(task.in_names, inputs):
            now = np.asarray(dev.get())
            if not np.array_equal(now.reshape(-1).view(np.uint8), host.reshape(-1).view(np.uint8)):
                return ("runtime_error", None, f"the kernel modified its input '{name}'", {})
        for o in task.outputs:
            msg = compare(np.asarray(o.array.get()), o.ref, o.name, tf32)
            if msg is not None:
                return ("wrong_result", None, msg, {})
        return None
