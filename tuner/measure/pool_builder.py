"""The part every local builder shares: candidates are compiled by a pool of worker processes into a work
directory of the builder's own (removed on close unless the caller gave it), and a task is named in the
workers by an id that changes whenever anything that shapes its code does."""

from __future__ import annotations

import shutil
import tempfile
import time
from abc import abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from db.status import Status
from tuner.measure import Builder, BuildResult, MeasureInput
from tuner.measure.pool import WorkerPool
from tuner.space import config_json


class PoolBuilder(Builder):
    """A :class:`~tuner.measure.Builder` with a worker pool (``self._pool``, started by the subclass) and
    a work directory (``work_dir``, or a new temporary one named ``prefix...``).

    ``build`` screens every candidate the same way for every backend (a task of another target kind is a
    compile error, a config that fails the sketch's check is ``invalid_config`` and costs no build) and
    hands the rest to the subclass's ``_compile(inputs, valid) -> {index: BuildResult}``."""

    kind: str = ""

    def __init__(self, work_dir: str | Path | None, prefix: str) -> None:
        self._own_dir = work_dir is None
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix=prefix))
        self._pool: WorkerPool | None = None

    @abstractmethod
    def _compile(self, inputs: Sequence[MeasureInput], valid: list[int]) -> dict[int, BuildResult]: ...

    def build(self, inputs: Sequence[MeasureInput]) -> list[BuildResult]:
        results: list[BuildResult | None] = [None] * len(inputs)
        valid: list[int] = []
        for i, inp in enumerate(inputs):
            t0 = time.perf_counter()
            if inp.task.target.kind != self.kind:
                results[i] = BuildResult(
                    Status.COMPILE_ERROR,
                    f"the {self.kind} LocalBuilder builds {self.kind} targets, not {inp.task.target.kind}",
                )
                continue
            try:
                inp.task.check(inp.config)
                config_json(inp.config)
            except Exception as exc:  # ScheduleError, or a config that is not even a dict
                results[i] = BuildResult(Status.INVALID_CONFIG, str(exc), seconds=time.perf_counter() - t0)
                continue
            valid.append(i)
        if valid:
            for i, r in self._compile(inputs, valid).items():
                results[i] = r
        return [r if r is not None else BuildResult(Status.COMPILE_ERROR, "not built") for r in results]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._own_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def __del__(self) -> None:
        # at interpreter exit module globals (contextlib included) may already be gone: plain try/except
        try:  # noqa: SIM105
            self.close()
        except Exception:
            pass


def task_id(task: Any) -> str:
    """The identity of a task inside the build workers: workload, sketch class, name and version, target."""
    s = task.sketch
    cls = f"{type(s).__module__}.{type(s).__qualname__}"
    return f"{task.workload_key}/{cls}/{s.name}/{s.version}/{task.target.key}"
