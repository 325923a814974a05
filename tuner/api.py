"""Kiln for Python users: tune a model into a tuning database, and compile it with the best records.

- ``tune(model, target, db, budget, ...)`` extracts the model's tasks, searches each task's schedule space
  with Optuna (optionally filtered by a cost model), measures candidates on the target and commits every
  result to the database under one run; it returns a :class:`TuneSummary`. ``kiln tune`` is this function
  plus argument parsing and printing. The run row is closed (its end time set) whatever happens.
- ``compile(model, target, db)`` is :func:`compiler.build.compile` with the database's best valid record
  for each group (``db`` is a TuningDatabase or a URL); groups without a record use their sketch's default.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from compiler.build import compile as build_model
from compiler.errors import KilnError
from compiler.frontend import load_model
from compiler.fusion import FusionPlan
from compiler.graph import Graph
from compiler.reference import random_inputs
from compiler.target import Target
from db.database import TuningDatabase
from tuner.cost_filter import make_candidate_filter
from tuner.measure import Measurer, create_measurer
from tuner.progress import LiveProgress
from tuner.records import database_config_source
from tuner.scheduler import Budget, TaskScheduler
from tuner.search import TaskResult, TaskTuner
from tuner.storage import optuna_storage
from tuner.task import Task, extract_tasks

COST_MODELS = ("gbdt", "analytic", "none")


def compile(
    model: Graph | str, target: Target | str = "cpu", db: Any = None, plan: FusionPlan | None = None
) -> Any:
    """Compile ``model`` for ``target``; with ``db``, each group uses its best valid tuning record.
    Returns the target backend's compiled model (``run``, ``timeit``, ``save``)."""
    configs = database_config_source(db) if db is not None else None
    return build_model(model, target, plan=plan, configs=configs)


@dataclass(frozen=True)
class ModelTiming:
    """Whole-model latency measured on compiled models: every kernel's default vs the tuned records."""

    default_us: float
    tuned_us: float
    kernels_from_records: int
    kernels: int

    @property
    def speedup(self) -> float:
        return self.default_us / self.tuned_us


@dataclass(frozen=True)
class TuneSummary:
    """The outcome of :func:`tune`: the run's id in the database, each task's result, and whole-model
    numbers (estimates from per-kernel latencies and, when timed, a measurement of compiled models)."""

    run_id: int
    model: str
    target: str  # the target key the records were measured on
    tasks: list[TaskResult] = field(default_factory=list)
    measured: int = 0  # candidates measured by this run, over all tasks
    interrupted: bool = False  # stopped by Ctrl-C; every committed result is kept
    timing: ModelTiming | None = None

    @property
    def default_us(self) -> float | None:
        """sum(weight x default latency) over tasks, or None while a task's default is unmeasured."""
        return _weighted(self.tasks, "default_us")

    @property
    def best_us(self) -> float | None:
        """sum(weight x best latency) over tasks, or None while a task has no ok measurement."""
        return _weighted(self.tasks, "best_us")

    @property
    def tuned_tasks(self) -> int:
        """How many tasks have at least one ok measurement."""
        return sum(1 for t in self.tasks if t.best_us is not None)

    @property
    def coverage(self) -> float:
        """The weighted fraction of the tasks that have an ok measurement (1.0 when all do)."""
        total = sum(t.task.weight for t in self.tasks)
        tuned = sum(t.task.weight for t in self.tasks if t.best_us is not None)
        return tuned / total if total else 0.0


def _weighted(tasks: Sequence[TaskResult], attr: str) -> float | None:
    total = 0.0
    for t in tasks:
        value = getattr(t, attr)
        if value is None:
            return None
        total += t.task.weight * value
    return total


def select_tasks(tasks: Sequence[Task], wanted: Sequence[str] | None) -> list[Task]:
    """The tasks named in ``wanted`` (indices or workload-key prefixes), in the order named; all without."""
    if not wanted:
        return list(tasks)
    out: list[Task] = []
    for w in wanted:
        hits = [t for i, t in enumerate(tasks) if str(i) == w or t.workload_key.startswith(w)]
        if not hits:
            raise KilnError(
                f"task {w!r} matches no task; tasks: "
                + ", ".join(f"{i}={t.workload_key[:10]}" for i, t in enumerate(tasks))
            )
        out += [t for t in hits if t not in out]
    return out


@contextlib.contextmanager
def _database(db: TuningDatabase | str | None) -> Iterator[TuningDatabase]:
    """``db`` itself when it is open; otherwise the database at that URL (None: $KILN_DB or the default
    file), closed afterwards."""
    if isinstance(db, TuningDatabase):
        yield db
    else:
        with TuningDatabase.open(db) as opened:
            yield opened


