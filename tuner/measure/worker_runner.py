"""The part every local runner shares: candidates run in one worker process that holds each task's
inputs and reference outputs, so a task's data is computed once in the parent (cached, least recently
used first out) and shipped to the worker once per worker life, with the re-laid-out inputs (packed
weights) a candidate asks for. Each backend's runner (``tuner.measure.<kind>.run``) says how its worker
starts and how it verifies and times one candidate."""

from __future__ import annotations

import contextlib
from abc import abstractmethod
from collections import OrderedDict
from typing import Any

import numpy as np

from tuner.measure import Runner
from tuner.measure.check import TaskData, task_data
from tuner.measure.pool import Worker


class WorkerRunner(Runner):
    """A :class:`~tuner.measure.Runner` over one worker process holding up to ``cache_tasks`` tasks.

    Subclasses give ``_new_worker()`` and may override ``_call`` (e.g. to turn a worker's error reply into
    an exception). Worker messages: ``("task", key, inputs, refs, out_names, in_names)``, ``("drop", key)``,
    ``("layout", key, position, layout_key, array)``."""

    def __init__(self, seed: int = 0, cache_tasks: int = 16) -> None:
        self.seed = seed
        self.cache_tasks = cache_tasks
        self._data: OrderedDict[str, TaskData | Exception] = OrderedDict()
        self._worker: Worker | None = None
        self._loaded: OrderedDict[str, set[tuple[int, str]]] = OrderedDict()  # task -> layouts it holds
        self._worker_starts = -1

    @abstractmethod
    def _new_worker(self) -> Worker: ...

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
        with contextlib.suppress(Exception):
            self.close()
