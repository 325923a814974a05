"""Measurement: build candidate configs of tuning tasks, run them, check them, time them.

``Measurer(builder, runner).measure([MeasureInput(task, config), ...])`` returns one
:class:`MeasureResult` per input, in input order, and never raises for a bad candidate: every failure is a
:class:`~db.status.Status` with an error text (errors are data at this boundary).

Roles (one ABC each, contracts in the docstrings):

- :class:`Builder`: check the config (``invalid_config``, nothing built), schedule, lower, generate code and
  compile it (``compile_error`` with the compiler's message).
- :class:`Runner`: run each built candidate once on seeded random inputs with poisoned, guarded outputs and
  compare with the numpy reference (``runtime_error``, ``wrong_result``), then time it (``timeout`` if it
  hangs).

The package holds the parts that do not depend on the target (this module, ``pool.py``: supervised worker
processes, ``sim.py``: ``SimulatedBuilder`` / ``SimulatedRunner`` replaying recorded timings) and one
sub-package per target kind with that kind's ``LocalBuilder`` and ``LocalRunner``: ``cpu/`` (a process pool
that compiles several candidates in one gcc call; a runner timing kernels in an isolated worker), ``cuda/``
(NVRTC in a process pool, one candidate per job; a runner owning the CUDA context in a spawned worker, CUDA
events, an L2 flush for memory-bound tasks, a restart after a sticky error). ``check.py`` holds what every
runner checks with (task data, guards, poison, comparison with the reference). The ``local`` builder and
runner of a target are found by its kind (``tuner.measure.<kind>``), so measuring on a new backend means
adding ``tuner/measure/<kind>/`` beside ``compiler/backends/<kind>/``.

Factories accept a name or an instance: ``create_builder("local")``, ``create_runner("simulated",
timings=...)``, ``Measurer("local", my_runner)``; ``create_measurer(target, workers)`` is what ``kiln tune``
uses. A batch is built completely before anything runs (compilation never disturbs a timing), and worker
processes stay alive between batches until ``close()``.
"""

from __future__ import annotations

import contextlib
import importlib
import statistics
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from compiler.backends.sketch import Config
from compiler.errors import KilnError
from compiler.target import Target
from db.status import Status
from tuner.space import config_json
from tuner.task import Task


@dataclass(frozen=True, eq=False)
class MeasureInput:
    """One candidate: a task and a config of its sketch's knob space."""

    task: Task
    config: Config

    @property
    def key(self) -> tuple[str, str, int, str, str]:
        """Identity of the candidate (workload, sketch, sketch version, target, canonical config)."""
        t = self.task
        return (t.workload_key, t.sketch.name, t.sketch.version, t.target.key, config_json(self.config))


@dataclass
class BuildResult:
    """What a Builder made of one candidate. With status ``ok``, ``artifact`` (a file: the shared library
    on the CPU) and ``symbol`` (the candidate's entry point in it) are what a Runner needs; ``info`` carries
    builder-specific details (the kernel's parameter shapes for the CPU runner)."""

    status: Status
    error: str = ""
    artifact: str | None = None
    symbol: str | None = None
    seconds: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunResult:
    """What a Runner measured for one built candidate (latencies in microseconds when ``ok``)."""

    status: Status
    latencies_us: list[float] | None = None
    error: str = ""
    seconds: float = 0.0


@dataclass
class MeasureResult:
    """The outcome of measuring one candidate. Only ``ok`` results have latencies (microseconds, every
    sample); ``median_us`` is what search uses. ``build_seconds``/``run_seconds`` are this candidate's
    share of the time spent building and running."""

    latencies_us: list[float] | None
    status: Status
    error: str = ""
    build_seconds: float = 0.0
    run_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == Status.OK

    @property
    def median_us(self) -> float | None:
        return float(statistics.median(self.latencies_us)) if self.latencies_us else None

    def to_json(self) -> dict[str, Any]:
        return {
            "status": str(self.status),
            "latencies_us": self.latencies_us,
            "median_us": self.median_us,
            "error": self.error,
            "build_seconds": self.build_seconds,
            "run_seconds": self.run_seconds,
        }


