"""LocalRunner of cuda targets: verify and time candidates in a spawned worker that owns the CUDA context.

The parent computes each task's random inputs and numpy reference once
(:func:`tuner.measure.check.task_data`, seeded like the CPU runner's), caches them, and ships them to the
worker (:mod:`tuner.measure.cuda.run_worker`) once per worker life. Each candidate is one request with a
deadline:

- no answer within ``timeout_s`` (a hung kernel) -> the worker is killed -> ``timeout``;
- the worker dies -> ``runtime_error`` naming the signal;
- a CUDA error during a launch (an illegal address poisons the context for good) -> ``runtime_error``, and
  the worker is killed so the next candidate gets a fresh context;
- a launch needing more registers / shared memory than the kernel allows -> ``invalid_config``;
- NaN left in an output, a write into the guard regions or a modified input -> ``runtime_error`` / a
  mismatch with the reference -> ``wrong_result``.

Timing (CUDA events): warm-up launches for ``warmup_ms``, then ``repeats`` samples of back-to-back launches
(as many as make a sample about ``sample_ms``), each latency one sample's mean per launch in microseconds;
for memory-bound tasks (fewer than ``flush_intensity`` flops per byte) the L2 cache is written over before
each sample (twice the target's L2 size) so a kernel is not timed on data left in L2 by the previous sample.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from db.status import Status
from tuner.measure import BuildResult, MeasureInput, RunResult
from tuner.measure.check import signature_problem
from tuner.measure.cuda import run_worker
from tuner.measure.cuda.device import require
from tuner.measure.pool import Worker, WorkerDied, WorkerTimeout
from tuner.measure.worker_runner import WorkerRunner


class LocalRunner(WorkerRunner):
    """Runs CUDA candidates in one spawned worker process; see the module docstring.

    ``cupy_module`` names a module the worker imports as ``cupy`` (the tests' simulated CuPy); without it,
    CuPy and a GPU must be there (a one-line CudaUnavailable at creation when they are not)."""

    def __init__(
        self,
        timeout_s: float = 30.0,
        repeats: int = 5,
        sample_ms: float = 2.0,
        warmup_ms: float = 2.0,
        max_number: int = 1000,
        flush_intensity: float = 16.0,
        seed: int = 0,
        cache_tasks: int = 16,
        cupy_module: str | None = None,
    ) -> None:
        if repeats < 1:
            raise ValueError("need repeats >= 1")
        require("measuring CUDA candidates", cupy_module, gpu=True)
        self.timeout_s = float(timeout_s)
        self.settings = {
            "repeats": int(repeats),
            "sample_ms": float(sample_ms),
            "warmup_ms": float(warmup_ms),
            "max_number": int(max_number),
        }
        self.flush_intensity = float(flush_intensity)
        self.cupy_module = cupy_module
        super().__init__(seed, cache_tasks)
        self.restarts_after_errors = 0

    def _new_worker(self) -> Worker:
        return Worker(run_worker.main, (self.cupy_module,), "kiln-cuda-runner")

    def _call(self, request: tuple[Any, ...], timeout: float) -> Any:
        reply = self.worker.call(request, timeout)
        if isinstance(reply, tuple) and reply and reply[0] == "error":
            raise RuntimeError(f"runner worker error: {reply[1]}")
        return reply

    def run(self, inputs: Sequence[MeasureInput], builds: Sequence[BuildResult]) -> list[RunResult]:
        return [self._run_one(inp, b) for inp, b in zip(inputs, builds)]

    def _run_one(self, inp: MeasureInput, build: BuildResult) -> RunResult:
        t0 = time.perf_counter()

        def result(status: Status, error: str, lat: list[float] | None = None) -> RunResult:
            return RunResult(status, lat, error, time.perf_counter() - t0)

        task = inp.task
        if task.target.kind != "cuda":
            return result(
                Status.RUNTIME_ERROR, f"the CUDA LocalRunner runs cuda kernels, not {task.target.kind}"
            )
        kernels = build.info.get("kernels")
        if build.status != Status.OK or not build.artifact or not kernels:
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
        problem = signature_problem(build.info, data, {p: a for p, (_, a) in layouts.items()})
        if problem:
            return result(Status.RUNTIME_ERROR, problem)
        try:
            self._ensure_loaded(data, layouts)
        except (WorkerDied, WorkerTimeout, RuntimeError) as exc:
            self.worker.kill()
            return result(Status.RUNTIME_ERROR, f"the runner worker failed to load the task: {exc}")
        settings = dict(self.settings)
        intensity = float(task.flops) / max(float(task.bytes), 1.0)
        settings["flush_bytes"] = (
            2 * int(task.target.l2_bytes or 0) if intensity < self.flush_intensity else 0
        )
        keys = {p: k for p, (k, _) in layouts.items()}
        request = ("run", data.key, build.artifact, build.info.get("arch", "sm_90"), kernels, keys, settings)
        try:
            reply = self.worker.call(request, self.timeout_s)
        except WorkerTimeout:
            return result(Status.TIMEOUT, f"did not finish within {self.timeout_s:g} s (worker killed)")
        except WorkerDied as exc:
            return result(Status.RUNTIME_ERROR, f"the kernel crashed the runner worker ({exc})")
        if reply[0] == "error":
            self.worker.kill()
            return result(Status.RUNTIME_ERROR, f"runner worker error:\n{reply[1]}")
        status, lat, error, extra = reply
        if extra.get("restart"):
            self.worker.kill()  # the CUDA context may be poisoned: the next candidate gets a fresh one
            self.restarts_after_errors += 1
        return result(Status(status), error, lat)
