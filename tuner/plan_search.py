"""Fusion decisions searched per region: which optional fusion edges of a region to take.

A region (:func:`compiler.fusion.regions`) has optional edges; a plan is edge -> fuse or not. During the
search a plan is scored by the sum of the best measured latencies of the region's groups under it (weight x
latency: a workload that occurs twice counts twice). A group's workload key does not depend on the plan, so
a group already measured under another plan (or as an ordinary schedule task) is reused as it is; a new
group is tuned with a small budget (``group_trials`` measured candidates) through the same
:class:`TaskTuner` / measurer path as every schedule task, and its records go to the database like any
other.

The sum of isolated kernel latencies ranks plans cheaply, but it is not what a plan is kept by: it cannot see
what separates two kernels in the model (the intermediate written by one and read back by the next, the cache
state a kernel finds there instead of the inputs the harness keeps warm, each extra call). On the CPU, the
plans that beat the rules' plan by the sum (the finalists) are then compiled as whole models beside the rules'
plan and timed end to end (:meth:`PlanSearch.check_whole`, :mod:`tuner.plan_whole`); a plan replaces the
rules' only when the whole model under it is ``MIN_GAIN`` faster. On CUDA the whole model is not timed and
the sum of kernels decides (logged).

Search order (:class:`PlanSearch`): the rules' plan first, then every single-edge flip ranked by the cost
model's estimate (the analytic roofline of each unmeasured group's default schedule, scaled by the
measured groups; horizontal edges first, which the estimate cannot rank), then Optuna (TPE, one
categorical per edge) asks a few plans per round and the estimate picks the one to measure.
``PlanSearch`` has the interface the :class:`~tuner.scheduler.TaskScheduler` uses (``task.weight``,
``task.name``, ``state``, ``step(batch)``), so one budget is shared between the schedule tasks and the
plan search. At the end, :meth:`PlanSearch.confirm` re-measures the groups of the best plans and the rules'
side by side (a plan must not win by a group measured during a busy moment), then
:meth:`PlanSearch.check_whole` times the finalists as whole models, and :meth:`PlanSearch.outcome` decides.

Records: the plan of a region on a target is stored (``kiln_fusion_plans``) with its latency and the
rules' plan's latency (sums of kernels), both whole-model latencies where they were timed
(``whole_us``, ``rule_whole_us``), region-local edge ids. :func:`database_plan` is what compile uses: it
applies a stored plan only when it beats the rules (on the CPU: by the whole model; a plan stored without
whole-model latencies is not applied there), and reports and skips a plan whose edges the region no longer
has.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from compiler.backends import get_backend
from compiler.errors import KilnError, ScheduleError
from compiler.fusion import FusionPlan, Group, Region, fuse, regions
from compiler.graph import Graph
from compiler.target import Target
from tuner.search import TaskState, TaskTuner
from tuner.space import config_json
from tuner.task import Task, tasks_of_groups

log = logging.getLogger("kiln.plans")

GROUP_TRIALS = 8  # measured candidates for each group a plan brings in (its schedule's small budget)
ASK_PER_ROUND = 8  # plans Optuna proposes per round; the cost model picks one to measure
CONFIRM_PLANS = 2  # plans re-measured against the rules' plan at the end (the best scored ones)
# a plan scored up to this factor above the rules' plan is re-measured too: on a loaded machine a group
# measured during a busy moment (2-3x its quiet latency) makes a winning plan look like a loser, and only
# re-measuring both plans' groups side by side tells them apart
CONFIRM_WITHIN = 1.15
MIN_GAIN = 0.02  # a plan replaces the rules' only when its confirmed latency is at least this much lower
CONFIRM_ROUNDS = 3  # interleaved re-measurement rounds
CONFIRM_GROUPS = 6  # groups a region's confirmation is budgeted for (trial budgets keep that much aside)


def target_regions(graph: Graph, target: Target) -> list[Region]:
    """The regions of ``graph`` (optimized) whose optional edges give groups ``target``'s backend can
    schedule (on CUDA, the split-K edges of its SM count among them)."""
    backend = get_backend(target)

    def has_sketch(group: Group) -> bool:
        try:
            backend.sketch_for(group)
        except KilnError:
            return False
        return True

    return regions(graph, has_sketch, target)


def plan_problem(graph: Graph, plan: FusionPlan, target: Target) -> str | None:
    """Why ``target``'s backend cannot compile ``graph`` (optimized) under ``plan`` (whole-graph edge ids):
    a group that no sketch of the backend schedules; None when every group has one."""
    backend = get_backend(target)
    for group in fuse(graph, plan, target).groups:
        if group.is_view:
            continue
        try:
            backend.sketch_for(group)
        except KilnError as exc:
            return str(exc)
    return None


def region_groups(graph: Graph, region: Region, local_plan: FusionPlan) -> list[Group]:
    """The groups holding the region's nodes when the region follows ``local_plan`` (other edges: rules)."""
    fused = fuse(graph, region.to_global(local_plan), region.target)
    mine = {id(n) for n in region.nodes}
    return [g for g in fused.groups if any(id(fused.source(n)) in mine for n in g.nodes)]


