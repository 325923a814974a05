"""Kiln for Python users: tune a model into a tuning database, and compile it with the best records.

- ``tune(model, target, db, budget, ...)`` extracts the model's tasks, searches each task's schedule space
  with Optuna (optionally filtered by a cost model), measures candidates on the target and commits every
  result to the database under one run; it returns a :class:`TuneSummary`. ``kiln tune`` is this function
  plus argument parsing and printing. The run row is closed (its end time set) whatever happens.
  At the end of a run that was not interrupted, each task's candidate (what compile would apply, or the
  record that would displace it: :attr:`db.selection.Selection.to_confirm`) and its default are measured
  again in interleaved rounds and the confirmation is stored (:mod:`tuner.confirm`); the summary's
  speed-ups come from the confirmations of the records compile applies.
- ``compile(model, target, db)`` is :func:`compiler.build.compile` with the record the selection rule of
  :mod:`db.selection` picks for each group (``db`` is a TuningDatabase or a URL): confirmed faster first,
  the default schedule where a record was confirmed not faster (and none faster), else the lowest median;
  groups without a record use their sketch's default.
  Each region's stored fusion plan is applied when it beats the rules' plan (:mod:`tuner.plan_search`);
  a stale one (edges the region no longer has) is reported in ``meta["fusion_plans"]`` and skipped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO

from compiler.build import compile as build_model
from compiler.errors import KilnError
from compiler.frontend import load_model
from compiler.fusion import FusionPlan
from compiler.graph import Graph
from compiler.passes import optimize
from compiler.reference import random_inputs
from compiler.target import Target
from db.database import TuningDatabase
from db.engine import sqlite_path
from db.leases import WORKER, Leases, lease_key
from db.records import Confirmation
from tuner.confirm import (
    DEFAULT_ROUNDS,
    ConfirmFailure,
    applied_text,
    confirm_tasks,
    selection,
    speedup_text,
)
from tuner.cost_filter import make_candidate_filter
from tuner.measure import Measurer, create_measurer
from tuner.plan_search import (
    CONFIRM_GROUPS,
    CONFIRM_ROUNDS,
    GROUP_TRIALS,
    PlanOutcome,
    PlanSearch,
    confirm_plans,
    confirm_reserve,
    database_plan,
    target_regions,
)
from tuner.plan_whole import InterleavedWholeTimer, WholeTimer
from tuner.progress import LiveProgress
from tuner.records import database_config_source
from tuner.scheduler import Budget, TaskScheduler
from tuner.search import TaskResult, TaskTuner
from tuner.space import config_json
from tuner.task import Task, extract_tasks
from tuner.workers import DatabaseShare

COST_MODELS = ("gbdt", "analytic", "none")
FUSION_MODES = ("auto", "search", "rules")


def compile(
    model: Graph | str,
    target: Target | str = "cpu",
    db: Any = None,
    plan: FusionPlan | None = None,
    fusion_plans: bool = True,
) -> Any:
    """Compile ``model`` for ``target``; with ``db``, each group uses the tuning record the selection rule
    picks (:mod:`db.selection`: confirmed faster first, never one confirmed not faster) and
    (with ``fusion_plans``, unless ``plan`` is given) each region its stored fusion plan when it beats the
    rules'. Returns the target backend's compiled model (``run``, ``timeit``, ``save``); with ``db``, its
    ``meta["fusion_plans"]`` says which plans were applied and which were skipped and why."""
    if isinstance(db, str):
        db = TuningDatabase.open(db, create=False)
    configs = database_config_source(db) if db is not None else None
    lines = None
    if db is not None and plan is None and fusion_plans:
        graph = load_model(model) if isinstance(model, str) else model
        target = Target.parse(target)
        report = database_plan(db, optimize(graph), target)
        model, plan, lines = graph, report.plan or None, report.lines
    compiled = build_model(model, target, plan=plan, configs=configs)
    if lines is not None:
        compiled.meta["fusion_plans"] = lines
    return compiled


@dataclass(frozen=True)
class ModelTiming:
    """Whole-model latency measured on compiled models, every kernel's default vs the tuned records, in
    interleaved rounds: ``default_us`` / ``tuned_us`` are medians of the per-round medians, ``speedup``
    the median of the per-round ratios and ``spread`` half their range relative to it."""

    default_us: float
    tuned_us: float
    kernels_from_records: int
    kernels: int
    speedup: float = 0.0
    spread: float = 0.0
    rounds: int = 1

    def speedup_text(self) -> str:
        """``1.20x (±2%)``."""
        return f"{self.speedup:.2f}x (±{100 * self.spread:.0f}%)"


@dataclass(frozen=True)
class Resume:
    """An unfinished run that :func:`tune` continues: its id, what it had stored and spent, and the budget."""

    run_id: int
    done: int  # records stored under the run before this invocation
    budget_trials: int | None
    spent_seconds: float
    budget_seconds: float | None
    workers: int = 0  # other live workers tuning the run (it is shared, not resumed after a stop)

    def message(self) -> str:
        """``resuming run 3: 40 of 64 trials done, 24 left`` (or, for a time budget, seconds), and how many
        other workers are tuning it."""
        if self.budget_trials is not None:
            left = max(0, self.budget_trials - self.done)
            text = f"resuming run {self.run_id}: {self.done} of {self.budget_trials} trials done, {left} left"
        else:
            text = f"resuming run {self.run_id}: {self.done} trials done"
        if self.budget_seconds is not None:
            left_s = max(0.0, self.budget_seconds - self.spent_seconds)
            text += f"; {self.spent_seconds:.0f} s of {self.budget_seconds:g} s spent, {left_s:.0f} s left"
        if self.workers:
            text += f"; {self.workers} other worker{'s' if self.workers > 1 else ''} on it"
        return text


@dataclass(frozen=True)
class TuneSummary:
    """The outcome of :func:`tune`: the run's id in the database, each task's result, and whole-model
    numbers (estimates from per-kernel latencies and, when timed, a measurement of compiled models)."""

    run_id: int
    model: str
    target: str  # the target key the records were measured on
    tasks: list[TaskResult] = field(default_factory=list)  # ``measured``: records stored under the run
    measured: int = 0  # candidates measured (records stored) by this invocation, over all tasks
    interrupted: bool = False  # stopped by Ctrl-C; every committed result is kept
    timing: ModelTiming | None = None
    stored: int = 0  # records stored under the run in all (a resumed run counts its earlier part too)
    budget_trials: int | None = None  # the run's trial budget over its tasks (None: a time budget only)
    budget_seconds: float | None = None
    resumed: Resume | None = None  # the unfinished run this invocation continued, if any
    confirmations: dict[str, Confirmation] = field(default_factory=dict)  # by workload key
    confirm_failures: dict[str, str] = field(default_factory=dict)  # workload key -> why not confirmed

    def confirmation(self, result: TaskResult) -> Confirmation | None:
        """The confirmation of a task's best candidate, or None (not confirmed)."""
        return self.confirmations.get(result.task.workload_key)

    def speedup_text(self, result: TaskResult) -> str:
        """The task's speed-up over its default as the CLI prints it: ``1.42x (±3%)`` from the confirmation
        (of the config the end of the run confirmed: :attr:`db.selection.Selection.to_confirm`), ``default``
        when the best config found is the default itself, or ``unconfirmed``."""
        conf = self.confirmation(result)
        best, default = result.best_config, result.task.default()
        is_default = conf is None and best is not None and config_json(best) == config_json(default)
        return speedup_text(conf, is_default)

    plans: list[PlanOutcome] = field(default_factory=list)  # fusion-plan search: one per searched region

    def to_json(self) -> dict[str, Any]:
        """The summary as plain JSON data (``kiln tune --format json``)."""
        t = self.timing
        return {
            "run_id": self.run_id,
            "model": self.model,
            "target": self.target,
            "budget": {"trials": self.budget_trials, "seconds": self.budget_seconds},
            "resumed": None
            if self.resumed is None
            else {"run_id": self.resumed.run_id, "trials_done_before": self.resumed.done},
            "trials": self.stored,
            "measured_now": self.measured,
            "interrupted": self.interrupted,
            "default_us": self.default_us,
            "best_us": self.best_us,
            "tuned_tasks": self.tuned_tasks,
            "coverage": self.coverage,
            "tasks": [
                {
                    "index": i,
                    "task": r.task.name,
                    "workload": r.task.workload_key,
                    "kind": r.task.kind,
                    "weight": r.task.weight,
                    "trials": r.measured,
                    "default_us": r.default_us,
                    "best_us": r.best_us,
                    "speedup": _conf_json(self.confirmation(r), "speedup"),
                    "speedup_spread": _conf_json(self.confirmation(r), "spread"),
                    "confirmation": _confirmation_json(self.confirmation(r)),
                    "confirm_error": self.confirm_failures.get(r.task.workload_key),
                    "best_config": r.best_config,
                    "errors": r.errors,
                    "done": r.done,
                }
                for i, r in enumerate(self.tasks)
            ],
            "plans": [
                {
                    "region": p.region.index,
                    "region_key": p.region.key,
                    "flipped": p.flipped,
                    "latency_us": p.latency_us,
                    "rule_latency_us": p.rule_latency_us,
                    "plans_measured": p.plans_measured,
                    "whole_us": p.whole_us,
                    "rule_whole_us": p.rule_whole_us,
                    "why": p.why or None,
                }
                for p in self.plans
            ],
            "timing": None
            if t is None
            else {
                "default_us": t.default_us,
                "tuned_us": t.tuned_us,
                "speedup": t.speedup,
                "speedup_spread": t.spread,
                "rounds": t.rounds,
                "kernels_from_records": t.kernels_from_records,
                "kernels": t.kernels,
            },
        }

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


