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

import os
import time
from collections.abc import Sequence

import numpy as np

from db.status import Status
from tuner.measure import BuildResult, MeasureInput, RunResult
from tuner.measure.check import TaskData, signature_problem
from tuner.measure.cpu import run_worker
from tuner.measure.cpu.harness import MAX_ARGS, harness_library
from tuner.measure.pool import Worker, WorkerDied, WorkerTimeout
from tuner.measure.worker_runner import WorkerRunner


class LocalRunner(WorkerRunner):
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
        super().__init__(seed, cache_tasks)

    def _new_worker(self) -> Worker:
        return Worker(run_worker.main, (str(harness_library()),), "kiln-runner")

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


def _signature_problem(build: BuildResult, data: TaskData, relaid: dict[int, np.ndarray]) -> str | None:
    params = build.info.get("params")
    if params is not None and len(params) > MAX_ARGS:
        return f"the kernel takes {len(params)} buffers; the timing harness supports {MAX_ARGS}"
    return signature_problem(build.info, data, relaid)
