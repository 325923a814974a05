"""The CPU runner's worker process: loads built libraries, verifies and times candidates.

Its own work needs only numpy and ctypes, and it owns nothing from the parent but what arrives over the
pipe (file paths and arrays). Requests:

``("task", key, inputs, refs, out_names, in_names)``
    Keep a task's random inputs (64-byte aligned copies) and numpy reference outputs; output buffers are
    allocated once per task, each inside a slab with a canary region of ``GUARD`` bytes before and after.
``("layout", key, position, layout_key, array)``
    Keep input ``position`` of a task in another layout (pre-packed weights a kernel asks for).
``("drop", key)``
    Forget a task.
``("run", key, library, symbol, threads, settings, layouts)``
    Poison the outputs (quiet NaN with a payload, or 0xA5 bytes for other dtypes), refill the guards, run the
    kernel once through the C harness, then check: guards intact (else ``runtime_error`` naming the buffer
    and how many bytes were written outside it), inputs unchanged, outputs match the reference (else
    ``wrong_result`` with the largest error and where). Only then time it: warm-up, then samples of ``number``
    calls until ``min_time_us`` of measured time and at least ``min_repeats`` samples. Replies
    ``(status, latencies_us, error, info)``.
"""

from __future__ import annotations

import _ctypes
import contextlib
import ctypes
import math
from collections import OrderedDict
from typing import Any

import numpy as np

from tuner.measure.check import CANARY, GUARD, POISON, RTOL, compare  # noqa: F401 (re-exported)
from tuner.measure.pool import serve

MAX_LIBRARIES = 16  # libraries kept loaded; older ones are closed


def main(conn: Any, harness: str, pool_runtime: str) -> None:
    """Serve requests; ``pool_runtime`` is the thread pool's runtime library, loaded ``RTLD_GLOBAL``
    before any kernel library (they call into it: one pool for every library this worker loads)."""
    ctypes.CDLL(pool_runtime, mode=ctypes.RTLD_GLOBAL)
    serve(conn, _RunWorker(harness).handle)