def _conf_json(conf: Confirmation | None, attr: str) -> float | None:
    return None if conf is None else getattr(conf, attr)


def _confirmation_json(conf: Confirmation | None) -> dict[str, Any] | None:
    if conf is None:
        return None
    return {
        "speedup": conf.speedup,
        "spread": conf.spread,
        "best_us": conf.best_us,
        "default_us": conf.default_us,
        "rounds": conf.rounds,
        "better_than_default": conf.better,
        "config": conf.config,
    }


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
    progress_file: TextIO | None = None,
    command_line: str | None = None,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
    resume: bool = True,
    confirm_rounds: int = DEFAULT_ROUNDS,
    fusion: str = "auto",
    whole_timer: WholeTimer | None = None,
) -> TuneSummary:
    """Tune ``model`` (a Graph, a built-in model name or an ONNX file) on ``target`` into ``db``.

    ``db`` is an open :class:`~db.database.TuningDatabase`, a URL, or None ($KILN_DB, else
    ``sqlite:///kiln.db``). ``budget`` is a number of measured candidates or a :class:`Budget` (trials in
    total or per selected task, and/or seconds). ``tasks`` limits the run to some tasks (indices or
    workload-key prefixes); only a whole-model run registers the model's task list. ``cost_model``
    (``gbdt``, ``analytic`` or ``none``) ranks asked candidates and measures only the best few;
    ``early_stop`` ends a task after that many measured trials without a 1% improvement (None: never).
    ``measurer`` replaces the default one (local build processes and runner for ``target``; it is then not
    closed here). With ``time_model``, a whole-model run on the CPU ends by timing the compiled model with
    default and with tuned configs. ``progress`` shows the overall progress bar and the live table of
    ``kiln tune`` on ``progress_file`` (default stdout).

    With ``resume`` (the default), when the latest run of this model on this target with the same budget
    and arguments did not complete (interrupted, failed, killed, or still being tuned by other workers),
    that run is continued: only the budget it had left is spent, counting the records stored under it.

    This process is one *worker* (:mod:`tuner.workers`): any number of ``tune`` calls with the same
    arguments on one database (one machine or many) share one run and its budget; they tune different
    tasks while there are enough, never measure a config twice, and a killed worker's claims expire
    (``$KILN_LEASE_TTL`` seconds, default 30) so the others measure them. The last worker to leave closes
    the run's row (end time set, with how it ended) whatever happens; Ctrl-C stops after the current
    batch's results are committed and gives a summary with ``interrupted`` set.

    Unless interrupted, the run ends by confirming each task's best candidate: it and the default are
    measured again in ``confirm_rounds`` interleaved rounds (0: no confirmation) and the result is stored
    (:mod:`tuner.confirm`); the summary's speed-ups come from these confirmations.

    ``fusion`` (``search``, ``rules`` or ``auto``): with ``search``, a whole-model run also searches each
    region's fusion plan (:mod:`tuner.plan_search`) under the same budget and stores the best plan per
    region; ``auto`` searches when the budget allows (:func:`plan_search_fits`); ``rules`` keeps the rules.
    On the CPU a plan that beats the rules' by the sum of its kernels is kept only when the whole compiled
    model under it is faster too, timed by ``whole_timer`` (default: :class:`InterleavedWholeTimer`, real
    end-to-end timing; :mod:`tuner.plan_whole`).
    """
    if isinstance(budget, int):
        budget = Budget(trials=budget)
    for value, what in ((budget.trials, "trial"), (budget.trials_per_task, "trial per task")):
        if value is not None and value < 1:
            raise KilnError(f"a tuning budget needs at least 1 {what}, got {value}")
    if cost_model not in COST_MODELS:
        raise KilnError(f"unknown cost model {cost_model!r}: use one of {', '.join(COST_MODELS)}")
    if fusion not in FUSION_MODES:
        raise KilnError(f"unknown fusion mode {fusion!r}: use one of {', '.join(FUSION_MODES)}")
    graph = load_model(model, input_shapes) if isinstance(model, str) else model
    target = Target.parse(target)
    if measurer is None and target.kind == "cuda":
        from compiler.backends.cuda.device import require_cupy

        require_cupy("tuning for the cuda target")  # one line, before a run row is opened
    chosen = select_tasks(extract_tasks(graph, target), tasks)
    total_trials = budget.total_trials(len(chosen))
    optimized = optimize(graph)
    plan_regions = target_regions(optimized, target) if fusion != "rules" and not tasks else []
    if fusion == "auto" and not plan_search_fits(total_trials, len(chosen), plan_regions):
        plan_regions = []
    args = {
        "tasks": [t.workload_key for t in chosen],
        "whole": not tasks,
        "batch": batch,
        "early_stop": early_stop,
        "cost_model": cost_model,
        "seed": seed,
    }
    if plan_regions:
        args["fusion"] = "search"
    spec = {
        "trials": total_trials,
        "seconds": budget.seconds,
        "trials_per_task": budget.trials_per_task,
        "sampler": sampler,
        "args": args,
    }
    with _database(db) as database:
        database.check_integrity()  # a damaged file is one clear error before anything is written
        leases = Leases(database)
        mutex = f"run:{graph.structural_hash()}:{target.key}"
        with leases.mutex(mutex):  # workers starting together join one run
            found = _unfinished_run(database, graph, target, spec, leases) if resume else None
            if found is None:
                run_id = _begin_run(database, graph, target, chosen, spec, not tasks, command_line)
                resumed = None
            else:
                run_id, resumed = found
                if not resumed.workers:
                    database.reopen_run(
                        run_id, {**spec, "spent_seconds": resumed.spent_seconds, "resumed_at": _now_iso()}
                    )
            worker_key = lease_key(WORKER, run_id, leases.owner)
            leases.claim(worker_key, WORKER, run_id)
        # a private in-memory SQLite database has one worker and one connection: no heartbeat thread on it
        share = DatabaseShare(
            database,
            run_id,
            total_trials,
            leases,
            heartbeat=not (database.dialect == "sqlite" and sqlite_path(database.url) is None),
        )
        seed_offset = 7919 * (resumed.workers if resumed is not None else 0)  # workers ask different configs
        done_before = resumed.done if resumed is not None else 0
        spent_before = resumed.spent_seconds if resumed is not None else 0.0
        left = Budget(
            None if total_trials is None else max(0, total_trials - done_before),
            None if budget.seconds is None else max(0.0, budget.seconds - spent_before),
        )
        own_measurer = measurer is None
        tuners: list[TaskTuner] = []
        confirmed: dict[str, Confirmation] = {}
        failures: list[ConfirmFailure] = []
        plans: list[PlanOutcome] = []
        interrupted, outcome = False, "failed"
        started = time.monotonic()
        try:
            if progress and resumed is not None:
                print(resumed.message(), file=progress_file or sys.stdout, flush=True)
            candidate_filter, oversample = make_candidate_filter(cost_model, database, target, seed=seed)
            if measurer is None:
                measurer = create_measurer(target, workers=workers)
            tuners = [
                TaskTuner(
                    t,
                    database,
                    measurer,
                    sampler,
                    seed=seed + i + seed_offset,
                    early_stop=early_stop,
                    run_id=run_id,
                    candidate_filter=candidate_filter,
                    oversample=oversample,
                    share=share,
                )
                for i, t in enumerate(chosen)
            ]
            before = database.run_record_counts(run_id)
            for t in tuners:
                t.state.measured = before.get(t.task.workload_key, 0)
            group_tuners = {t.task.workload_key: t for t in tuners}

            def make_tuner(task: Task) -> TaskTuner:  # a group that only another fusion plan makes
                database.commit_workload(
                    task.workload_key, task.group.canonical(), task.kind, task.flops, task.bytes
                )
                return TaskTuner(
                    task,
                    database,
                    measurer,
                    sampler,
                    seed=seed + len(group_tuners) + seed_offset,
                    early_stop=early_stop,
                    run_id=run_id,
                    candidate_filter=candidate_filter,
                    oversample=oversample,
                    share=share,
                )

            searches = [
                PlanSearch(r, optimized, target, group_tuners, make_tuner, seed=seed) for r in plan_regions
            ]
            display: Any = contextlib.nullcontext()
            if progress:
                display = LiveProgress(
                    tuners,
                    _budget_text(budget, total_trials),
                    total_trials=total_trials,
                    seconds=budget.seconds,
                    done=done_before,
                    spent_seconds=spent_before,
                    file=progress_file,
                )
            with display as live:
                on_round = live.update if live is not None else None
                # a trial budget keeps room for re-measuring the plans that beat the rules (confirm_plans)
                reserve = confirm_reserve(searches, left.trials)
                first = Budget(left.trials - reserve, left.seconds) if reserve else left
                try:
                    if _has_budget(first):
                        TaskScheduler(
                            [*tuners, *searches], first, batch, seed=seed, on_round=on_round, share=share
                        ).run()
                    if searches:
                        used = confirm_plans(searches, measurer, database, run_id, reserve or None)
                        if reserve > used:  # what confirming did not use goes back to the schedule tasks
                            rest = Budget(reserve - used)
                            TaskScheduler(
                                tuners, rest, batch, seed=seed, on_round=on_round, share=share
                            ).run()
                except KeyboardInterrupt:
                    interrupted = True
            if searches and not interrupted:
                # a plan that wins the sum of kernels replaces the rules' only if the whole model is faster
                configs, timer = database_config_source(database), whole_timer or InterleavedWholeTimer()
                for search in searches:
                    search.check_whole(configs, timer)
            for search in searches:
                found = search.outcome()
                if found is not None:
                    found.commit(database, target.key)
                    plans.append(found)
            if not interrupted and confirm_rounds > 0:
                try:
                    # every task, and the groups only a stored fusion plan makes (compile applies their
                    # records too), each refreshed first: the plans' re-measurements were committed after
                    # the search, and compile applies the best record of the database
                    planned = {k for p in plans for k in p.workloads}
                    extra = [t for k, t in group_tuners.items() if k in planned]
                    confirming = list({t.task.workload_key: t for t in [*tuners, *extra]}.values())
                    for t in confirming:
                        t.refresh()
                    # what compile would apply by the selection rule (db.selection), or the record that
                    # would displace it: the lowest median, which alone is not trusted under load
                    chosen = {t.task.workload_key: selection(database, t.task) for t in confirming}
                    rivals = {k: sel.rival for k, sel in chosen.items() if sel.rival is not None}
                    confirmed, failures = confirm_tasks(
                        [(t.task, chosen[t.task.workload_key].to_confirm) for t in confirming],
                        database,
                        measurer,
                        rounds=confirm_rounds,
                        run_id=run_id,
                        on_task=_confirm_printer(progress, progress_file, confirm_rounds, database),
                        rivals=rivals,
                    )
                    # the summary's speed-up of a task is that of the record compile applies (an earlier
                    # run's confirmed record can outlive this run's candidate confirmed not faster)
                    for t in confirming:
                        applied = selection(database, t.task).confirmation
                        if applied is not None:
                            confirmed[t.task.workload_key] = applied
                except KeyboardInterrupt:
                    interrupted = True
            outcome = "interrupted" if interrupted else "complete"
        except Exception as exc:
            _raise_database_error(database, exc)
            raise
        finally:
            try:
                if own_measurer and measurer is not None:
                    measurer.close()
            finally:
                try:
                    spent = spent_before + time.monotonic() - started
                    with leases.mutex(mutex):  # the last worker to leave closes the run
                        leases.release([worker_key])
                        if not leases.live(WORKER, run_id):
                            leases.purge_expired()  # what dead workers left behind
                            database.finish_run(
                                run_id, {**spec, "outcome": outcome, "spent_seconds": round(spent, 3)}
                            )
                finally:
                    share.close()
        counts = database.run_record_counts(run_id)
        results = [
            dataclasses.replace(TaskResult.of(t), measured=counts.get(t.task.workload_key, 0)) for t in tuners
        ]
        stored = sum(counts.values())
        measured_now = sum(t.state.measured for t in tuners) - sum(before.values()) if tuners else 0
        timing = None
        if time_model and not interrupted and not tasks and target.kind == "cpu":
            timing = time_compiled_model(graph, target, database)
    return TuneSummary(
        run_id,
        graph.name,
        target.key,
        results,
        measured_now,
        interrupted,
        timing,
        stored=stored,
        budget_trials=total_trials,
        budget_seconds=budget.seconds,
        resumed=resumed,
        confirmations=confirmed,
        confirm_failures={f.task.workload_key: f.error for f in failures},
        plans=plans,
    )