def _same_anchor(group: Group, anchor: Any) -> bool:
    """Whether ``group``'s anchor computes the same thing as ``anchor``: op, attributes and shapes."""
    a = group.anchor
    return (
        a is not None
        and a.op == anchor.op
        and a.attrs == anchor.attrs
        and [v.shape for v in a.inputs] == [v.shape for v in anchor.inputs]
    )


def plan_json(plan: FusionPlan) -> str:
    return config_json({k: int(bool(v)) for k, v in plan.items()})


@dataclass
class PlanResult:
    """A plan of a region and what it costs: per group (workload key, weight); latency once measured."""

    plan: FusionPlan  # region-local edge id -> fuse
    tasks: list[Task]
    latency_us: float | None = None
    problem: str | None = None  # why the target cannot compile the plan's groups (never measured)

    def groups(self) -> list[tuple[str, int]]:
        return [(t.workload_key, t.weight) for t in self.tasks]


class PlanEstimator:
    """The cost model's estimate of a plan before its groups are measured: measured groups count with their
    best latency, unmeasured ones with the analytic roofline of their default schedule (``est_log_cycles``),
    scaled to microseconds by the median measured/estimated ratio of the groups measured so far."""

    def __init__(self) -> None:
        from cost_model.features import EST_INDEX, FeatureExtractor

        self.extractor = FeatureExtractor()
        self.index = EST_INDEX
        self.ratios: dict[str, float] = {}

    def cycles(self, task: Task) -> float | None:
        vec = self.extractor.for_task(task, task.default())
        return None if vec is None else float(2.0 ** float(vec[self.index]))

    def learn(self, task: Task, measured_us: float) -> None:
        c = self.cycles(task)
        if c and measured_us > 0:
            self.ratios[task.workload_key] = measured_us / c

    def estimate(self, tasks: Sequence[Task], measured: Callable[[str], float | None]) -> float:
        scale = statistics.median(self.ratios.values()) if self.ratios else 1e-3
        total = 0.0
        for t in tasks:
            us = measured(t.workload_key)
            if us is None:
                c = self.cycles(t)
                us = math.inf if c is None else c * scale
            total += t.weight * us
        return total


@dataclass
class _RegionTask:
    """What the scheduler and the progress display read of a plan search (the role of ``Task``)."""

    region: Region
    weight: int = 1
    kind: str = "fusion plan"

    @property
    def name(self) -> str:
        return f"plans:r{self.region.index}[{self.region.key[:8]}]"

    @property
    def workload_key(self) -> str:
        return f"plan:{self.region.key}"


