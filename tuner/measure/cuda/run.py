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

from typing import Any

import numpy as np

from db.status import Status
from tuner.measure import BuildResult
from tuner.measure.check import TaskData, signature_problem
from tuner.measure.cuda import run_worker
from tuner.measure.cuda.device import require
from tuner.measure.pool import Worker
from tuner.measure.worker_runner import WorkerRunner


class LocalRunner(WorkerRunner):
    """Runs CUDA candidates in one spawned worker process; see the module docstring.

    ``cupy_module`` names a module the worker imports as ``cupy`` (the tests' simulated CuPy); without it,
    CuPy and a GPU must be there (a one-line CudaUnavailable at creation when they are not)."""

    kind = "cuda"

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
        self.settings = {
            "repeats": int(repeats),
            "sample_ms": float(sample_ms),
            "warmup_ms": float(warmup_ms),
            "max_number": int(max_number),
        }
        self.flush_intensity = float(flush_intensity)
        self.cupy_module = cupy_module
        super().__init__(timeout_s, seed, cache_tasks)
        self.restarts_after_errors = 0

    def _new_worker(self) -> Worker:
        return Worker(run_worker.main, (self.cupy_module,), "kiln-cuda-runner")

    def _call(self, request: tuple[Any, ...], timeout: float) -> Any:
        reply = self.worker.call(request, timeout)
        if isinstance(reply, tuple) and reply and reply[0] == "error":
            raise RuntimeError(f"runner worker error: {reply[1]}")
        return reply

    def _runnable(self, build: BuildResult) -> bool:
        return bool(build.info.get("kernels"))

    def _signature_problem(
        self, build: BuildResult, data: TaskData, relaid: dict[int, np.ndarray]
    ) -> str | None:
        return signature_problem(build.info, data, relaid)

    def _request(self, task: Any, build: BuildResult, data: TaskData, keys: dict[int, str]) -> tuple:
        settings = dict(self.settings)
        intensity = float(task.flops) / max(float(task.bytes), 1.0)
        settings["flush_bytes"] = (
            2 * int(task.target.l2_bytes or 0) if intensity < self.flush_intensity else 0
        )
        settings["tf32"] = bool(getattr(task.target, "tf32", False))  # the check's float32 tolerance
        arch = build.info.get("arch", "sm_90")
        return ("run", data.key, build.artifact, arch, build.info["kernels"], keys, settings)

    def _interpret(self, reply: Any) -> tuple[Status, str, list[float] | None]:
        if reply[0] == "error":
            self.worker.kill()
            return Status.RUNTIME_ERROR, f"runner worker error:\n{reply[1]}", None
        status, lat, error, extra = reply
        if extra.get("restart"):
            self.worker.kill()  # the CUDA context may be poisoned: the next candidate gets a fresh one
            self.restarts_after_errors += 1
        return Status(status), error, lat