class _Output:
    def __init__(self, name: str, ref: np.ndarray) -> None:
        self.name, self.ref = name, ref
        nbytes = max(ref.nbytes, ref.dtype.itemsize)
        padded = -(-nbytes // 64) * 64
        self.raw = np.empty(GUARD + padded + GUARD + 64, np.uint8)
        base = (-self.raw.ctypes.data) % 64
        self.before = self.raw[base : base + GUARD]
        self.data = self.raw[base + GUARD : base + GUARD + nbytes]
        self.after = self.raw[base + GUARD + nbytes : base + 2 * GUARD + nbytes]
        self.array = self.data.view(ref.dtype)[: max(ref.size, 1)].reshape(ref.shape)

    def poison(self) -> None:
        self.before.fill(CANARY)
        self.after.fill(CANARY)
        value = POISON.get(self.ref.dtype.name)
        if value is not None:
            self.array.fill(value)
        else:
            self.data.fill(CANARY)

    def guard_problem(self) -> str | None:
        for region, where in ((self.before, "before"), (self.after, "after")):
            bad = np.flatnonzero(region != CANARY)
            if bad.size:
                span = GUARD - int(bad[0]) if where == "before" else int(bad[-1]) + 1
                return (
                    f"out-of-bounds write: the kernel wrote {bad.size} byte(s) within {span} bytes {where} "
                    f"output buffer '{self.name}' ({self.ref.dtype.name}{list(self.ref.shape)})"
                )
        return None


class _Task:
    def __init__(
        self, inputs: list[np.ndarray], refs: list[np.ndarray], out_names: list[str], in_names: list[str]
    ):
        self.inputs = [(_aligned(a), a.copy()) for a in inputs]  # (the kernel's copy, a pristine one)
        self.relaid: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = {}
        self.in_names = in_names
        self.outputs = [_Output(n, r) for n, r in zip(out_names, refs)]

    def arrays(self, layouts: dict[int, str]) -> list[tuple[np.ndarray, np.ndarray]]:
        return [self.relaid[(k, layouts[k])] if k in layouts else a for k, a in enumerate(self.inputs)]

    def args(self, inputs: list[tuple[np.ndarray, np.ndarray]]) -> Any:
        ptrs = [a.ctypes.data for a, _ in inputs] + [o.array.ctypes.data for o in self.outputs]
        return (ctypes.c_void_p * len(ptrs))(*ptrs)


def _aligned(a: np.ndarray) -> np.ndarray:
    raw = np.empty(a.nbytes + 64, np.uint8)
    base = (-raw.ctypes.data) % 64
    out = raw[base : base + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


class _RunWorker:
    def __init__(self, harness: str) -> None:
        h = self.h = ctypes.CDLL(harness)
        vp, i, d = ctypes.c_void_p, ctypes.c_int, ctypes.c_double
        h.kiln_harness_warmup.argtypes = [vp, i, vp, d, ctypes.c_long]
        h.kiln_harness_warmup.restype = d
        h.kiln_harness_time.argtypes = [vp, i, vp, ctypes.c_long, i, i, d, d, vp]
        h.kiln_harness_time.restype = i
        self.tasks: dict[str, _Task] = {}
        self.libs: OrderedDict[str, ctypes.CDLL] = OrderedDict()
        self.threads: dict[str, int] = {}  # library path -> threads set in it

    def handle(self, req: tuple[Any, ...]) -> Any:
        kind = req[0]
        if kind == "task":
            _, key, inputs, refs, out_names, in_names = req
            self.tasks[key] = _Task(inputs, refs, out_names, in_names)
            return ("loaded", key)
        if kind == "layout":
            _, key, pos, layout_key, array = req
            self.tasks[key].relaid[(int(pos), layout_key)] = (_aligned(array), array.copy())
            return ("loaded", key)
        if kind == "drop":
            self.tasks.pop(req[1], None)
            return ("dropped", req[1])
        if kind == "run":
            return self.run(*req[1:])
        return ("error", f"unknown request {kind!r}")

    def _function(self, path: str, symbol: str, threads: int) -> int:
        """The kernel's address in the library at ``path`` (loaded once; the least recently used of more
        than MAX_LIBRARIES is closed), with the library's parallel loops set to ``threads`` threads."""
        lib = self.libs.pop(path, None)
        if lib is None:
            lib = ctypes.CDLL(path)
            while len(self.libs) >= MAX_LIBRARIES:
                old_path, old = self.libs.popitem(last=False)
                self.threads.pop(old_path, None)
                _dlclose(old)  # no loop of it is running: the pool's workers never run its code again
        self.libs[path] = lib
        fn = ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value or 0
        if self.threads.get(path) != threads and hasattr(lib, "kiln_set_num_threads"):
            lib.kiln_set_num_threads.argtypes = [ctypes.c_int]
            lib.kiln_set_num_threads.restype = None
            lib.kiln_set_num_threads(threads)
            self.threads[path] = threads
        return fn

    def run(
        self,
        key: str,
        path: str,
        symbol: str,
        threads: int,
        settings: dict[str, Any],
        layouts: dict[int, str],
    ) -> tuple[Any, ...]:
        task = self.tasks[key]
        inputs = task.arrays(layouts)
        args, nargs = task.args(inputs), len(inputs) + len(task.outputs)
        try:
            fn = self._function(path, symbol, int(threads))
        except (OSError, AttributeError) as exc:
            return ("runtime_error", None, f"cannot load kernel {symbol!r} from {path}: {exc}", {})
        for o in task.outputs:
            o.poison()
        out = (ctypes.c_double * max(1, int(settings["max_repeats"])))()
        self.h.kiln_harness_time(fn, nargs, args, 1, 1, 1, 0.0, 0.0, out)
        problem = self._check(task, inputs)
        if problem is not None:
            return problem
        est = self.h.kiln_harness_warmup(fn, nargs, args, float(settings["warmup_us"]), 1 << 30)
        sample_us = settings["min_time_us"] / max(1, settings["samples"])
        number = max(1, math.ceil(sample_us / max(est, 1e-3)))
        n = self.h.kiln_harness_time(
            fn,
            nargs,
            args,
            number,
            int(settings["min_repeats"]),
            int(settings["max_repeats"]),
            float(settings["min_time_us"]),
            4.0 * sample_us,
            out,
        )
        for o in task.outputs:
            msg = o.guard_problem()
            if msg is not None:
                return ("runtime_error", None, msg + " (while timing)", {})
        return ("ok", [float(x) for x in out[:n]], "", {"number": number, "estimate_us": est})

    def _check(self, task: _Task, inputs: list[tuple[np.ndarray, np.ndarray]]) -> tuple[Any, ...] | None:
        for o in task.outputs:
            msg = o.guard_problem()
            if msg is not None:
                return ("runtime_error", None, msg, {})
        for name, (a, p) in zip(task.in_names, inputs):
            if not np.array_equal(a.reshape(-1).view(np.uint8), p.reshape(-1).view(np.uint8)):
                return ("runtime_error", None, f"the kernel modified its input '{name}'", {})
        for o in task.outputs:
            msg = compare(o.array, o.ref, o.name)
            if msg is not None:
                return ("wrong_result", None, msg, {})
        return None


def _dlclose(lib: ctypes.CDLL) -> None:
    with contextlib.suppress(AttributeError, OSError):
        _ctypes.dlclose(lib._handle)  # type: ignore[attr-defined]
