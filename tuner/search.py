"""Search one task with Optuna: ask a batch, filter, measure, record, tell.

One study per (workload, target, sketch version, space) is stored through Optuna's RDB storage in the
tuning database's own URL, so a run can be resumed and optuna-dashboard can open it. The rule-based
default config is enqueued first, so tuning never ends worse than the default. A config already
measured (in this study or in the database) is answered from its record instead of being measured again.
Every result, errors included, is committed to the tuning database.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from compiler.backends.sketch import Config
from db.records import RecordIn
from db.status import Status
from tuner.samplers import (
    add_result,
    distributions,
    encoding,
    from_params,
    make_sampler,
    screen,
    tell,
    to_params,
)
from tuner.space import config_json, space_signature
from tuner.task import Task

log = logging.getLogger("kiln.search")

# (task, asked configs, batch) -> the configs to measure: asked ones (the other asked ones are told PRUNED)
# and proposals of its own, which are measured and added to the study; set by the cost model
CandidateFilter = Callable[[Task, list[Config], int], list[Config]]


@dataclass
class TaskState:
    """What the scheduler needs to know about one task's search."""

    trials: int = 0  # configs told to Optuna (measured, replayed, or failed)
    measured: int = 0
    default_us: float | None = None
    best_us: float | None = None
    best_config: Config | None = None
    errors: dict[str, int] = field(default_factory=dict)
    history: list[tuple[int, float]] = field(default_factory=list)  # (trials, best_us) after each round
    since_improvement: int = 0
    done: bool = False

    @property
    def speedup(self) -> float | None:
        if self.default_us and self.best_us:
            return self.default_us / self.best_us
        return None


@dataclass(frozen=True)
class TaskResult:
    """Where the search of one task stands after a run: what it measured and the best it found.

    ``trials`` counts every config told to the search, including those replayed from earlier runs' records;
    ``measured`` counts the candidates measured (and committed to the database) by this run.
    """

    task: Task
    trials: int
    measured: int
    default_us: float | None
    best_us: float | None
    best_config: dict[str, Any] | None
    errors: dict[str, int]
    done: bool

    @property
    def speedup(self) -> float | None:
        """Default latency over best latency, when both were measured."""
        if self.default_us and self.best_us:
            return self.default_us / self.best_us
        return None

    @staticmethod
    def of(tuner: TaskTuner) -> TaskResult:
        """A snapshot of ``tuner``'s state."""
        s = tuner.state
        return TaskResult(
            tuner.task,
            s.trials,
            s.measured,
            s.default_us,
            s.best_us,
            dict(s.best_config) if s.best_config is not None else None,
            dict(s.errors),
            s.done,
        )


def study_name(task: Task) -> str:
    return (
        f"kiln:{task.workload_key[:16]}:{task.target.key}:{task.sketch.name}.v{task.sketch.version}:"
        f"{space_signature(task.space())}"
    )