def tune(
    model: Graph | str,
    target: Target | str = "cpu",
    db: TuningDatabase | str | None = None,
    budget: Budget | int = 64,
    *,
    tasks: Sequence[str] | None = None,
    sampler: str = "tpe",
    batch: int = 8,
    early_stop: int | None = 64,
    cost_model: str = "none",
    seed: int = 0,
    workers: int | None = None,
    measurer: Measurer | None = None,
    time_model: bool = True,
    progress: bool = False,
    command_line: str | None = None,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
) -> TuneSummary:
    """Tune ``model`` (a Graph, a built-in model name or an ONNX file) on ``target`` into ``db``.

    ``db`` is an open :class:`~db.database.TuningDatabase`, a URL, or None ($KILN_DB, else
    ``sqlite:///kiln.db``). ``budget`` is a number of measured candidates or a :class:`Budget` (trials
    and/or seconds). ``tasks`` limits the run to some tasks (indices or workload-key prefixes); only a
    whole-model run registers the model's task list. ``cost_model`` (``gbdt``, ``analytic`` or ``none``)
    ranks asked candidates and measures only the best few; ``early_stop`` ends a task after that many
    measured trials without a 1% improvement (None: never). ``measurer`` replaces the default one (local
    build processes and runner for ``target``; it is then not closed here). With ``time_model``, a
    whole-model run on the CPU ends by timing the compiled model with default and with tuned configs.
    ``progress`` shows the live table of ``kiln tune`` on stdout.

    The run's row in the database is closed (end time set) whatever happens; Ctrl-C stops after the
    current batch's results are committed and gives a summary with ``interrupted`` set.
    """
    if isinstance(budget, int):
        budget = Budget(trials=budget)
    if budget.trials is not None and budget.trials < 1:
        raise KilnError(f"a tuning budget needs at least 1 trial, got {budget.trials}")
    if cost_model not in COST_MODELS:
        raise KilnError(f"unknown cost model {cost_model!r}: use one of {', '.join(COST_MODELS)}")
    graph = load_model(model, input_shapes) if isinstance(model, str) else model
    target = Target.parse(target)
    chosen = select_tasks(extract_tasks(graph, target), tasks)
    with _database(db) as database:
        run_id = _begin_run(database, graph, target, chosen, budget, sampler, not tasks, command_line)
        own_measurer = measurer is None
        tuners: list[TaskTuner] = []
        measured, interrupted = 0, False
        try:
            storage = optuna_storage(database.url)
            candidate_filter, oversample = make_candidate_filter(cost_model, database, target, seed=seed)
            if measurer is None:
                measurer = create_measurer(target, workers=workers)
            tuners = [
                TaskTuner(
                    t,
                    database,
                    measurer,
                    storage,
                    sampler,
                    seed=seed + i,
                    early_stop=early_stop,
                    run_id=run_id,
                    candidate_filter=candidate_filter,
                    oversample=oversample,
                )
                for i, t in enumerate(chosen)
            ]
            display = LiveProgress(tuners, _budget_text(budget)) if progress else contextlib.nullcontext()
            with display as live:
                scheduler = TaskScheduler(
                    tuners, budget, batch, seed=seed, on_round=live.update if live is not None else None
                )
                try:
                    measured = scheduler.run()
                except KeyboardInterrupt:
                    interrupted, measured = True, scheduler.measured
        finally:
            try:
                if own_measurer and measurer is not None:
                    measurer.close()
            finally:
                database.finish_run(run_id)
        timing = None
        if time_model and not interrupted and not tasks and target.kind == "cpu":
            timing = time_compiled_model(graph, target, database)
    return TuneSummary(
        run_id, graph.name, target.key, [TaskResult.of(t) for t in tuners], measured, interrupted, timing
    )


def _begin_run(
    db: TuningDatabase,
    graph: Graph,
    target: Target,
    tasks: Sequence[Task],
    budget: Budget,
    sampler: str,
    whole: bool,
    cmd: str | None,
) -> int:
    """Commit the target, the tasks' workloads (and, for a whole-model run, the model's task list), then
    open a run row and return its id."""
    db.commit_target(target.key, target.to_json())
    for t in tasks:
        db.commit_workload(t.workload_key, t.group.canonical(), t.kind, t.flops, t.bytes)
    model_hash = graph.structural_hash()
    if whole:
        db.register_model_tasks(graph.name, model_hash, [(t.workload_key, t.weight) for t in tasks])
    spec = {"trials": budget.trials, "seconds": budget.seconds, "sampler": sampler}
    return db.begin_run(graph.name, model_hash, target.key, spec, cmd or f"tuner.tune({graph.name!r})")


def _budget_text(budget: Budget) -> str:
    """The budget as the progress display names it: ``64 trials``, ``90s``, ``10m``, ``1h``."""
    if budget.trials is not None:
        return f"{budget.trials} trials"
    seconds = float(budget.seconds or 0)
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def time_compiled_model(graph: Graph, target: Target, db: TuningDatabase) -> ModelTiming:
    """Whole-model latency (median of 20 runs) compiled with default configs and with the tuned records."""
    inputs = random_inputs(graph, 0)
    default = compile(graph, target).timeit(inputs, repeats=20, warmup=3)["median_us"]
    tuned_model = compile(graph, target, db=db)
    tuned = tuned_model.timeit(inputs, repeats=20, warmup=3)["median_us"]
    used = sum(1 for k in tuned_model.kernels if k.extra.get("origin") == "record")
    return ModelTiming(default, tuned, used, len(tuned_model.kernels))


__all__ = ["Budget", "ModelTiming", "TaskResult", "TuneSummary", "compile", "select_tasks", "tune"]
