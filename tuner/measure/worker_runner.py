"""The part every local runner shares: candidates run in one worker process that holds each task's
inputs and reference outputs, so a task's data is computed once in the parent (cached, least recently
used first out) and shipped to the worker once per worker life, with the re-laid-out inputs (packed
weights) a candidate asks for. Each backend's runner (``tuner.measure.<kind>.run``) says how its worker
starts, which builds it can run, the request that verifies and times one candidate, and what the
worker's reply means; the checks before (task data, input layouts, the kernel's signature, loading the task)
and the statuses of a hung or crashed worker are the same for every backend."""

from __future__ import annotations

import time
from abc import abstractmethod
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from db.status import Status
from tuner.measure import BuildResult, MeasureInput, Runner, RunResult
from tuner.measure.check import TaskData, task_data
from tuner.measure.pool import Worker, WorkerDied, WorkerTimeout


class WorkerRunner(Runner):
    """A :class:`~tuner.measure.Runner` over one worker process holding up to ``cache_tasks`` tasks.

    Subclasses set ``kind`` (the target kind they run) and give ``_new_worker()``, ``_runnable(build)``,
    ``_signature_problem(build, data, relaid)``, ``_request(task, build, data, layout_keys)`` and
    ``_interpret(reply) -> (status, error, latencies)``; they may override ``_call`` (e.g. to turn a worker's
    error reply into an exception). Worker messages: ``("task", key, inputs, refs, out_names, in_names)``,
    ``("drop", key)``, ``("layout", key, position, layout_key, array)`` and the subclass's run request."""

    kind: str = ""

    def __init__(self, timeout_s: float, seed: int = 0, cache_tasks: int = 16) -> None:
        self.timeout_s = float(timeout_s)
        self.seed = seed
        self.cache_tasks = cache_tasks
        self._data: OrderedDict[str, TaskData | Exception] = OrderedDict()
        self._worker: Worker | None = None
        self._loaded: OrderedDict[str, set[tuple[int, str]]] = OrderedDict()  # task -> layouts it holds
        self._worker_starts = -1

    @abstractmethod
    def _new_worker(self) -> Worker: ...

    @abstractmethod
    def _runnable(self, build: BuildResult) -> bool:
        """Whether an ``ok`` build carries what this runner needs (entry point, kernels)."""

    @abstractmethod
    def _signature_problem(
        self, build: BuildResult, data: TaskData, relaid: dict[int, np.ndarray]
    ) -> str | None:
        """Why the built kernel cannot take the task's arrays (None when it can)."""

    @abstractmethod
    def _request(self, task: Any, build: BuildResult, data: TaskData, keys: dict[int, str]) -> tuple:
        """The worker request that verifies and times one candidate."""

    @abstractmethod
    def _interpret(self, reply: Any) -> tuple[Status, str, list[float] | None]:
        """(status, error, latencies in us) of the worker's reply to a run request."""

    def run(self, inputs: Sequence[MeasureInput], builds: Sequence[BuildResult]) -> list[RunResult]:
        return [self._run_one(inp, b) for inp, b in zip(inputs, builds)]

    def _run_one(self, inp: MeasureInput, build: BuildResult) -> RunResult:
        t0 = time.perf_counter()

        def result(status: Status, error: str, lat: list[float] | None = None) -> RunResult:
            return RunResult(status, lat, error, time.perf_counter() - t0)

        task = inp.task
        if task.target.kind != self.kind:
            return result(
                Status.RUNTIME_ERROR,
                f"the {self.kind} LocalRunner runs {self.kind} kernels, not {task.target.kind}",
            )
        if build.status != Status.OK or not build.artifact or not self._runnable(build):
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
        problem = self._signature_problem(build, data, {p: a for p, (_, a) in layouts.items()})
        if problem:
            return result(Status.RUNTIME_ERROR, problem)
        try:
            self._ensure_loaded(data, layouts)
        except (WorkerDied, WorkerTimeout, RuntimeError) as exc:
            self.worker.kill()
            return result(Status.RUNTIME_ERROR, f"the runner worker failed to load the task: {exc}")
        keys = {p: k for p, (k, _) in layouts.items()}
        try:
            reply = self.worker.call(self._request(task, build, data, keys), self.timeout_s)
        except WorkerTimeout:
            return result(Status.TIMEOUT, f"did not finish within {self.timeout_s:g} s (worker killed)")
        except WorkerDied as exc:
            return result(Status.RUNTIME_ERROR, f"the kernel crashed the runner worker ({exc})")
        status, error, lat = self._interpret(reply)
        return result(status, error, lat)

    @property
    def worker(self) -> Worker:
        if self._worker is None:
            self._worker = self._new_worker()
        return self._worker

    def _call(self, request: tuple[Any, ...], timeout: float) -> Any:
        return self.worker.call(request, timeout)

    def _task(self, task: Any) -> TaskData:
        """The task's inputs and reference (computed once; a failure to compute them is cached too)."""
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
        """Make sure the (possibly restarted) worker holds the task and the re-laid-out inputs."""
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
                self._call(("drop", old), 60.0)
            self._call(("task", data.key, data.inputs, data.refs, data.out_names, data.in_names), 120.0)
            self._loaded[data.key] = set()
        held = self._loaded[data.key]
        for pos, (layout_key, array) in layouts.items():
            if (pos, layout_key) not in held:
                self._call(("layout", data.key, pos, layout_key, array), 120.0)
                held.add((pos, layout_key))

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
        self._loaded.clear()

    def __del__(self) -> None:
        # at interpreter exit module globals (contextlib included) may already be gone: plain try/except
        try:  # noqa: SIM105
            self.close()
        except Exception:
            pass