def _confirm_printer(
    progress: bool, file: TextIO | None, rounds: int, db: TuningDatabase
) -> Callable[[Task, Confirmation | ConfirmFailure | None], None] | None:
    """What ``kiln tune`` prints as each task's best candidate is confirmed (None: print nothing)."""
    if not progress:
        return None

    def show(task: Task, outcome: Confirmation | ConfirmFailure | None) -> None:
        if isinstance(outcome, ConfirmFailure):
            text = f"not confirmed ({outcome.error}); {applied_text(selection(db, task))}"
        elif outcome is None:
            text = "the best config found is the default (nothing to confirm)"
        else:
            text = f"{speedup_text(outcome)} over default"
            sel = selection(db, task)
            if not outcome.better:
                text += f": not faster, {applied_text(sel)}"
            elif sel.confirmation is None or sel.confirmation.id != outcome.id:
                text += f"; {applied_text(sel)}"  # another record confirmed faster stays
        n = outcome.rounds if isinstance(outcome, Confirmation) else rounds
        print(f"confirm {task.name} ({n} interleaved rounds): {text}", file=file or sys.stdout, flush=True)

    return show


def _raise_database_error(database: TuningDatabase, exc: Exception) -> None:
    """Raise a SQLAlchemy error that escaped the run (leases, records, run rows) as one DatabaseError naming
    the database, never a traceback through SQLAlchemy's internals; return for any other error."""
    from sqlalchemy.exc import SQLAlchemyError

    from db.engine import translate_errors

    if isinstance(exc, SQLAlchemyError):
        with translate_errors(database._url, "tune"):
            raise exc from None