class Builder(ABC):
    """Turns candidates into runnable artifacts.

    Contract: ``build(inputs)`` returns exactly one :class:`BuildResult` per input, in input order, and
    never raises because of a candidate. A config that fails ``task.sketch.check`` is ``invalid_config``
    and nothing is built for it; one the sketch cannot schedule (``ScheduleError`` while building) is also
    ``invalid_config``; any other failure of scheduling, lowering, code generation or the compiler is
    ``compile_error`` with a message that quotes the compiler. One bad candidate never fails another.
    ``release(results)`` may delete the artifacts once they have been run. A builder holding processes
    frees them in ``close()``; builders are context managers.
    """

    @abstractmethod
    def build(self, inputs: Sequence[MeasureInput]) -> list[BuildResult]: ...

    def release(self, results: Sequence[BuildResult]) -> None:  # noqa: B027 (optional hook)
        """Free the artifacts of ``results`` (called after they were run)."""

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Stop worker processes (the builder can still be used: they restart on demand)."""

    def __enter__(self) -> Builder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def create(spec: str | Builder = "local", **options: Any) -> Builder:
        return create_builder(spec, **options)


class Runner(ABC):
    """Runs built candidates, checks their results and times them.

    Contract: ``run(inputs, builds)`` gets candidates whose build is ``ok`` (``builds[i]`` belongs to
    ``inputs[i]``) and returns exactly one :class:`RunResult` per input, in order, never raising because of
    a candidate. Before timing, a candidate runs once on random inputs (seeded per task) and is compared
    with the numpy reference of its group: a mismatch is ``wrong_result``, a crash or a write outside its
    outputs ``runtime_error``; one that does not finish within the timeout is ``timeout``. A crash or a hang
    never affects the next candidate (the isolated worker is restarted). ``ok`` results carry at least
    ``min_repeats`` latencies in microseconds. ``close()`` stops worker processes; runners are context
    managers.
    """

    @abstractmethod
    def run(self, inputs: Sequence[MeasureInput], builds: Sequence[BuildResult]) -> list[RunResult]: ...

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Stop worker processes (the runner can still be used: they restart on demand)."""

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def create(spec: str | Runner = "local", target: Target | str | None = None, **options: Any) -> Runner:
        return create_runner(spec, target, **options)


BUILDERS = ("local", "simulated")
RUNNERS = ("local", "simulated")


def _local_class(target: Target | str | None, role: str) -> type:
    """``Local<Role>`` (``role``: builder or runner) of ``tuner.measure.<kind>``, the target's kind (default:
    cpu)."""
    kind = Target.parse(target).kind if target is not None else "cpu"
    module_name, class_name = f"{__name__}.{kind}", f"Local{role.title()}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        module = None
    cls = getattr(module, class_name, None)
    if cls is None:
        raise KilnError(
            f"no local {role} for {kind} targets: measuring {kind.upper()} candidates is not built yet "
            f"(the {kind.upper()} builder and runner belong in tuner/measure/{kind}/)"
        )
    return cls


def create_builder(
    spec: str | Builder = "local", target: Target | str | None = None, **options: Any
) -> Builder:
    """A builder from a name and options, or ``spec`` itself if it is one. ``local`` is the
    ``LocalBuilder`` of the target's kind (default: cpu), from ``tuner.measure.<kind>``;
    ``simulated`` -> :class:`~tuner.measure.sim.SimulatedBuilder`."""
    if isinstance(spec, Builder):
        return spec
    if spec == "local":
        return _local_class(target, "builder")(**options)
    if spec == "simulated":
        from tuner.measure.sim import SimulatedBuilder  # sim.py subclasses Builder: a real import cycle

        return SimulatedBuilder(**options)
    raise KilnError(f"unknown builder {spec!r}; known: {', '.join(BUILDERS)}")


