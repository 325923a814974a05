"""Cost-model ranking of a candidate pool: measure the candidates the model ranks best (plus a few random).

``make_candidate_filter(name, db, target, seed, oversample)`` -> ``(filter, asks)`` is what ``kiln tune
--cost-model gbdt|analytic|random`` plugs into :class:`~tuner.search.TaskTuner`: each round the tuner asks
Optuna for ``batch * asks`` fresh configs (``asks`` is 1: as many as TPE alone asks) and calls
``filter(task, configs, batch)``. The filter widens them to a pool of ``batch * oversample`` candidates with
proposals of its own (:func:`propose`: one- and two-knob mutations of the workload's best measured configs
and uniform random configs, all passing the sketch's check), ranks the pool and returns ``batch`` picks.
From the second round on, the pool keeps the newest unmeasured candidates of earlier pools (their features
are memoized, so re-ranking them with the updated model is free) and adds only ``batch`` new proposals: the
features of a candidate (scheduling and lowering it) cost 10-40 ms, which for 64 new candidates per round
would cost about as much as measuring the picks.
The tuner measures them; asked configs it did not pick are told to Optuna as PRUNED, and picked proposals
are added to the study as finished trials, so TPE learns from every measurement. The pool is widened
locally rather than by asking Optuna 8x more (proposals cost no sampler work).

One round of :class:`CostFilter`:

1. Learn: records of the task's workload that the model has not seen yet are read from the database
   (on the first call, every record of the target: a new model, or a new workload, starts warm from what
   was measured before). Their features come from the in-process memo (they were asked candidates), the
   database's feature cache, or are computed and cached there; ``model.update`` retrains when worthwhile.
2. Pool: the asked configs, earlier pools' unmeasured candidates and new proposals, de-duplicated, without
   configs the database already has.
3. Validate: each candidate must pass ``task.check`` and schedule; invalid ones are dropped, so they
   never take one of the model's picks (and are never measured).
4. Pick: the rule-based default (when asked, so tuning never ends worse than it), then the model's top
   scores, then ``max(1, round(epsilon * batch))`` random valid candidates (exploration: the model is
   wrong in places it has never measured).
5. Background (``background=True``, the default): while the tuner measures the picks, a thread refits
   the model on the data it was given (``update(..., fit=False)`` in step 1, so a round ranks with the fit
   of one round earlier) and proposes and featurizes the next round's uniform random proposals. The next
   round waits for it first (``stats["wait_s"]``). What depends on the round's measurements is done in
   line, in the next round: the mutations of the best configs (drawn in the background they would mutate
   the best of the round before) and the features of the configs Optuna asked for (``batch`` of each,
   10-40 ms apiece). Until stop 32 both were stale by a round: asked configs not featurized yet were
   deferred to the next round's pool, and the mutations were drawn in the background; on two whole
   contraction spaces that cost TPE + analytic 29 -> 17 and 40.5 -> 23 median trials to within 5% of the
   best against ``background=False`` (``scripts/bench_defer_dev.py``). The first round (and its warm
   start) also fits in line.

Anything unexpected inside the model or the features is logged and the round falls back to random picks
among valid candidates: the cost model must never stop a tuning run.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from compiler.backends.sketch import Config
from compiler.errors import KilnError, ScheduleError
from compiler.target import Target
from cost_model.dataset import GroupCache, load_dataset, record_latency
from cost_model.features import FEATURE_VERSION, FeatureExtractor
from cost_model.model import CostModel, create_model
from db.status import Status
from tuner.space import config_json

log = logging.getLogger("kiln.cost_filter")

DEFAULT_OVERSAMPLE = 8
DEFAULT_EPSILON = 0.1


class CostFilter:
    """A candidate filter backed by a :class:`~cost_model.model.CostModel`; see the module docstring.

    ``warm_start``: learn from the records of the target already in the database on the first call (at most
    ``warm_limit`` per workload: its best quarter and an even sample of the rest; the workload being tuned
    gets all of its own records on the next call).
    ``keep_default``: always measure the task's default config when it is among the candidates.
    ``stats`` counts candidates, invalid ones, model and random picks, and seconds spent on features and
    training."""

    def __init__(
        self,
        model: CostModel,
        db: Any,
        target: Target | str,
        seed: int = 0,
        epsilon: float = DEFAULT_EPSILON,
        warm_start: bool = True,
        warm_limit: int = 400,
        keep_default: bool = True,
        extractor: FeatureExtractor | None = None,
        oversample: int = DEFAULT_OVERSAMPLE,
        background: bool = True,
    ) -> None:
        if not 0.0 <= epsilon <= 1.0:
            raise KilnError(f"epsilon must be in [0, 1], got {epsilon}")
        if oversample < 1:
            raise KilnError(f"oversample must be at least 1, got {oversample}")
        self.oversample = oversample
        self.model = model
        self.db = db
        self.target = Target.parse(target)
        self.rng = random.Random(seed)
        self.epsilon = epsilon
        self.warm_start = warm_start
        self.warm_limit = warm_limit
        self.keep_default = keep_default
        self.extractor = extractor or FeatureExtractor()
        self.groups = GroupCache(db)
        self.background = background
        self._job: threading.Thread | None = None
        # workload -> proposals prepared in the background for the next round (features memoized)
        self._next: dict[str, list[Config]] = {}
        self.seen: set[int] = set()  # record ids the model has learned from
        self._started = False
        self.stats: dict[str, float] = {
            "rounds": 0,
            "candidates": 0,
            "asked": 0,
            "proposed": 0,
            "invalid": 0,
            "model_picks": 0,
            "random_picks": 0,
            "default_picks": 0,
            "learned": 0,
            "feature_s": 0.0,
            "learn_s": 0.0,
            "rank_s": 0.0,
            "wait_s": 0.0,  # waiting for the background step at the start of a round
            "background_s": 0.0,  # the background step (refit, next proposals), overlapping measurement
            "fallbacks": 0,
        }
        self._measured: dict[str, set[str]] = {}  # workload -> config JSON of its records (learn keeps it)
        self._best: dict[str, list[tuple[float, Config]]] = {}  # workload -> (latency, config), best first
        # workload -> valid candidates of earlier pools not measured yet (their features are memoized)
        self._carry: dict[str, dict[str, Config]] = {}

    # ---------------------------------------------------------------- learn
    def learn(self, task: Any) -> int:
        """Feed the model the records it has not seen (all of the target's on the first call, then the
        task's workload); returns how many."""
        t0 = time.perf_counter()
        self.groups.put(task.workload_key, task.group)
        first = not self._started
        if first and self.warm_start:
            records = sample_per_workload(self.db.find_records(None, self.target.key), self.warm_limit)
            if len(records) > 500:
                log.info("cost model: warm start from %d records of %s", len(records), self.target.key)
        else:
            records = self.db.find_records(task.workload_key, self.target.key)
        self._started = True
        new = [r for r in records if r.id not in self.seen]
        for r in new:
            self.seen.add(r.id)
            self._measured.setdefault(r.workload_key, set()).add(config_json(r.config))
            if r.workload_key == task.workload_key and Status(r.status) == Status.OK and r.median_us:
                self._best.setdefault(r.workload_key, []).append((float(r.median_us), dict(r.config)))
        best = self._best.get(task.workload_key)
        if best:
            best.sort(key=lambda b: b[0])
            del best[16:]
        new = [r for r in new if Status(r.status) != Status.INVALID_CONFIG]
        if not new:
            return 0
        # features of records measured in this process are in the memo: cache them in the database too
        fresh = []
        for r in new:
            group = self.groups.get(r.workload_key)
            if group is None:
                continue
            known, vec = self.extractor.peek(self.extractor.key(group, self.target, dict(r.config), r.sketch))
            if known and vec is not None:
                self.db.commit_features(r.id, FEATURE_VERSION, vec)
                fresh.append((r, vec))
        done = {r.id for r, _ in fresh}
        rest = [r for r in new if r.id not in done]
        data = load_dataset(self.db, self.target.key, self.extractor, groups=self.groups, records=rest)
        feats = [v for _, v in fresh] + list(data.x)
        lats = [record_latency(r) for r, _ in fresh] + list(data.latencies)
        wls = [r.workload_key for r, _ in fresh] + data.workloads
        if feats:  # in the background mode, refits happen in the background step (the first one here)
            fit = not self.background or first
            self.model.update(np.asarray(feats, dtype=np.float32), lats, wls, fit=fit)
        self.stats["learned"] += len(feats)
        self.stats["learn_s"] += time.perf_counter() - t0
        return len(feats)

    # ----------------------------------------------------------------- pick
    def features(self, task: Any, configs: list[Config]) -> tuple[list[Config], np.ndarray]:
        """The valid configs (``task.check`` passes and the sketch schedules them) and their features."""
        t0 = time.perf_counter()
        valid, rows = [], []
        for c in configs:
            try:
                task.check(c)
            except (ScheduleError, KilnError):
                continue
            vec = self.extractor.for_task(task, c)
            if vec is not None:
                valid.append(c)
                rows.append(vec)
        self.stats["feature_s"] += time.perf_counter() - t0
        return valid, np.asarray(rows, dtype=np.float32)

    def __call__(self, task: Any, configs: list[Config], batch: int) -> list[Config]:
        self.stats["rounds"] += 1
        self.wait()
        try:
            self.learn(task)
        except Exception:  # learning is an optimization: never stop tuning for it
            log.exception("cost model: learning from the database failed; continuing with what it knows")
            self.stats["fallbacks"] += 1
        t0 = time.perf_counter()
        measured = self._measured.get(task.workload_key, set())
        pool = {config_json(c): c for c in configs if config_json(c) not in measured}
        self.stats["asked"] += len(pool)
        carry = self._carry.setdefault(task.workload_key, {})
        for key in [k for k in carry if k in measured]:
            del carry[key]
        fresh_budget = batch * self.oversample - len(pool)
        if carry:  # later rounds: re-rank earlier candidates (free) and compute `batch` new ones
            fresh_budget = min(fresh_budget, batch)
            n_carry = batch * self.oversample - len(pool) - fresh_budget
            for key, c in list(carry.items())[len(carry) - n_carry :] if n_carry > 0 else []:
                pool.setdefault(key, c)
        prepared = self._next.pop(task.workload_key, None)
        for c in prepared or []:  # uniform proposals, prepared while the last batch was measured
            key = config_json(c)
            if fresh_budget > 0 and key not in measured and key not in pool:
                pool[key] = c
                fresh_budget -= 1
                self.stats["proposed"] += 1
        want = min(fresh_budget, batch * self.oversample - len(pool))
        if want > 0:
            # mutations of the best configs are proposed here, after the last batch's records were learned:
            # drawn in the background step they would mutate the best of the round before
            best = [c for _, c in self._best.get(task.workload_key, [])]
            mutate = 1.0 if prepared is not None else 0.5
            for c in propose(task, best, want, self.rng, exclude=set(pool) | measured, mutate=mutate):
                pool[config_json(c)] = c
                self.stats["proposed"] += 1
        configs = list(pool.values())
        self.stats["candidates"] += len(configs)
        valid, x = self.features(task, configs)
        self.stats["invalid"] += len(configs) - len(valid)
        carry.update((config_json(c), c) for c in valid)
        while len(carry) > 4 * batch * self.oversample:
            del carry[next(iter(carry))]
        if len(valid) <= batch:
            self.stats["model_picks"] += len(valid)
            return valid
        try:
            scores = np.asarray(self.model.predict(x), dtype=np.float64)
            if scores.shape != (len(valid),) or not np.all(np.isfinite(scores)):
                raise ValueError(f"bad scores of shape {scores.shape}")
        except Exception:
            log.exception("cost model: prediction failed; picking at random this round")
            self.stats["fallbacks"] += 1
            scores = np.asarray([self.rng.random() for _ in valid])
        picks = self.pick(task, valid, scores, batch)
        self.stats["rank_s"] += time.perf_counter() - t0
        if self.background:
            exclude = measured | {config_json(c) for c in picks} | set(carry)
            self._job = threading.Thread(
                target=self._prepare, args=(task, batch, exclude), name="kiln-cost-model", daemon=False
            )
            self._job.start()
        return picks

    def wait(self) -> None:
        """Wait for the background step of the last round (if any) to finish."""
        if self._job is None:
            return
        t0 = time.perf_counter()
        self._job.join()
        self._job = None
        self.stats["wait_s"] += time.perf_counter() - t0

    def _prepare(self, task: Any, batch: int, exclude: set[str]) -> None:
        """The background step, run while the round's picks are measured: refit the model on what it was
        given (so a round ranks with the model fitted up to the round before the last) and propose and
        featurize half of the next round's ``batch`` new candidates, the uniform ones (the mutations of the
        best configs wait for this round's measurements: the next round proposes them in line). Never
        raises (logged, like every model error)."""
        t0 = time.perf_counter()
        try:
            self.model.warm_up()  # a cold model's next fit may run in line (GBDTModel.inline_below)
            self.model.fit_if_due()
        except Exception:
            log.exception("cost model: refitting failed; keeping the previous fit")
            self.stats["fallbacks"] += 1
        try:
            proposals = propose(task, [], batch - batch // 2, self.rng, exclude=exclude)
            self._next[task.workload_key] = self.features(task, proposals)[0]
        except Exception:
            log.exception("cost model: preparing the next proposals failed")
            self.stats["fallbacks"] += 1
        self.stats["background_s"] += time.perf_counter() - t0

    def pick(self, task: Any, valid: list[Config], scores: np.ndarray, batch: int) -> list[Config]:
        """Default (if asked), then the best scores, then ``epsilon`` random picks; ``batch`` in all."""
        n_random = max(1, round(self.epsilon * batch)) if self.epsilon > 0 and batch >= 2 else 0
        chosen: list[int] = []
        if self.keep_default:
            default = config_json(task.default())
            chosen += [i for i, c in enumerate(valid) if config_json(c) == default][:1]
            self.stats["default_picks"] += len(chosen)
        n_default = len(chosen)
        taken = set(chosen)
        n_model = max(0, batch - n_random - len(chosen))
        for i in sorted(range(len(valid)), key=lambda i: (-scores[i], i)):
            if n_model <= 0:
                break
            if i not in taken:
                chosen.append(i)
                taken.add(i)
                n_model -= 1
        self.stats["model_picks"] += len(taken) - n_default
        rest = [i for i in range(len(valid)) if i not in taken]
        extra = self.rng.sample(rest, min(len(rest), batch - len(chosen)))
        self.stats["random_picks"] += len(extra)
        return [valid[i] for i in chosen + extra]


def propose(
    task: Any, best: list[Config], n: int, rng: random.Random, exclude: set[str], mutate: float = 0.5
) -> list[Config]:
    """Up to ``n`` new configs of ``task`` that pass the sketch's check and are not in ``exclude``: a share
    ``mutate`` of one- or two-knob mutations of the ``best`` configs (best first, TVM/Ansor's evolutionary
    neighbours; none without ``best``), the rest uniform random configs of the space. Never asks Optuna (no
    storage round trips)."""
    if not 0.0 <= mutate <= 1.0:
        raise KilnError(f"mutate must be in [0, 1], got {mutate}")
    space = [k for k in task.space() if len(k.values) > 1]
    if not space:
        return []
    out: dict[str, Config] = {}
    base = task.default()
    n_mut = int(n * mutate) if best else 0
    tries = 0
    while len(out) < n and tries < 20 * n:
        tries += 1
        if len(out) < n_mut:
            c = dict(best[min(int(rng.expovariate(0.5)), len(best) - 1)])
            for k in rng.sample(space, min(len(space), rng.choice((1, 1, 2)))):
                c[k.name] = rng.choice(k.values)
        else:
            c = dict(base)
            c.update({k.name: rng.choice(k.values) for k in space})
        key = config_json(c)
        if key in exclude or key in out:
            continue
        try:
            task.check(c)
        except (ScheduleError, KilnError):
            continue
        out[key] = c
    return list(out.values())


def sample_per_workload(records: list[Any], limit: int) -> list[Any]:
    """At most ``limit`` records per workload of ``records`` (which come best first): the best quarter,
    then an even sample of the rest."""
    groups: dict[str, list[Any]] = {}
    for r in records:
        groups.setdefault(r.workload_key, []).append(r)
    out: list[Any] = []
    for rs in groups.values():
        if len(rs) <= limit:
            out += rs
            continue
        head, rest = rs[: limit // 4], rs[limit // 4 :]
        step = len(rest) / (limit - len(head))
        out += head + [rest[int(k * step)] for k in range(limit - len(head))]
    return out


def make_candidate_filter(
    name: str | CostModel,
    db: Any,
    target: Target | str,
    seed: int = 0,
    oversample: int = DEFAULT_OVERSAMPLE,
    epsilon: float = DEFAULT_EPSILON,
    **options: Any,
) -> tuple[Callable[[Any, list[Config], int], list[Config]] | None, int]:
    """``(candidate_filter, asks)`` for ``kiln tune --cost-model NAME`` (``gbdt``, ``analytic``, ``random`` or
    a model instance); ``none`` gives ``(None, 1)``. ``asks`` (Optuna asks per measured candidate) is 1:
    the filter ranks a pool of ``oversample`` candidates per measured one, widened with its own proposals
    (see the module docstring)."""
    if name == "none":
        return None, 1
    if oversample < 1:
        raise KilnError(f"oversample must be at least 1, got {oversample}")
    model = create_model(name, seed=seed)
    flt = CostFilter(model, db, target, seed=seed, epsilon=epsilon, oversample=oversample, **options)
    return flt, 1
