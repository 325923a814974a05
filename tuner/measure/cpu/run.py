"""LocalRunner: verify and time CPU candidates in an isolated worker process.

The parent computes each task's random inputs (seeded by the workload key and ``seed``) and its numpy
reference outputs once, caches them, and ships them to the worker (:mod:`tuner.measure.cpu.run_worker`)
once per worker life. Each candidate is one request with a deadline: no answer in ``timeout_s`` -> the
worker (and its OpenMP threads) is killed -> ``timeout``; the worker dies (segfault, abort) ->
``runtime_error`` naming the signal. Either way the next candidate starts a fresh worker, so nothing a bad
kernel did survives it.

Timing happens in C (:mod:`tuner.measure.cpu.harness`): after the verification run, a warm-up of
``warmup_ms``, then samples of ``number`` back-to-back calls (``number`` chosen so a sample takes about
``min_time_ms / samples``) until ``min_time_ms`` of measured time and at least ``min_repeats`` samples (at
most ``max_repeats``). Each latency is one sample's mean per call, in microseconds. A sample stops early
after four times its planned duration, so a kernel that slows down on a loaded machine (OpenMP threads
waiting for a descheduled sibling) is measured slow rather than timed out. Caches stay warm between calls
(no flush): that is how a kernel runs inside a model whose working set fits the caches.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from db.status import Status
from tuner.measure import BuildResult, MeasureInput, Runner, RunResult
from tuner.measure.check import TaskData, signature_problem, task_data
from tuner.measure.cpu import run_worker
from tuner.measure.cpu.harness import MAX_ARGS, harness_library
from tuner.measure.pool import Worker, WorkerDied, WorkerTimeout


class LocalRunner(Runner):
    """Runs CPU candidates in one spawned worker process; see the module docstring.

    ``num_threads``: OpenMP threads per kernel (default: the task target's cores). ``seed`` varies the
    random inputs of every task. ``timeout_s`` bounds one candidate's verification and timing."""

    def __init__(
        self,
        timeout_s: float = 10.0,
        min_time_ms: float = 20.0,
        min_repeats: int = 3,
        max_repeats: int = 100,
        samples: int = 10,
        warmup_ms: float = 2.0,
        num_threads: int | None = None,
        seed: int = 0,
        cache_tasks: int = 32,
    ) -> None:
        if min_repeats < 1 or max_repeats < min_repeats:
            raise ValueError("need 1 <= min_repeats <= max_repeats")
        self.timeout_s = float(timeout_s)
        self.settings = {
            "min_time_us": float(min_time_ms) * 1e3,
            "min_repeats": int(min_repeats),
            "max_repeats": int(max_repeats),
            "samples": int(samples),
            "warmup_us": float(warmup_ms) * 1e3,
        }
        self.num_threads = num_threads
        self.seed = seed
        self.cache_tasks = cache_tasks
        self._data: OrderedDict[str, TaskData | Exception] = OrderedDict()
        self._worker: Worker | None = None
        self._loaded: OrderedDict[str, set[tuple[int, str]]] = OrderedDict()  # task -> layouts it holds
        self._worker_starts = -1

    @property
    def worker(self) -> Worker:
        if self._worker is None:
            self._worker = Worker(run_worker.main, (str(harness_library()),), "kiln-runner")
        return self._worker

    def _task(self, task: Any) -> TaskData:
        key = task.workload_key
        data = self._data.pop(key, None)
        if data is None:
            try:
                data = task_data(task, self.seed)
            except Exception as exc:
                data = exc
        self._data[key] = data
        while len(self._data) > self.cache_tasks:
            self._data.popitem(last=False)
        if isinstance(data, Exception):
            raise data
        return data

    def _ensure_loaded(self, data: TaskData, layouts: dict[int, tuple[str, np.ndarray]]) -> None:
        w = self.worker
        w.ensure()
        if w.restarts != self._worker_starts:
            self._loaded.clear()
            self._worker_starts = w.restarts
        if data.key in self._loaded:
            self._loaded.move_to_end(data.key)
        else:
            while len(self._loaded) >= self.cache_tasks:
                old, _ = self._loaded.popitem(last=False)
                w.call(("drop", old), 60.0)
            w.call(("task", data.key, data.inputs, data.refs, data.out_names, data.in_names), 120.0)
            self._loaded[data.key] = set()
        held = self._loaded[data.key]
        for pos, (layout_key, array) in layouts.items():
            if (pos, layout_key) not in held:
                w.call(("layout", data.key, pos, layout_key, array), 120.0)
                held.add((pos, layout_key))

    def run(self, inputs: Sequence[MeasureInput], builds: Sequence[BuildResult]) -> list[RunResult]:
        return [self._run_one(inp, b) for inp, b in zip(inputs, builds)]

    def _run_one(self, inp: MeasureInput, build: BuildResult) -> RunResult:
        t0 = time.perf_counter()

        def result(status: Status, error: str, lat: list[float] | None = None) -> RunResult:
            return RunResult(status, lat, error, time.perf_counter() - t0)

        task = inp.task
        if task.target.kind != "cpu":
            return result(Status.RUNTIME_ERROR, f"LocalRunner runs cpu kernels, not {task.target.kind}")
        if build.status != Status.OK or not build.artifact or not build.symbol:
            return result(Status.RUNTIME_ERROR, f"nothing to run (build {build.status}: {build.error})")
        try:
            data = self._task(task)
        except Exception as exc:
            return result(Status.RUNTIME_ERROR, f"the numpy reference of the group failed: {exc}")
        try:
            layouts = {
                int(p): data.relayout(int(p), s) for p, s in build.info.get("input_layouts", {}).items()
            }
        except Exception as exc:
            return result(Status.RUNTIME_ERROR, f"cannot lay out the kernel's inputs as it asks: {exc}")
        problem = _signature_problem(build, data, {p: a for p, (_, a) in layouts.items()})
        if problem:
            return result(Status.RUNTIME_ERROR, problem)
        threads = self.num_threads or task.target.cores or os.cpu_count() or 1
        try:
            self._ensure_loaded(data, layouts)
        except (WorkerDied, WorkerTimeout) as exc:
            return result(Status.RUNTIME_ERROR, f"the runner worker failed to load the task: {exc}")
        keys = {p: k for p, (k, _) in layouts.items()}
        request = ("run", data.key, build.artifact, build.symbol, int(threads), self.settings, keys)
        try:
            reply = self.worker.call(request, self.timeout_s)
        except WorkerTimeout:
            return result(Status.TIMEOUT, f"did not finish within {self.timeout_s:g} s (worker killed)")
        except WorkerDied as exc:
            return result(Status.RUNTIME_ERROR, f"the kernel crashed the runner worker ({exc})")
        status, lat, error = reply[0], reply[1], reply[2]
        if status == "error":
            return result(Status.RUNTIME_ERROR, f"runner worker error:\n{lat}")
        return result(Status(status), error, lat)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
        self._loaded.clear()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def _signature_problem(build: BuildResult, data: TaskData, relaid: dict[int, np.ndarray]) -> str | None:
    params = build.info.get("params")
    if params is not None and len(params) > MAX_ARGS:
        return f"the kernel takes {len(params)} buffers; the timing harness supports {MAX_ARGS}"
    return signature_problem(build.info, data, relaid)