def create_runner(spec: str | Runner = "local", target: Target | str | None = None, **options: Any) -> Runner:
    """A runner from a name and options, or ``spec`` itself if it is one. ``local`` is the ``LocalRunner``
    of the target's kind (default: cpu), from ``tuner.measure.<kind>``: ``cpu`` ->
    :class:`~tuner.measure.cpu.run.LocalRunner`; ``cuda`` -> :class:`~tuner.measure.cuda.run.LocalRunner`.
    ``simulated`` -> :class:`~tuner.measure.sim.SimulatedRunner`."""
    if isinstance(spec, Runner):
        return spec
    if spec == "local":
        return _local_class(target, "runner")(**options)
    if spec == "simulated":
        from tuner.measure.sim import SimulatedRunner  # sim.py subclasses Runner: a real import cycle

        return SimulatedRunner(**options)
    raise KilnError(f"unknown runner {spec!r}; known: {', '.join(RUNNERS)}")


def create_measurer(
    target: Target | str | None = None,
    workers: int | None = None,
    builder: str | Builder = "local",
    runner: str | Runner = "local",
    builder_options: dict[str, Any] | None = None,
    runner_options: dict[str, Any] | None = None,
) -> Measurer:
    """A :class:`Measurer` for ``target`` (default: this CPU) with ``workers`` build processes (default: one
    per core); what ``kiln tune`` uses."""
    options = dict(builder_options or {})
    if workers and builder == "local":
        options.setdefault("workers", workers)
    return Measurer(builder, runner, target, options, runner_options)


@dataclass
class MeasureStats:
    """Running totals of a Measurer: candidates by status and wall time of each phase (seconds)."""

    candidates: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    build_wall_s: float = 0.0
    run_wall_s: float = 0.0

    @property
    def wall_s(self) -> float:
        return self.build_wall_s + self.run_wall_s


def round_order(n: int, r: int, rotate: bool = False) -> list[int]:
    """The order in which round ``r`` of an interleaved re-measurement runs ``n`` candidates: input order in
    even rounds and reversed in odd ones, or, with ``rotate``, starting at candidate ``r % n``."""
    order = list(range(n))
    if rotate:
        return order[r % n :] + order[: r % n] if n else order
    return order[::-1] if r % 2 == 1 else order


def measure_in_rounds(
    measurer: Any, inputs: Sequence[MeasureInput], rounds: int, rotate: bool = False
) -> list[list[MeasureResult]]:
    """``rounds`` interleaved measurements of ``inputs`` in :func:`round_order`, each round's results in input
    order: :meth:`Measurer.measure_rounds` (built once) when the measurer has it, otherwise one ``measure``
    call per round (any object with ``measure``, e.g. a test's or a benchmark's replaying measurer)."""
    inputs = list(inputs)
    if hasattr(measurer, "measure_rounds"):
        return measurer.measure_rounds(inputs, rounds, rotate=rotate)
    out: list[list[MeasureResult]] = []
    for r in range(max(1, rounds)):
        order = round_order(len(inputs), r, rotate)
        got = measurer.measure([inputs[j] for j in order])
        results: list[MeasureResult] = [None] * len(inputs)  # type: ignore[list-item]
        for j, res in zip(order, got):
            results[j] = res
        out.append(results)
    return out


