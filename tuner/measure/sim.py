"""Simulated measurement: replay recorded timings so search and scheduler tests need no hardware.

``SimulatedRunner(timings)`` answers each candidate from ``timings``:

- a mapping from canonical config JSON (``tuner.space.config_json``) -- or from
  ``(workload_key, config JSON)`` for several tasks -- to a latency in microseconds, a list of latencies,
  a :class:`~db.status.Status` (or its name), or ``(Status, error text)``;
- or a callable ``(task, config) -> any of those``.

A config with no recorded value is ``runtime_error`` ("no recorded timing"); an exception in the callable is
a ``runtime_error`` with its text (errors are data). ``SimulatedBuilder`` only applies the sketch's check
(``invalid_config``) and optionally a ``fail(task, config) -> message | None`` hook (``compile_error``).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from compiler.backends.sketch import Config
from db.status import Status
from tuner.measure import Builder, BuildResult, MeasureInput, Runner, RunResult
from tuner.space import config_json

Timing = float | Sequence[float] | Status | str | tuple[Status, str]


class SimulatedBuilder(Builder):
    """Checks configs against the sketch (``invalid_config``); everything else builds instantly."""

    def __init__(self, fail: Callable[[Any, Config], str | None] | None = None) -> None:
        self.fail = fail
        self.built: list[tuple[str, str]] = []  # (workload key, config JSON) of every ok build

    def build(self, inputs: Sequence[MeasureInput]) -> list[BuildResult]:
        out = []
        for inp in inputs:
            try:
                inp.task.check(inp.config)
            except Exception as exc:
                out.append(BuildResult(Status.INVALID_CONFIG, str(exc)))
                continue
            message = self.fail(inp.task, inp.config) if self.fail is not None else None
            if message:
                out.append(BuildResult(Status.COMPILE_ERROR, message))
                continue
            self.built.append((inp.task.workload_key, config_json(inp.config)))
            out.append(BuildResult(Status.OK, symbol="simulated"))
        return out


class SimulatedRunner(Runner):
    """Replays recorded timings (see the module docstring). ``repeats`` latencies are reported per
    candidate; with ``noise`` > 0 each is scaled by a factor drawn uniformly from [1 - noise, 1 + noise]
    (seeded). ``seconds`` is the wall time each candidate takes (a sleep: how long a real measurement
    would keep a worker busy, for tests and benchmarks of several workers). ``history`` lists the
    (workload key, config JSON) of every candidate run."""

    def __init__(
        self,
        timings: Mapping[Any, Timing] | Callable[[Any, Config], Timing],
        repeats: int = 3,
        noise: float = 0.0,
        seed: int = 0,
        seconds: float = 0.0,
    ) -> None:
        self.timings = timings
        self.seconds = max(0.0, float(seconds))
        self.repeats = max(1, int(repeats))
        self.noise = float(noise)
        self.rng = random.Random(seed)
        self.history: list[tuple[str, str]] = []

    def run(self, inputs: Sequence[MeasureInput], builds: Sequence[BuildResult]) -> list[RunResult]:
        return [self._one(inp) for inp in inputs]

    def _lookup(self, inp: MeasureInput) -> Timing | None:
        cfg = config_json(inp.config)
        if callable(self.timings):
            return self.timings(inp.task, inp.config)
        for key in ((inp.task.workload_key, cfg), cfg):
            if key in self.timings:
                return self.timings[key]
        return None

    def _one(self, inp: MeasureInput) -> RunResult:
        if self.seconds:
            time.sleep(self.seconds)
        try:
            cfg = config_json(inp.config)
            self.history.append((inp.task.workload_key, cfg))
            value = self._lookup(inp)
        except Exception as exc:
            return RunResult(
                Status.RUNTIME_ERROR, None, f"simulated timing failed: {type(exc).__name__}: {exc}"
            )
        if value is None:
            return RunResult(Status.RUNTIME_ERROR, None, f"no recorded timing for config {cfg}")
        if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], str):
            return RunResult(Status.parse(value[0]), None, value[1])
        if isinstance(value, str):
            status = Status.parse(value)
            if status == Status.OK:
                return RunResult(Status.RUNTIME_ERROR, None, "a recorded 'ok' needs a latency")
            return RunResult(status, None, f"simulated {status}")
        lat = [float(value)] * self.repeats if isinstance(value, int | float) else [float(x) for x in value]
        if not lat or any(not (x >= 0) or x == float("inf") for x in lat):
            return RunResult(Status.RUNTIME_ERROR, None, f"bad recorded latency {value!r}")
        if self.noise > 0:
            lat = [x * (1 + self.rng.uniform(-self.noise, self.noise)) for x in lat]
        return RunResult(Status.OK, lat, "")