class TaskTuner:
    """Optuna search of one task; :meth:`step` measures one batch."""

    def __init__(
        self,
        task: Task,
        db: Any,
        measurer: Any,
        storage: Any,
        sampler: str = "tpe",
        seed: int | None = None,
        early_stop: int | None = None,
        run_id: int | None = None,
        candidate_filter: CandidateFilter | None = None,
        oversample: int = 1,
    ) -> None:
        import optuna

        self.task, self.db, self.measurer, self.run_id = task, db, measurer, run_id
        self.space = task.space()
        self.how = encoding(sampler)
        self.sampler = sampler
        self.dists = distributions(self.space, self.how)
        self.early_stop = early_stop
        self.candidate_filter = candidate_filter
        self.oversample = max(1, oversample)
        self.state = TaskState()
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.study = optuna.create_study(
            study_name=study_name(task),
            storage=storage,
            sampler=make_sampler(sampler, seed),
            direction="minimize",
            load_if_exists=True,
        )
        self._fail_stale_trials()
        self.known: dict[str, tuple[Status, float | None]] = self._known_results()
        default = task.default()
        self.default_key = config_json(default)
        if self.default_key not in self.known:
            self.study.enqueue_trial(to_params(self.space, default, self.how), skip_if_exists=True)
        self._restore_state()

    # ------------------------------------------------------------------ setup
    def _fail_stale_trials(self) -> None:
        """Trials left RUNNING by an interrupted run are failed so the study stays consistent."""
        import optuna

        for t in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            self.study.tell(t.number, state=optuna.trial.TrialState.FAIL)

    def _known_results(self) -> dict[str, tuple[Status, float | None]]:
        out: dict[str, tuple[Status, float | None]] = {}
        for r in self.db.find_records(self.task.workload_key, self.task.target.key):
            if r.sketch != self.task.sketch.name or r.sketch_version != self.task.sketch.version:
                continue
            key = config_json(r.config)
            prev = out.get(key)
            if prev is None or (r.median_us is not None and (prev[1] is None or r.median_us < prev[1])):
                out[key] = (Status(r.status), r.median_us)
        return out

    def _restore_state(self) -> None:
        s = self.state
        for key, (status, median) in self.known.items():
            s.trials += 1
            if status == Status.OK and median is not None:
                if key == self.default_key:
                    s.default_us = median
                if s.best_us is None or median < s.best_us:
                    s.best_us, s.best_config = median, _loads(key)
            else:
                s.errors[status.value] = s.errors.get(status.value, 0) + 1
        if s.best_us is not None:
            s.history.append((s.trials, s.best_us))

    # ------------------------------------------------------------------- step
    def step(self, batch: int) -> int:
        """Ask, filter, measure, record and tell one batch; returns the number of measured candidates."""
        import optuna

        if self.state.done:
            return 0
        fresh: list[tuple[optuna.trial.Trial, Config]] = []
        seen_now: set[str] = set()
        asks = 0
        while len(fresh) < batch * self.oversample and asks < batch * self.oversample * 4:
            asks += 1
            trial = self.study.ask(self.dists)
            config = from_params(self.space, trial.params, self.how)
            key = config_json(config)
            if key in self.known:  # answer from the record, do not measure again
                status, median = self.known[key]
                self._tell(trial, status, median)
                continue
            if key in seen_now:
                self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                continue
            seen_now.add(key)
            fresh.append((trial, config))
        if not fresh:
            self.state.done = True  # the sampler keeps proposing measured configs: the space is exhausted
            return 0
        # the sketch's check before anything is measured, for every method: an invalid config is told as a
        # failed (infeasible) trial and never measured; it is no record (nothing was built or run: records
        # and trial budgets count measurements), and a resumed run checks it again (cheap, deterministic)
        for (t, c), why in zip(list(fresh), screen(self.task, [c for _, c in fresh])):
            if why is not None:
                fresh.remove((t, c))
                log.debug("%s: invalid config %s: %s", self.task.name, config_json(c), why)
                self.known[config_json(c)] = (Status.INVALID_CONFIG, None)
                self._tell(t, Status.INVALID_CONFIG, None, c)
        chosen: list[tuple[Any, Config]] = fresh
        if self.candidate_filter is not None and fresh:
            asked = {config_json(c): t for t, c in fresh}
            chosen, taken = [], set()
            for c in self.candidate_filter(self.task, [c for _, c in fresh], batch):
                key = config_json(c)
                if key in taken or key in self.known or (key not in asked and screen(self.task, [c])[0]):
                    continue
                taken.add(key)
                chosen.append((asked.get(key), c))  # None: the filter's own proposal, added after measuring
            for key, t in asked.items():
                if key not in taken:
                    self.study.tell(t, state=optuna.trial.TrialState.PRUNED)
        elif len(fresh) > batch:
            for t, _ in fresh[batch:]:
                self.study.tell(t, state=optuna.trial.TrialState.PRUNED)
            chosen = fresh[:batch]
        if not chosen:
            return 0
        results = self._measure([c for _, c in chosen])
        self.db.commit_records(
            [self._record(c, r.latencies_us, r.status, r.error) for (_, c), r in zip(chosen, results)]
        )
        before = self.state.best_us
        for (trial, config), r in zip(chosen, results):
            key = config_json(config)
            median = r.median_us if r.status == Status.OK else None
            self.known[key] = (Status(r.status), median)
            self.state.measured += 1
            if key == self.default_key and median is not None:
                self.state.default_us = median
            self._tell(trial, Status(r.status), median, config)
        improved = before is None or (self.state.best_us is not None and self.state.best_us < 0.99 * before)
        self.state.since_improvement = 0 if improved else self.state.since_improvement + len(chosen)
        if self.state.best_us is not None:
            self.state.history.append((self.state.trials, self.state.best_us))
        if self.early_stop is not None and self.state.since_improvement >= self.early_stop:
            self.state.done = True
        return len(chosen)

    def _record(self, config: Config, latencies: Any, status: Status, error: str | None) -> RecordIn:
        t = self.task
        return RecordIn(
            t.workload_key, t.target.key, t.sketch.name, t.sketch.version, config, latencies, status, error,
            self.run_id,
        )  # fmt: skip

    def _measure(self, configs: Sequence[Config]) -> list[Any]:
        from tuner.measure import MeasureInput

        inputs = []
        for c in configs:
            inputs.append(MeasureInput(self.task, c))
        return self.measurer.measure(inputs)

    def _tell(self, trial: Any, status: Status, median: float | None, config: Config | None = None) -> None:
        """Tell the study (a failure as an infeasible trial, see tuner.samplers); ``trial`` None: a
        candidate the cost model proposed, added to the study as a finished trial."""
        s = self.state
        s.trials += 1
        ok = status == Status.OK and median is not None
        if trial is None:
            assert config is not None
            add_result(
                self.study,
                self.dists,
                to_params(self.space, config, self.how),
                median if ok else None,
                self.sampler,
            )
        else:
            tell(self.study, trial, median if ok else None, self.sampler)
        if ok:
            if s.best_us is None or median < s.best_us:
                s.best_us, s.best_config = median, config or from_params(self.space, trial.params, self.how)
        else:
            s.errors[status.value] = s.errors.get(status.value, 0) + 1


def _loads(key: str) -> Config:
    return json.loads(key)
