"""Search one task with Optuna: refresh from the records, ask a batch, filter, claim, measure, record, tell.

The tuning database's records are the one history. Each worker keeps a private in-memory Optuna study per
task, seeded with the task's records and refreshed with the records other workers commit, so a run
resumes (and several workers cooperate) without any Optuna state in the database. The rule-based default
config is enqueued first, so tuning never ends worse than the default. A config already measured (by
anyone) is answered from its record instead of being measured again, and a candidate is claimed before it
is measured (:mod:`tuner.workers`). Every result, errors included, is committed to the tuning database.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

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
from tuner.space import config_json
from tuner.task import Task
from tuner.workers import LocalShare, WorkShare

if TYPE_CHECKING:
    from db.leases import Ident

log = logging.getLogger("kiln.search")

# (task, asked configs, batch) -> the configs to measure: asked ones (the other asked ones are told PRUNED)
# and proposals of its own, which are measured and added to the study; set by the cost model
CandidateFilter = Callable[[Task, list[Config], int], list[Config]]


ENUMERATE_LIMIT = 20_000  # spaces up to this many configs are enumerated to find the unmeasured ones


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


class TaskTuner:
    """Optuna search of one task; :meth:`step` measures one batch.

    The records are the one history: the study is an in-memory Optuna study of this process, seeded with
    every record of the task (its workload, target, sketch and version) and refreshed with the records
    other workers (or runs) committed before each batch. Nothing of the study is stored, so nothing needs
    repairing after a kill. With a :class:`~tuner.workers.WorkShare` (default: a worker alone), each
    candidate is claimed before it is measured, so workers sharing a database never measure a config
    twice.
    """

    def __init__(
        self,
        task: Task,
        db: Any,
        measurer: Any,
        sampler: str = "tpe",
        seed: int | None = None,
        early_stop: int | None = None,
        run_id: int | None = None,
        candidate_filter: CandidateFilter | None = None,
        oversample: int = 1,
        share: WorkShare | None = None,
    ) -> None:
        import optuna

        self.task, self.db, self.measurer, self.run_id = task, db, measurer, run_id
        self.ident: Ident = (task.workload_key, task.target.key, task.sketch.name, task.sketch.version)
        self.space = task.space()
        self.how = encoding(sampler)
        self.sampler = sampler
        self.dists = distributions(self.space, self.how)
        self.early_stop = early_stop
        self.candidate_filter = candidate_filter
        self.oversample = max(1, oversample)
        self.share = share if share is not None else LocalShare()
        self.rng = random.Random(seed)
        self.state = TaskState()
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.study = optuna.create_study(sampler=make_sampler(sampler, seed), direction="minimize")
        self.known: dict[str, tuple[Status, float | None]] = {}
        self._last_id = 0
        default = task.default()
        self.default_key = config_json(default)
        self.refresh(initial=True)
        if self.default_key not in self.known:
            self.study.enqueue_trial(to_params(self.space, default, self.how), skip_if_exists=True)

    # ------------------------------------------------------------ the records
    def refresh(self, initial: bool = False) -> int:
        """Read the task's records committed since the last look (all of them the first time) into the
        study and the state; returns how many were new. Records read at start do not count towards early
        stopping (a rerun continues a task, it does not inherit its plateau)."""
        from db.leases import records_since

        new = records_since(self.db, self.ident, self._last_id)
        for r in new:
            self._last_id = max(self._last_id, r.id)
            key = config_json(r.config)
            if key in self.known:  # measured by this worker (already told) or twice
                continue
            status = Status(r.status)
            median = r.median_us if status == Status.OK else None
            self.known[key] = (status, median)
            self._add_trial(r.config, status, median)
            self._account(key, status, median, count=not initial)
        if new and self.state.best_us is not None:
            self.state.history.append((self.state.trials, self.state.best_us))
        self._check_early_stop()
        return len(new)

    def _add_trial(self, config: Config, status: Status, median: float | None) -> None:
        """Add a finished trial for a recorded config (one outside today's knob space is left out)."""

        try:
            params = to_params(self.space, config, self.how)
            for name, value in params.items():
                self.dists[name].to_internal_repr(value)
        except (KeyError, ValueError, TypeError):
            return
        ok = status == Status.OK and median is not None
        add_result(self.study, self.dists, params, median if ok else None, self.sampler)

    def _account(self, key: str, status: Status, median: float | None, count: bool = True) -> None:
        """Update the state with one config's result (``count``: towards early stopping)."""
        s = self.state
        s.trials += 1
        if status == Status.OK and median is not None:
            if key == self.default_key:
                s.default_us = median
            improved = s.best_us is None or median < 0.99 * s.best_us
            if s.best_us is None or median < s.best_us:
                s.best_us, s.best_config = median, _loads(key)
            if count:
                s.since_improvement = 0 if improved else s.since_improvement + 1
        else:
            s.errors[status.value] = s.errors.get(status.value, 0) + 1
            if count:
                s.since_improvement += 1

    def _check_early_stop(self) -> None:
        if self.early_stop is not None and self.state.since_improvement >= self.early_stop:
            self.state.done = True

    # ------------------------------------------------------------------- step
    def step(self, batch: int) -> int:
        """Refresh from the records, then ask, filter, claim, measure, record and tell one batch; returns
        the number of candidates this worker measured (0 when other workers hold every candidate)."""
        import optuna

        if self.state.done:
            return 0
        self.refresh()
        if self.state.done:
            return 0
        fresh: list[tuple[optuna.trial.Trial, Config]] = []
        seen_now: set[str] = set()
        asks = screened = 0
        while len(fresh) < batch * self.oversample and asks < batch * self.oversample * 4:
            asks += 1
            trial = self.study.ask(self.dists)
            config = from_params(self.space, trial.params, self.how)
            key = config_json(config)
            if key in self.known:  # answer from the record, do not measure again
                self._tell(trial, *self.known[key])
                continue
            if key in seen_now:
                self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                continue
            seen_now.add(key)
            # the sketch's check before anything is measured, for every method: an invalid config is told
            # as a failed (infeasible) trial and never measured; it is no record (nothing was built or run:
            # records and trial budgets count measurements), and a resumed run checks it again (cheap)
            why = screen(self.task, [config])[0]
            if why is not None:
                log.debug("%s: invalid config %s: %s", self.task.name, key, why)
                self.known[key] = (Status.INVALID_CONFIG, None)
                self._tell(trial, Status.INVALID_CONFIG, None, config)
                self._account(key, Status.INVALID_CONFIG, None)
                screened += 1
                continue
            fresh.append((trial, config))
        if not fresh and not screened:  # the sampler keeps proposing measured configs
            fresh = [(None, c) for c in self._unexplored(batch * self.oversample, seen_now)]
            if not fresh:  # not a config of the space is left unmeasured
                self.state.done = True
        if not fresh:
            self._check_early_stop()
            return 0
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
                if key not in taken and t is not None:  # None: drawn from the space, never asked
                    self.study.tell(t, state=optuna.trial.TrialState.PRUNED)
        elif len(fresh) > batch:
            for t, _ in fresh[batch:]:
                if t is not None:
                    self.study.tell(t, state=optuna.trial.TrialState.PRUNED)
            chosen = fresh[:batch]
        claimed, _ = self.share.claim(self.ident, [config_json(c) for _, c in chosen])
        mine = set(claimed)
        for t, c in chosen:  # another worker measures (or measured) it: its record comes with a refresh
            if t is not None and config_json(c) not in mine:
                self.study.tell(t, state=optuna.trial.TrialState.FAIL)
        chosen = [(t, c) for t, c in chosen if config_json(c) in mine]
        if not chosen:
            return 0
        try:
            results = self._measure([c for _, c in chosen])
            recs = [
                RecordIn(*self.ident, c, r.latencies_us, r.status, r.error, self.run_id)
                for (_, c), r in zip(chosen, results)
            ]
            self.db.commit_records(recs)
        finally:
            self.share.release(self.ident, claimed)
        for (trial, config), r in zip(chosen, results):
            key = config_json(config)
            status = Status(r.status)
            median = r.median_us if status == Status.OK else None
            self.known[key] = (status, median)
            self.state.measured += 1
            self._tell(trial, status, median, config)
            self._account(key, status, median)
        if self.state.best_us is not None:
            self.state.history.append((self.state.trials, self.state.best_us))
        self._check_early_stop()
        return len(chosen)

    def _unexplored(self, n: int, skip: set[str]) -> list[Config]:
        """Up to ``n`` valid configs of the space with no record, drawn uniformly at random: what a step
        measures when the sampler keeps proposing measured configs (TPE does, once it has settled on a
        region). The whole space is enumerated when it is small, so an empty answer there means every
        config was measured; a large space is sampled (``64 * n`` draws)."""
        names = [k.name for k in self.space]
        size = math.prod(len(k.values) for k in self.space)
        if size <= ENUMERATE_LIMIT:
            pool = [dict(zip(names, values)) for values in itertools.product(*(k.values for k in self.space))]
            self.rng.shuffle(pool)
        else:
            pool = [{k.name: self.rng.choice(k.values) for k in self.space} for _ in range(64 * n)]
        out: list[Config] = []
        for config in pool:
            key = config_json(config)
            if key in self.known or key in skip:
                continue
            skip.add(key)
            why = screen(self.task, [config])[0]
            if why is not None:
                self.known[key] = (Status.INVALID_CONFIG, None)
                continue
            out.append(config)
            if len(out) >= n:
                break
        return out

    def _measure(self, configs: Sequence[Config]) -> list[Any]:
        from tuner.measure import MeasureInput

        return self.measurer.measure([MeasureInput(self.task, c) for c in configs])

    def _tell(self, trial: Any, status: Status, median: float | None, config: Config | None = None) -> None:
        """Tell the study one result (a failure as an infeasible trial, see tuner.samplers); ``trial`` None:
        a candidate the cost model proposed, added to the study as a finished trial. The state is updated
        by :meth:`_account`, not here."""
        ok = status == Status.OK and median is not None
        if trial is None:
            assert config is not None
            params = to_params(self.space, config, self.how)
            add_result(self.study, self.dists, params, median if ok else None, self.sampler)
        else:
            tell(self.study, trial, median if ok else None, self.sampler)


def _loads(key: str) -> Config:
    return json.loads(key)
