"""LocalRunner: verify and time CPU candidates in an isolated worker process.

The parent computes each task's random inputs (seeded by the workload key and ``seed``) and its numpy
reference outputs once, caches them, and ships them to the worker (:mod:`tuner.measure.cpu.run_worker`)
once per worker life. Each candidate is one request with a deadline: no answer in ``timeout_s`` -> the
worker (and its pool threads) is killed -> ``timeout``; the worker dies (segfault, abort) ->
``runtime_error`` naming the signal. Either way the next candidate starts a fresh worker, so nothing a bad
kernel did survives it.

Timing happens in C (:mod:`tuner.measure.cpu.harness`): after the verification run, a warm-up of
``warmup_ms``, then samples of ``number`` back-to-back calls (``number`` chosen so a sample takes about
``min_time_ms / samples``) until ``min_time_ms`` of measured time and at least ``min_repeats`` samples (at
most ``max_repeats``). Each latency is one sample's mean per call, in microseconds. A sample stops early
after four times its planned duration, so a kernel that slows down on a loaded machine (pool threads
waiting for a descheduled sibling) is measured slow rather than timed out. Caches stay warm between calls
(no flush): that is how a kernel runs inside a model whose working set fits the caches.

A batch runs under the machine's timing lock (:mod:`tuner.measure.host_lock`), so several tuning workers
on one machine never time candidates at the same moment on its shared cores (their builds may overlap).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from compiler.backends.cpu import gcc
from db.status import Status
from tuner.measure import BuildResult, MeasureInput, RunResult
from tuner.measure.check import TaskData, signature_problem
from tuner.measure.cpu import run_worker
from tuner.measure.cpu.harness import MAX_ARGS, harness_library
from tuner.measure.host_lock import host_timing_lock
from tuner.measure.pool import Worker
from tuner.measure.worker_runner import WorkerRunner


class LocalRunner(WorkerRunner):
    """Runs CPU candidates in one spawned worker process; see the module docstring.

    ``num_threads``: threads per kernel (default: the task target's cores). ``seed`` varies the
    random inputs of every task. ``timeout_s`` bounds one candidate's verification and timing."""

    kind = "cpu"

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
        self.settings = {
            "min_time_us": float(min_time_ms) * 1e3,
            "min_repeats": int(min_repeats),
            "max_repeats": int(max_repeats),
            "samples": int(samples),
            "warmup_us": float(warmup_ms) * 1e3,
        }
        self.num_threads = num_threads
        super().__init__(timeout_s, seed, cache_tasks)

    def run(self, inputs: Sequence[MeasureInput], builds: Sequence[BuildResult]) -> list[RunResult]:
        with host_timing_lock():  # no other worker on this machine times while this batch does
            return super().run(inputs, builds)

    def _new_worker(self) -> Worker:
        return Worker(run_worker.main, (str(harness_library()), str(gcc.pool_runtime_path())), "kiln-runner")

    def _runnable(self, build: BuildResult) -> bool:
        return bool(build.symbol)

    def _signature_problem(
        self, build: BuildResult, data: TaskData, relaid: dict[int, np.ndarray]
    ) -> str | None:
        params = build.info.get("params")
        if params is not None and len(params) > MAX_ARGS:
            return f"the kernel takes {len(params)} buffers; the timing harness supports {MAX_ARGS}"
        return signature_problem(build.info, data, relaid)

    def _request(self, task: Any, build: BuildResult, data: TaskData, keys: dict[int, str]) -> tuple:
        threads = self.num_threads or task.target.cores or os.cpu_count() or 1
        return ("run", data.key, build.artifact, build.symbol, int(threads), self.settings, keys)

    def _interpret(self, reply: Any) -> tuple[Status, str, list[float] | None]:
        status, lat, error = reply[0], reply[1], reply[2]
        if status == "error":
            return Status.RUNTIME_ERROR, f"runner worker error:\n{lat}", None
        return Status(status), error, lat