class Measurer:
    """Builder + runner: ``measure(inputs)`` -> results in input order, never raising for a candidate.

    Identical candidates in one batch (same workload, sketch, target and config) are measured once. Batches
    are built completely before anything runs, so compilation never disturbs a timing. Not thread-safe: one
    Measurer per tuning loop.
    """

    def __init__(
        self,
        builder: str | Builder = "local",
        runner: str | Runner = "local",
        target: Target | str | None = None,
        builder_options: dict[str, Any] | None = None,
        runner_options: dict[str, Any] | None = None,
    ) -> None:
        self.builder = create_builder(builder, target, **(builder_options or {}))
        self.runner = create_runner(runner, target, **(runner_options or {}))
        self.stats = MeasureStats()

    def measure(self, inputs: Sequence[MeasureInput]) -> list[MeasureResult]:
        """Build, check and time every candidate; see the class docstring."""
        return self.measure_rounds(inputs, 1)[0]

    def measure_rounds(
        self, inputs: Sequence[MeasureInput], rounds: int, rotate: bool = False
    ) -> list[list[MeasureResult]]:
        """Build every candidate once, then run (check and time) all of them ``rounds`` times, one round
        after the other, in input order in even rounds and in reverse order in odd ones (an interleaved
        re-measurement, :mod:`tuner.confirm`), or, with ``rotate``, round ``r`` starting at the ``r``-th
        candidate; returns each round's results in input order. A candidate that failed to build has that
        result in every round. Compared with ``rounds`` calls of :meth:`measure`, nothing is compiled again
        between rounds."""
        inputs = list(inputs)
        keys = [_key(inp, i) for i, inp in enumerate(inputs)]
        first: dict[Any, int] = {}
        for i, k in enumerate(keys):
            first.setdefault(k, i)
        unique = sorted(first.values())
        todo = [inputs[i] for i in unique]
        t0 = time.perf_counter()
        builds = self._build(todo)
        self.stats.build_wall_s += time.perf_counter() - t0
        out: list[list[MeasureResult]] = []
        try:
            for r in range(max(1, rounds)):
                order = round_order(len(todo), r, rotate)
                t1 = time.perf_counter()
                ran = self._run([todo[j] for j in order], [builds[j] for j in order])
                self.stats.run_wall_s += time.perf_counter() - t1
                runs: list[RunResult | None] = [None] * len(todo)
                for j, run in zip(order, ran):
                    runs[j] = run
                out.append(self._results(inputs, keys, first, unique, builds, runs))
        finally:
            with contextlib.suppress(Exception):  # cleanup must never lose measurements
                self.builder.release(builds)
        return out

    def _results(
        self,
        inputs: list[MeasureInput],
        keys: list[Any],
        first: dict[Any, int],
        unique: list[int],
        builds: list[BuildResult],
        runs: list[RunResult | None],
    ) -> list[MeasureResult]:
        by_unique: dict[int, MeasureResult] = {}
        for i, b, r in zip(unique, builds, runs):
            if r is None:
                res = MeasureResult(None, b.status, b.error, b.seconds, 0.0)
            elif r.status == Status.OK and not r.latencies_us:
                res = MeasureResult(None, Status.RUNTIME_ERROR, "the runner reported no latencies", b.seconds)
            else:
                lat = r.latencies_us if r.status == Status.OK else None
                res = MeasureResult(lat, r.status, r.error, b.seconds, r.seconds)
            by_unique[i] = res
        results = [by_unique[i] if first[k] == i else _copy(by_unique[first[k]]) for i, k in enumerate(keys)]
        self.stats.candidates += len(results)
        for r in results:
            self.stats.by_status[str(r.status)] = self.stats.by_status.get(str(r.status), 0) + 1
        return results

    def _build(self, todo: list[MeasureInput]) -> list[BuildResult]:
        try:
            builds = self.builder.build(todo)
            if len(builds) != len(todo):
                raise KilnError(f"builder returned {len(builds)} results for {len(todo)} candidates")
            return builds
        except Exception as exc:  # a builder bug fails this batch, not the tuning run
            msg = f"builder failed: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}"
            return [BuildResult(Status.COMPILE_ERROR, msg) for _ in todo]

    def _run(self, todo: list[MeasureInput], builds: list[BuildResult]) -> list[RunResult | None]:
        idx = [i for i, b in enumerate(builds) if b.status == Status.OK]
        out: list[RunResult | None] = [None] * len(todo)
        if not idx:
            return out
        try:
            runs = self.runner.run([todo[i] for i in idx], [builds[i] for i in idx])
            if len(runs) != len(idx):
                raise KilnError(f"runner returned {len(runs)} results for {len(idx)} candidates")
        except Exception as exc:
            msg = f"runner failed: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}"
            runs = [RunResult(Status.RUNTIME_ERROR, None, msg) for _ in idx]
        for i, r in zip(idx, runs):
            out[i] = r
        return out

    def close(self) -> None:
        """Stop the builder's and the runner's worker processes."""
        try:
            self.builder.close()
        finally:
            self.runner.close()

    def __enter__(self) -> Measurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _key(inp: MeasureInput, i: int) -> Any:
    try:
        return inp.key
    except Exception:  # a config that is not JSON-able is measured (and rejected) on its own
        return ("unkeyed", i)


def _copy(r: MeasureResult) -> MeasureResult:
    lat = list(r.latencies_us) if r.latencies_us is not None else None
    return MeasureResult(lat, r.status, r.error, r.build_seconds, r.run_seconds)