class PlanSearch:
    """Search the fusion plans of one region (see the module docstring). ``tuners`` maps workload keys to
    the :class:`TaskTuner` of each group measured so far (the schedule tasks' tuners to start with; it is
    shared between the regions of a model); ``make_tuner(task)`` makes one for a group no plan had before
    (and commits its workload). ``max_plans`` bounds the plans measured."""

    def __init__(
        self,
        region: Region,
        graph: Graph,
        target: Target,
        tuners: dict[str, TaskTuner],
        make_tuner: Callable[[Task], TaskTuner],
        *,
        group_trials: int = GROUP_TRIALS,
        max_plans: int | None = None,
        seed: int = 0,
        estimator: PlanEstimator | None = None,
    ) -> None:
        import optuna

        self.region, self.graph, self.target = region, graph, target
        self.tuners, self.make_tuner = tuners, make_tuner
        self.group_trials = group_trials
        self.max_plans = max_plans if max_plans is not None else 2 + 2 * len(region.edges)
        self.estimator = estimator or PlanEstimator()
        self.task = _RegionTask(region)
        self.state = TaskState()
        self.results: dict[str, PlanResult] = {}
        self.rule = region.rule_plan()
        self.queue: list[FusionPlan] = [self.rule]
        self.flips_queued = False
        self.pending: PlanResult | None = None
        self.pending_trial: Any = None
        self.confirmed: dict[str, float] = {}  # workload key -> re-measured latency (see confirm)
        self.finalists: set[str] | None = None  # the plans confirm compared (None: every measured plan)
        self.whole: Any = None  # the whole-model timing of check_whole (a tuner.plan_whole.WholeTiming)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.dists = {k: optuna.distributions.CategoricalDistribution((0, 1)) for k in self.rule}
        self.study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed), direction="minimize")

    # ------------------------------------------------------------- plans
    def result_for(self, plan: FusionPlan) -> PlanResult:
        key = plan_json(plan)
        if key not in self.results:
            try:
                tasks = tasks_of_groups(region_groups(self.graph, self.region, plan), self.target)
                self.results[key] = PlanResult(dict(plan), tasks)
            except KilnError as exc:  # a group no sketch of the target schedules: not a candidate
                self.results[key] = PlanResult(dict(plan), [], math.inf, str(exc))
        return self.results[key]

    def best_us(self, key: str) -> float | None:
        if key in self.confirmed:
            return self.confirmed[key]
        t = self.tuners.get(key)
        return None if t is None else t.state.best_us

    def score(self, result: PlanResult) -> float | None:
        if result.problem is not None:
            return None
        total = 0.0
        for key, weight in result.groups():
            us = self.best_us(key)
            if us is None:
                return None
            total += weight * us
        return total

    def _estimate(self, plan: FusionPlan) -> float:
        result = self.result_for(plan)
        if result.problem is not None:
            return math.inf
        return self.estimator.estimate(result.tasks, self.best_us)

    def _queue_flips(self) -> None:
        """Every single-edge flip of the rules' plan, best estimate first; horizontal edges (sibling GEMMs
        merged) go first whatever their estimate: the roofline of each group's default schedule does not see
        what merging buys (the shared operand read and packed once, fewer launches), so the estimate would
        rank them last and a small budget would never measure them."""
        horizontal = {self.region.local_ids[e.id] for e in self.region.edges if e.rule == "horizontal"}
        flips = [{**self.rule, k: not v} for k, v in self.rule.items()]
        flips.sort(key=lambda p: (not any(p[k] != self.rule[k] for k in horizontal), self._estimate(p)))
        self.queue += flips
        self.flips_queued = True

    def _ask(self) -> FusionPlan | None:
        """A new plan from Optuna: ``ASK_PER_ROUND`` asked, the best estimate kept, the others pruned."""
        import optuna

        asked = []
        for _ in range(ASK_PER_ROUND):
            trial = self.study.ask(self.dists)
            plan = {k: bool(trial.params[k]) for k in self.rule}
            known = self.results.get(plan_json(plan))
            if known is None and self.result_for(plan).problem is not None:
                known = self.results[plan_json(plan)]
            if known is not None and known.problem is not None:
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            elif known is not None and known.latency_us is not None:
                self.study.tell(trial, known.latency_us)
            elif known is not None or any(plan == p for _, p in asked):
                self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            else:
                asked.append((trial, plan))
        if not asked:
            return None
        asked.sort(key=lambda tp: self._estimate(tp[1]))
        for trial, _ in asked[1:]:
            self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        self.pending_trial = asked[0][0]
        return asked[0][1]

    def _next(self) -> PlanResult | None:
        if len([r for r in self.results.values() if r.latency_us is not None]) >= self.max_plans:
            return None
        while True:
            if not self.queue and not self.flips_queued and self.rule_done:
                self._queue_flips()
            if self.queue:
                plan = self.queue.pop(0)
                self.pending_trial = None
                result = self.result_for(plan)
                if result.latency_us is None:
                    return result
                continue
            if not self.rule_done:
                return None
            plan = self._ask()
            return None if plan is None else self.result_for(plan)

    @property
    def rule_done(self) -> bool:
        r = self.results.get(plan_json(self.rule))
        return r is not None and r.latency_us is not None

    # -------------------------------------------------------------- step
    @property
    def ident(self) -> tuple[str, str, str, int]:
        """What the scheduler leases so that two workers do not search one region's plans at once."""
        return (self.task.workload_key, self.target.key, "fusion-plan", 1)

    def refresh(self, initial: bool = False) -> int:
        """Read other workers' new records into the tuners of the plan being measured (the plan search itself
        keeps no records of its own: its plans are scored from its groups' records); returns how many."""
        if self.pending is None:
            return 0
        tuners = (self.tuners.get(task.workload_key) for task in self.pending.tasks)
        return sum(t.refresh() for t in tuners if t is not None)

    def _tuner(self, task: Task) -> TaskTuner:
        t = self.tuners.get(task.workload_key)
        if t is None:
            t = self.make_tuner(task)
            self.tuners[task.workload_key] = t
            self._seed(t)
        return t

    def _seed(self, tuner: TaskTuner) -> None:
        """Start a new group from the best schedule found so far for a group with the same anchor (the same
        GEMM, conv or reduction with another prologue/epilogue) when that config is legal for it, so two plans
        compare their fusion, not the luck of two small schedule searches. A group no such group exists for
        but whose anchor is the same op on other shapes (the Q/K/V GEMMs merged into one N = 3d GEMM) starts
        from those groups' best configs instead: its own few trials would otherwise race siblings tuned as
        full schedule tasks."""
        from tuner.samplers import to_params

        anchor = tuner.task.group.anchor
        if anchor is None:
            return
        others = [
            o
            for o in list(self.tuners.values())
            if o is not tuner
            and o.state.best_config is not None
            and o.task.sketch.name == tuner.task.sketch.name
            and o.task.group.anchor is not None
            and o.task.group.anchor.op == anchor.op
            and o.task.group.anchor.attrs == anchor.attrs
        ]
        same = [o for o in others if _same_anchor(o.task.group, anchor)]
        for other in same or others:
            try:
                tuner.task.check(other.state.best_config)
                params = to_params(tuner.space, other.state.best_config, tuner.how)
            except (KilnError, ScheduleError, KeyError, ValueError):
                continue
            tuner.study.enqueue_trial(params, skip_if_exists=True)

    def step(self, batch: int) -> int:
        """Spend up to ``batch`` measured candidates on the plans; returns how many were measured."""
        spent = 0
        while spent < batch and not self.state.done:
            if self.pending is None:
                self.pending = self._next()
                if self.pending is None:
                    self.state.done = True
                    break
            todo = [
                t
                for t in (self._tuner(task) for task in self.pending.tasks)
                if t.state.trials < self.group_trials and not t.state.done
            ]
            if todo:
                t = todo[0]
                n = t.step(min(batch - spent, self.group_trials - t.state.trials))
                spent += n
                if n == 0 and not t.state.done:
                    t.state.done = True  # nothing new to measure: count it as tuned
                continue
            self._finish(self.pending)
            self.pending = None
        self.state.measured += spent
        return spent

    def _finish(self, result: PlanResult) -> None:
        import optuna

        latency = self.score(result)
        result.latency_us = math.inf if latency is None else latency
        for task in result.tasks:
            us = self.best_us(task.workload_key)
            if us is not None:
                self.estimator.learn(task, us)
        params = {k: int(v) for k, v in result.plan.items()}
        if self.pending_trial is not None:
            if latency is None:
                self.study.tell(self.pending_trial, state=optuna.trial.TrialState.FAIL)
            else:
                self.study.tell(self.pending_trial, latency)
            self.pending_trial = None
        elif latency is not None:
            self.study.add_trial(
                optuna.trial.create_trial(params=params, distributions=self.dists, value=latency)
            )
        s = self.state
        s.trials += 1
        if latency is not None:
            if result.plan == self.rule:
                s.default_us = latency
            if s.best_us is None or latency < s.best_us:
                s.best_us, s.best_config = latency, dict(params)
                s.since_improvement = 0
            s.history.append((s.trials, s.best_us))

    # ------------------------------------------------------------ confirm
    def confirm(self, measurer: Any, db: Any, run_id: int | None = None, limit: int | None = None) -> int:
        """Re-measure, in the same batches, the best config of every group that differs between the rules'
        plan and at most ``CONFIRM_PLANS`` other plans (those scored ``MIN_GAIN`` below the rules' first, then
        those scored between ``1 + MIN_GAIN`` and ``CONFIRM_WITHIN`` times the rules'), ``rounds`` times;
        those groups then count with the median of these re-measurements, and only these plans remain
        candidates. A plan found during a quiet moment of a
        loaded machine must not beat a rules' plan whose groups were measured during a busy one, nor the
        other way round. Every re-measurement is committed as a record of the run. Returns the number of
        measurements. With at most ``limit`` measurements allowed and fewer than two rounds fitting, nothing
        is measured and only the rules' plan remains: a plan is stored as better only once confirmed."""
        from db.records import RecordIn
        from tuner.measure import MeasureInput, measure_in_rounds

        scored = [(self.score(r), r) for r in self.results.values() if r.latency_us is not None]
        rule = next((lat for lat, r in scored if r.plan == self.rule), None)
        if rule is None:
            return 0
        # plans scored within MIN_GAIN of the rules' either way are the same plan as far as measurement goes:
        # first the ones that beat the rules by MIN_GAIN, then the ones that lost by up to CONFIRM_WITHIN
        others = [(lat, r) for lat, r in scored if lat is not None and r.plan != self.rule]
        better = sorted(
            ((lat, r) for lat, r in others if lat < rule * (1 - MIN_GAIN)), key=lambda lr: lr[0]
        ) + sorted(
            ((lat, r) for lat, r in others if rule * (1 + MIN_GAIN) <= lat < rule * CONFIRM_WITHIN),
            key=lambda lr: lr[0],
        )
        if not better:
            return 0
        plans = [self.results[plan_json(self.rule)], *(r for _, r in better[:CONFIRM_PLANS])]
        self.finalists = {plan_json(r.plan) for r in plans}
        # a group in every plan with the same weight adds the same to each; one whose weight differs does not
        # (a workload the Q/K/V projections share: weight 3 in the rules' plan, gone once they are merged)
        weights = [dict(r.groups()) for r in plans]
        common = {k for k, w in weights[0].items() if all(ws.get(k) == w for ws in weights[1:])}
        tasks = {t.workload_key: t for r in plans for t in r.tasks if t.workload_key not in common}
        # each group's best config and its sketch's default: a default measured during a busy moment leaves a
        # group with a best config far slower than the default it will really run (compile's own
        # confirmation falls back to it), which would score that group's plan by the wrong config
        best = [
            (t, self.tuners[k].state.best_config)
            for k, t in sorted(tasks.items())
            if k in self.tuners and self.tuners[k].state.best_config is not None
        ]
        defaults = [(t, d) for t, c in best if config_json(d := t.default()) != config_json(c)]
        todo = best + defaults
        if limit is not None and todo and limit // len(todo) < 2:
            todo = best  # no room for the defaults: the best configs alone
        rounds = CONFIRM_ROUNDS if limit is None or not todo else min(CONFIRM_ROUNDS, limit // len(todo))
        if not todo or rounds < 2:
            self.finalists = {plan_json(self.rule)}
            return 0
        samples: dict[tuple[str, str], list[float]] = {}
        n = 0
        inputs = [MeasureInput(t, c) for t, c in todo]
        # built once (a Measurer), then round r starts at the r-th candidate
        for results in measure_in_rounds(measurer, inputs, rounds, rotate=True):
            recs = []
            for (t, c), res in zip(todo, results):
                recs.append(
                    RecordIn(
                        t.workload_key,
                        t.target.key,
                        t.sketch.name,
                        t.sketch.version,
                        c,
                        res.latencies_us,
                        res.status,
                        res.error,
                        run_id,
                    )
                )
                if res.median_us is not None:
                    samples.setdefault((t.workload_key, config_json(c)), []).append(res.median_us)
            db.commit_records(recs)
            n += len(recs)
        confirmed: dict[str, float] = {}
        for (key, _), v in samples.items():  # the faster of a group's best config and its default
            confirmed[key] = min(confirmed.get(key, math.inf), statistics.median(v))
        self.confirmed = confirmed
        return n

    # ----------------------------------------------------- whole model
    def _scored(self) -> tuple[float | None, list[tuple[float, PlanResult]]]:
        """The rules' plan's score and the other candidate plans' (the finalists once confirmed), scored
        again with the groups' final best latencies (tuning after a plan was scored may have improved its
        groups)."""
        scored = []
        for key, r in self.results.items():
            if r.latency_us is None or (self.finalists is not None and key not in self.finalists):
                continue
            latency = self.score(r)
            if latency is not None:
                scored.append((latency, r))
        rule = next((lat for lat, r in scored if r.plan == self.rule), None)
        return rule, [(lat, r) for lat, r in scored if r.plan != self.rule]

    def _label(self, plan: FusionPlan) -> str:
        """A finalist's name in the whole-model timing: ``e2_3 flipped``."""
        return ", ".join(self.region.flipped(plan)) + " flipped"

    def check_whole(self, configs: Any, timer: Any) -> None:
        """Time the whole model under the rules' plan and under each plan that beats it by ``MIN_GAIN`` by
        the sum of kernels (at most ``CONFIRM_PLANS``, best first), every group with ``configs``'s schedule
        (:mod:`tuner.plan_whole`); :meth:`outcome` then keeps such a plan only if the whole model under it
        is ``MIN_GAIN`` faster than under the rules' plan. On CUDA nothing is timed (see
        :mod:`tuner.plan_whole`): the sum-of-kernels rule decides, and the log says so."""
        from tuner.plan_whole import time_plans

        rule, others = self._scored()
        better = [] if rule is None else _beating(rule, others)
        if not better:
            return
        if self.target.kind != "cpu":
            log.info(
                "%s: the whole model is not timed on %s; the sum of the kernels' latencies chooses the plan",
                self.task.name,
                self.target.kind,
            )
            return
        finalists = {self._label(r.plan): r for _, r in better[:CONFIRM_PLANS]}
        plans = {"rules": self.region.to_global(self.rule)}
        plans.update((key, self.region.to_global(r.plan)) for key, r in finalists.items())
        self.whole = time_plans(self.graph, self.target, plans, configs, timer)
        if self.whole.problem is not None:
            log.warning("%s: the rules' plan is kept: %s", self.task.name, self.whole.problem)

    # ----------------------------------------------------------- outcome
    def outcome(self) -> PlanOutcome | None:
        """The plan to store and the rules' plan, scored again with the groups' final best latencies; None
        before the rules' plan has a score. The best plan by the sum of kernels replaces the rules' only when
        it beats them by ``MIN_GAIN`` (a smaller gain is within the noise of the confirmation itself) and, on
        the CPU, when the whole model under it (:meth:`check_whole`) is ``MIN_GAIN`` faster than under the
        rules' plan too; the best such plan by the whole model is stored, with both whole-model latencies."""
        rule, others = self._scored()
        if rule is None:
            return None
        n = 1 + len(others)
        rules_result = self.results[plan_json(self.rule)]
        better = _beating(rule, others)
        if not better:
            return self._outcome(rules_result, rule, rule, n)
        if self.target.kind != "cpu":
            latency, best = better[0]
            return self._outcome(best, latency, rule, n)
        if self.whole is not None and self.whole.problem is not None:
            return self._outcome(rules_result, rule, rule, n, why=self.whole.problem)
        medians = self.whole.medians if self.whole is not None else {}
        timed = [(medians[label], lat, r) for lat, r in better if (label := self._label(r.plan)) in medians]
        if not timed:
            why = "the best plan by the sum of kernels was not timed on the whole model"
            log.warning("%s: the rules' plan is kept: %s", self.task.name, why)
            return self._outcome(rules_result, rule, rule, n, why=why)
        rule_whole = medians["rules"]
        plan_whole, latency, best = min(timed, key=lambda t: t[0])
        if plan_whole < rule_whole * (1 - MIN_GAIN):
            return self._outcome(best, latency, rule, n, plan_whole, rule_whole)
        why = (
            f"{', '.join(self.region.flipped(best.plan))} flipped: {latency:,.1f} vs {rule:,.1f} us by the "
            f"sum of kernels, but the whole model runs {plan_whole:,.1f} vs {rule_whole:,.1f} us under the "
            "rules' plan"
        )
        log.info("%s: the rules' plan is kept: %s", self.task.name, why)
        return self._outcome(rules_result, rule, rule, n, rule_whole, rule_whole, why)

    def _outcome(
        self,
        result: PlanResult,
        latency: float,
        rule: float,
        n: int,
        whole_us: float | None = None,
        rule_whole_us: float | None = None,
        why: str = "",
    ) -> PlanOutcome:
        workloads = tuple(t.workload_key for t in result.tasks)
        return PlanOutcome(
            self.region, dict(result.plan), latency, rule, n, workloads, whole_us, rule_whole_us, why
        )


def _beating(rule: float, others: list[tuple[float, PlanResult]]) -> list[tuple[float, PlanResult]]:
    """The (score, plan) of ``others`` that beat the rules' score ``rule`` by ``MIN_GAIN``, best first."""
    return sorted((lr for lr in others if lr[0] < rule * (1 - MIN_GAIN)), key=lambda lr: lr[0])


@dataclass(frozen=True)
class PlanOutcome:
    """What the search of one region found: the best plan (region-local ids), its latency and the rules'
    (sums of kernels), and the whole model's latency under each when it was timed end to end; ``why``: why
    a plan that beat the rules by the sum of kernels was not kept (empty when none was rejected)."""

    region: Region
    plan: FusionPlan
    latency_us: float
    rule_latency_us: float
    plans_measured: int
    workloads: tuple[str, ...] = ()  # the workload keys of the plan's groups (what compile will build)
    whole_us: float | None = None
    rule_whole_us: float | None = None
    why: str = ""

    @property
    def flipped(self) -> list[str]:
        return self.region.flipped(self.plan)

    def commit(self, db: Any, target_key: str) -> int:
        return db.commit_fusion_plan(
            self.region.key,
            target_key,
            self.plan,
            self.latency_us,
            rule_latency_us=self.rule_latency_us,
            whole_us=self.whole_us,
            rule_whole_us=self.rule_whole_us,
        )


def confirm_reserve(searches: Sequence[PlanSearch], trials: int | None) -> int:
    """Trials a trial budget keeps aside for :func:`confirm_plans`: room for each region's confirmation, at
    most a quarter of the trials (0 for a time budget)."""
    if trials is None or not searches:
        return 0
    return min(trials // 4, CONFIRM_ROUNDS * 2 * CONFIRM_GROUPS * len(searches))  # best config + default


def confirm_plans(
    searches: Sequence[PlanSearch], measurer: Any, db: Any, run_id: int | None, limit: int | None
) -> int:
    """:meth:`PlanSearch.confirm` for each region within ``limit`` measurements in all; returns how many."""
    used = 0
    for search in searches:
        left = None if limit is None else max(0, limit - used)
        used += search.confirm(measurer, db, run_id, left)
    return used


# ------------------------------------------------------------------ compile side
@dataclass
class PlanReport:
    """Which stored plans compile applied, and why the others were not (stale, or not better)."""

    plan: FusionPlan = field(default_factory=dict)  # whole-graph edge ids, for :func:`compiler.fusion.fuse`
    lines: list[dict[str, Any]] = field(default_factory=list)

    @property
    def stale(self) -> list[dict[str, Any]]:
        return [r for r in self.lines if r["status"] == "stale"]


def database_plan(db: Any, graph: Graph, target: Target) -> PlanReport:
    """The fusion plan compile applies for ``graph`` (optimized) on ``target``: for each region, its best
    stored plan when that beats the rules' plan — on the CPU, when the whole model timed under it beat the
    whole model under the rules' plan (a plan stored without that timing, by an older kiln, is not applied);
    on CUDA, by the sum of its kernels. A stored plan naming edges the region does not have is reported (a
    warning, and a ``stale`` line) and skipped, never applied."""
    report = PlanReport()
    for region in target_regions(graph, target):
        rec = db.best_fusion_plan(region.key, target.key)
        if rec is None:
            continue
        if target.kind == "cpu" and rec.whole_us is None:  # the best plan timed on the whole model, if any
            rec = next((r for r in db.fusion_plans(region.key, target.key) if r.whole_us is not None), rec)
        line = {
            "region": region.index,
            "region_key": region.key,
            "latency_us": rec.latency_us,
            "rule_latency_us": rec.rule_latency_us,
            "whole_us": rec.whole_us,
            "rule_whole_us": rec.rule_whole_us,
            "flipped": [],
        }
        try:
            if not isinstance(rec.plan, dict) or not all(
                isinstance(v, bool | int) for v in rec.plan.values()
            ):
                raise KilnError(f"fusion plan {rec.id} is not a mapping of edge ids to true/false")
            global_plan = region.to_global({k: bool(v) for k, v in rec.plan.items()})
        except KilnError as exc:
            log.warning("stored fusion plan %d skipped: %s", rec.id, exc)
            report.lines.append({**line, "status": "stale", "why": str(exc)})
            continue
        line["flipped"] = region.flipped(rec.plan)
        problem = plan_problem(graph, {**report.plan, **global_plan}, target)
        if problem is not None:
            log.warning("stored fusion plan %d skipped: %s", rec.id, problem)
            report.lines.append({**line, "status": "stale", "why": problem})
            continue
        if rec.rule_latency_us is None or not rec.latency_us < rec.rule_latency_us or not line["flipped"]:
            report.lines.append({**line, "status": "rules", "why": "the rules' plan is as fast"})
            continue
        if target.kind == "cpu":
            if rec.whole_us is None or rec.rule_whole_us is None:
                why = "not timed on the whole model (stored by an older kiln): tune again to check it"
                report.lines.append({**line, "status": "rules", "why": why})
                continue
            if not rec.whole_us < rec.rule_whole_us:
                why = "the whole model is as fast under the rules' plan"
                report.lines.append({**line, "status": "rules", "why": why})
                continue
        report.plan.update(global_plan)
        report.lines.append({**line, "status": "applied", "why": ""})
    return report