def plan_search_fits(total_trials: int | None, n_tasks: int, plan_regions: Sequence[Any]) -> bool:
    """Whether ``kiln tune --fusion auto`` searches fusion plans: when the budget is a time, or when the
    trials cover a warm-up batch per task plus, per region, two other plans' groups (``GROUP_TRIALS``
    each) and the re-measurement that confirms a plan against the rules."""
    if not plan_regions:
        return False
    per_region = 2 * GROUP_TRIALS + CONFIRM_ROUNDS * CONFIRM_GROUPS
    return total_trials is None or total_trials >= 8 * n_tasks + per_region * len(plan_regions)


def _has_budget(budget: Budget) -> bool:
    return not (budget.trials == 0 or (budget.seconds is not None and budget.seconds <= 0))


def _now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _resume_key(spec: dict) -> dict:
    return {k: spec.get(k) for k in ("trials", "seconds", "trials_per_task", "sampler", "args")}


def _unfinished_run(
    db: TuningDatabase, graph: Graph, target: Target, spec: dict, leases: Leases
) -> tuple[int, Resume] | None:
    """The latest run of this model (same structure) on ``target`` with the same budget and arguments,
    when it did not complete, with what it had stored and spent and how many live workers tune it; None
    otherwise."""
    model_hash = graph.structural_hash()
    same = [
        r
        for r in db.runs(graph.name)
        if r.model_hash == model_hash
        and r.target_key == target.key
        and "args" in r.budget
        and _resume_key(r.budget) == _resume_key(spec)
    ]
    if not same:
        return None
    run = max(same, key=lambda r: r.id)
    if run.budget.get("outcome") == "complete":
        return None
    done = sum(db.run_record_counts(run.id).values())
    workers = leases.live(WORKER, run.id)
    spent = float(run.budget.get("spent_seconds") or 0.0)
    if run.budget.get("outcome") is None:  # live, or killed: the time up to now / its last record is spent
        last = datetime.now(UTC) if workers else db.run_last_record_at(run.id)
        since = run.budget.get("resumed_at")
        start = run.started_at
        if since:
            start = datetime.strptime(since, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
        if last is not None and last > start:
            spent += (last - start).total_seconds()
    return run.id, Resume(run.id, done, spec["trials"], spent, spec["seconds"], workers)


def _begin_run(
    db: TuningDatabase,
    graph: Graph,
    target: Target,
    tasks: Sequence[Task],
    spec: dict,
    whole: bool,
    cmd: str | None,
) -> int:
    """Commit the target, the tasks' workloads (and, for a whole-model run, the model's task list), then
    open a run row (its budget JSON holds the budget and the arguments a rerun must match to resume it)
    and return its id."""
    db.commit_target(target.key, target.to_json())
    for t in tasks:
        db.commit_workload(t.workload_key, t.group.canonical(), t.kind, t.flops, t.bytes)
    model_hash = graph.structural_hash()
    if whole:
        db.register_model_tasks(graph.name, model_hash, [(t.workload_key, t.weight) for t in tasks])
    return db.begin_run(graph.name, model_hash, target.key, spec, cmd or f"tuner.tune({graph.name!r})")


def _budget_text(budget: Budget, total_trials: int | None) -> str:
    """The budget as the progress display names it: ``64 trials``, ``90s``, ``10m``, ``1h``."""
    if total_trials is not None:
        if budget.trials_per_task is not None:
            return f"{total_trials} trials ({budget.trials_per_task} per task)"
        return f"{total_trials} trials"
    seconds = float(budget.seconds or 0)
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def time_compiled_model(graph: Graph, target: Target, db: TuningDatabase, rounds: int = 5) -> ModelTiming:
    """Whole-model latency compiled with default configs and with the tuned records, timed in ``rounds``
    interleaved rounds (each the median of 4 runs of one model then the other, the order alternating)."""
    import statistics

    inputs = random_inputs(graph, 0)
    default_model = compile(graph, target)
    tuned_model = compile(graph, target, db=db)
    for m in (default_model, tuned_model):
        m.timeit(inputs, repeats=1, warmup=3)
    per_round: list[tuple[float, float]] = []
    for i in range(rounds):
        order = (default_model, tuned_model) if i % 2 == 0 else (tuned_model, default_model)
        times = {id(m): m.timeit(inputs, repeats=4, warmup=1)["median_us"] for m in order}
        per_round.append((times[id(default_model)], times[id(tuned_model)]))
    ratios = [d / t for d, t in per_round]
    speedup = float(statistics.median(ratios))
    used = sum(1 for k in tuned_model.kernels if k.extra.get("origin") == "record")
    return ModelTiming(
        float(statistics.median(d for d, _ in per_round)),
        float(statistics.median(t for _, t in per_round)),
        used,
        len(tuned_model.kernels),
        speedup,
        (max(ratios) - min(ratios)) / 2 / speedup,
        rounds,
    )


__all__ = ["Budget", "ModelTiming", "Resume", "TaskResult", "TuneSummary", "compile", "select_tasks", "tune"]
