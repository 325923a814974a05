"""The part every local builder shares: candidates are compiled by a pool of worker processes into a work
directory of the builder's own (removed on close unless the caller gave it), and a task is named in the
workers by an id that changes whenever anything that shapes its code does."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tuner.measure import Builder
from tuner.measure.pool import WorkerPool


class PoolBuilder(Builder):
    """A :class:`~tuner.measure.Builder` with a worker pool (``self._pool``, started by the subclass) and
    a work directory (``work_dir``, or a new temporary one named ``prefix...``)."""

    def __init__(self, work_dir: str | Path | None, prefix: str) -> None:
        self._own_dir = work_dir is None
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix=prefix))
        self._pool: WorkerPool | None = None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._own_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def task_id(task: Any) -> str:
    """The identity of a task inside the build workers: workload, sketch class, name and version, target."""
    s = task.sketch
    cls = f"{type(s).__module__}.{type(s).__qualname__}"
    return f"{task.workload_key}/{cls}/{s.name}/{s.version}/{task.target.key}"
