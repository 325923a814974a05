"""Gradient-boosted trees as a Kiln cost model: LightGBM's LambdaMART (default) or scikit-learn's
HistGradientBoostingRegressor.

Three targets, all normalized per workload so that one model learns from every workload of a target:

- ``rank`` (default): learning to rank, one query per workload (LightGBM ``lambdarank``: pairwise
  within a workload, weighted towards the top of the order as NDCG is, like TVM's XGBoost rank loss and
  Ansor's), *boosted from the analytic prior*: the prior's scores (``-est_log_cycles``) are the initial
  scores, so the trees only learn how to reorder what the roofline model gets wrong. Labels are grades
  per workload (:func:`rank_grades`: 4 grades per 2x slower than the workload's best, failures 0).
  With ``center`` (off by default since stop 30) the trees also see each candidate's features minus its
  workload's mean (:func:`centered`; at prediction, the mean of the rows ranked together, which are one
  workload's pool), so "twice the L2 traffic of the others" means the same in a small and a large workload;
  but a candidate's score then depends on the batch it is ranked in, and on the development data of stop 30
  (90 more workloads, see :data:`TREES`) the plain features did better on every aggregate.
- ``residual``: regression on what the analytic roofline model gets wrong,
  ``log2(latency) - est_log_cycles`` centered on the workload's median; the score is the analytic prior
  corrected by it.
- ``ratio``: TVM's labels, ``best latency / latency`` (0 for a failed candidate); until
  ``trust_samples`` samples exist the prediction is blended, by rank, with the analytic model.

For ``rank`` and ``residual`` the learned correction of a candidate is weighted ``n / (n + prior_samples)``
where ``n`` counts the training samples of *its kind* (pointwise, reduction, contraction, other: the
``wl_kind_*`` features): what was learned on contractions transfers to a new contraction as soon as there
are some, but a pointwise candidate keeps the prior until pointwise data exists. A candidate of a
workload the forest was not trained on (a transfer: a warm start's first round, a held-out workload) is also
weighted ``t = m / (m + transfer_workloads)`` for the ``m`` distinct workloads of its kind in the training
data (default 32): the samples of one workload are one correlated lesson, and what a few reductions taught
about another (say, how many accumulators its rows need) is a guess the prior should still outweigh. That
discount fades as the workload's own samples ``k`` join the training data,
``t + (1 - t) * k / (k + own_samples)`` (default 32; 0 = none: full weight from the first own sample on, as
before stop 36), with ``m`` counting the *other* workloads of its kind: LambdaMART weighs each workload about
equally, so after one batch of 8 the forest's correction of a warm-started workload is still almost all what
other workloads taught (a cold search, whose training data is its own, is not discounted at all). And
``t`` itself is validated per kind on the training data (``transfer_folds``, default 4; 0 = off): each time
the set of training workloads changes, folds of them are ranked as transfers by forests trained on the
other folds, and each kind's ``t`` is multiplied by whichever of :data:`TRANSFER_SCALES` ranked its
workloads best (:meth:`GBDTModel._validate_transfer`): a kind whose lessons do not carry from workload to
workload keeps the prior for a new one, a kind whose lessons do is trusted more. LambdaMART's
scores have no scale of their own, so by default it grows 40 trees of 7 leaves (the regressions 150 of 15,
see :data:`TREES`): the larger forest made the learned part several times the prior's spread within a pool.
With no data the model *is* the analytic model; every measurement refines it. For the regressions, rows of
workloads with few samples are repeated (up to 8x), so a new workload's first measurements are not drowned
by a big workload's thousands (LambdaMART's per-query normalization does this for ``rank``). Retraining is
adaptive: a fit happens once ``min_fit`` samples exist and again whenever ``refit_every`` new samples
arrived (every batch of ``kiln tune``; ``update(..., fit=False)`` + :meth:`GBDTModel.fit_if_due` let the
search refit in the background), on at most ``max_train`` samples (per-workload quotas, best first).
While the model holds at most ``inline_below`` samples (default 64; 0 = off), ``update(..., fit=False)``
fits in line anyway (a fit on that little data takes milliseconds): a cold search then ranks its second
round with what its first round measured, instead of one round later (on the development searches of
layernorm, the one benchmark workload whose search the prior does not finish in its first batch; 30
seeds: median trials to within 5% 12, against 19 with the background refit alone and 23 for the prior).
With ``prior_trust=N`` (default 0, off) the prior's weight is learned per workload from its measurements
(:func:`prior_trust`: the Spearman correlation of the prior with the measured speed, shrunk towards full
trust by ``N`` pseudo-samples), in the boosting's initial scores and in the score alike, so a workload whose
measurements contradict the prior is ranked by what was learned instead of being pulled back to the prior.

The fitted trees are copied out of LightGBM / scikit-learn into plain arrays (:class:`Forest`) and
predictions always come from those arrays, so a model saved to ``.npz`` and loaded back predicts exactly
the same, without pickle and without depending on either library's internals staying the same.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cost_model.features import EST_INDEX, FEATURE_NAMES
from cost_model.model import CostModel, check_features, normalized_labels


@dataclass
class Forest:
    """Regression trees in flat arrays: ``prediction = baseline + sum of the leaf values reached``."""

    roots: np.ndarray  # node index of each tree's root
    feature: np.ndarray
    threshold: np.ndarray  # go left when x <= threshold
    left: np.ndarray
    right: np.ndarray
    is_leaf: np.ndarray
    value: np.ndarray
    missing_left: np.ndarray
    baseline: float
    depth: int

    FIELDS = ("roots", "feature", "threshold", "left", "right", "is_leaf", "value", "missing_left")

    @staticmethod
    def from_sklearn(est: Any) -> Forest:
        """Copy the trees of a fitted ``HistGradientBoostingRegressor`` (numerical splits only)."""
        parts, roots, offset, depth = [], [], 0, 0
        for (pred,) in est._predictors:
            nodes = pred.nodes
            if np.any(nodes["is_categorical"]):
                raise ValueError("categorical splits are not supported")
            roots.append(offset)
            parts.append(nodes)
            depth = max(depth, int(nodes["depth"].max()) + 1)
            offset += len(nodes)
        nodes = np.concatenate(parts) if parts else np.zeros(0, dtype=[("left", "u4")])
        shift = np.repeat(np.asarray(roots, dtype=np.int64), [len(p) for p in parts])
        return Forest(
            np.asarray(roots, dtype=np.int64),
            nodes["feature_idx"].astype(np.int64),
            nodes["num_threshold"].astype(np.float64),
            nodes["left"].astype(np.int64) + shift,
            nodes["right"].astype(np.int64) + shift,
            nodes["is_leaf"].astype(bool),
            nodes["value"].astype(np.float64),
            nodes["missing_go_to_left"].astype(bool),
            float(np.asarray(est._baseline_prediction).reshape(-1)[0]),
            depth,
        )

    @staticmethod
    def from_lightgbm(booster: Any) -> Forest:
        """Copy the trees of a trained LightGBM ``Booster`` (numerical splits only) from its JSON dump."""
        feature, threshold, left, right, is_leaf, value, missing_left, roots = ([] for _ in range(8))
        depth = 1

        def add(node: dict, level: int) -> int:
            nonlocal depth
            depth = max(depth, level + 1)
            i = len(feature)
            for arr in (feature, threshold, left, right, is_leaf, value, missing_left):
                arr.append(0)
            if "leaf_value" in node:
                is_leaf[i], value[i] = True, float(node["leaf_value"])
                return i
            if node.get("decision_type", "<=") != "<=":
                raise ValueError("categorical splits are not supported")
            feature[i], threshold[i] = int(node["split_feature"]), float(node["threshold"])
            # LightGBM: a NaN goes the default way when missing_type is NaN, else it is read as 0.0
            if node.get("missing_type") == "NaN":
                missing_left[i] = bool(node["default_left"])
            else:
                missing_left[i] = threshold[i] >= 0.0
            left[i] = add(node["left_child"], level + 1)
            right[i] = add(node["right_child"], level + 1)
            return i

        for tree in booster.dump_model()["tree_info"]:
            roots.append(add(tree["tree_structure"], 0))
        return Forest(
            np.asarray(roots, dtype=np.int64),
            np.asarray(feature, dtype=np.int64),
            np.asarray(threshold, dtype=np.float64),
            np.asarray(left, dtype=np.int64),
            np.asarray(right, dtype=np.int64),
            np.asarray(is_leaf, dtype=bool),
            np.asarray(value, dtype=np.float64),
            np.asarray(missing_left, dtype=bool),
            0.0,
            depth,
        )

    def predict(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        n = len(x)
        out = np.full(n, self.baseline)
        if not len(self.roots) or not n:
            return out
        idx = np.repeat(self.roots[:, None], n, axis=1)
        cols = np.arange(n)[None, :]
        for _ in range(self.depth):
            leaf = self.is_leaf[idx]
            if leaf.all():
                break
            v = x[cols, self.feature[idx]]
            go_left = np.where(np.isnan(v), self.missing_left[idx], v <= self.threshold[idx])
            idx = np.where(leaf, idx, np.where(go_left, self.left[idx], self.right[idx]))
        return out + self.value[idx].sum(axis=0)

    def arrays(self) -> dict[str, np.ndarray]:
        out = {f"forest_{k}": np.asarray(getattr(self, k)) for k in self.FIELDS}
        out["forest_scalars"] = np.asarray([self.baseline, float(self.depth)])
        return out

    @staticmethod
    def from_arrays(arrays: dict[str, np.ndarray]) -> Forest | None:
        if "forest_roots" not in arrays:
            return None
        baseline, depth = arrays["forest_scalars"]
        fields = {k: arrays[f"forest_{k}"] for k in Forest.FIELDS}
        for k in ("is_leaf", "missing_left"):
            fields[k] = fields[k].astype(bool)
        return Forest(**fields, baseline=float(baseline), depth=int(depth))


TARGETS = ("rank", "residual", "ratio")
KIND_COLUMNS = [
    FEATURE_NAMES.index(f"wl_kind_{k}") for k in ("pointwise", "reduction", "contraction", "other")
]


def kind_index(x: np.ndarray) -> np.ndarray:
    """Each row's group kind (0 pointwise, 1 reduction, 2 contraction, 3 other) from its one-hot features."""
    return np.argmax(np.asarray(x)[:, KIND_COLUMNS], axis=1)


def residual_labels(x: np.ndarray, latencies: np.ndarray, workloads: np.ndarray) -> np.ndarray:
    """``log2(latency) - est_log_cycles`` centered on each workload's median (what the analytic model gets
    wrong, in factors of two), clipped to [-4, 4]; a failed candidate gets its workload's worst + 1."""
    lat = np.asarray(latencies, dtype=np.float64)
    wl = np.asarray(workloads)
    ok = np.isfinite(lat) & (lat > 0)
    r = np.zeros(len(lat))
    r[ok] = np.log2(lat[ok]) - x[ok, EST_INDEX].astype(np.float64)
    for w in np.unique(wl):
        sel = wl == w
        good = sel & ok
        if good.any():
            r[good] -= np.median(r[good])
            r[sel & ~ok] = r[good].max() + 1.0
    return np.clip(r, -4.0, 4.0)


def rank_grades(latencies: np.ndarray, workloads: np.ndarray, levels: int = 16, per_octave: float = 4.0):
    """Relevance grades for learning to rank, per workload: ``levels - 1`` for its best latency, one grade
    less per factor ``2 ** (1 / per_octave)`` slower (4 grades per 2x), at least 0; 0 for a failure."""
    lat = np.asarray(latencies, dtype=np.float64)
    wl = np.asarray(workloads)
    ok = np.isfinite(lat) & (lat > 0)
    g = np.zeros(len(lat), dtype=np.int64)
    for w in np.unique(wl):
        good = (wl == w) & ok
        if good.any():
            slower = np.log2(lat[good] / lat[good].min())
            g[good] = np.clip(levels - 1 - np.round(per_octave * slower), 0, levels - 1)
    return g


CANDIDATE_COLUMNS = np.asarray([i for i, n in enumerate(FEATURE_NAMES) if not n.startswith("wl_")])


def centered(x: np.ndarray, workloads: np.ndarray) -> np.ndarray:
    """``x`` with the candidate columns (all but ``wl_*``) of each workload's rows minus their mean over
    those rows, appended: what distinguishes a candidate from its workload's others, comparable across
    workloads of different sizes."""
    x = np.asarray(x, dtype=np.float64)
    wl = np.asarray(workloads)
    out = x[:, CANDIDATE_COLUMNS].copy()
    for w in np.unique(wl):
        sel = wl == w
        out[sel] -= out[sel].mean(axis=0)
    return np.concatenate([x, out], axis=1)


def rank01(x: np.ndarray) -> np.ndarray:
    """Ranks scaled to [0, 1] (ties share the lower rank)."""
    if len(x) <= 1:
        return np.zeros(len(x))
    order = np.argsort(np.argsort(x, kind="stable"), kind="stable")
    return order / (len(x) - 1)


WORKLOAD_COLUMNS = np.asarray([i for i, n in enumerate(FEATURE_NAMES) if n.startswith("wl_")])
# (max_iter, max_leaf_nodes) by default: regressions (residual, ratio) / LambdaMART (rank). LambdaMART's
# scores have no scale of their own: 150 trees of 15 leaves pushed the learned part to several times the
# prior's spread within a pool, so a correction learned on other workloads overruled the prior; 40 trees of
# 10 leaves were chosen by leave-one-workload-out cross-validation on the development workloads
# (scripts/bench_cost_model.py `devcv`), never on the held-out ones; 40 trees of 7 leaves since stop 28
# (features v5, the development data re-measured on the current compiler): by the rule "the variant with
# the best mean of devcv's four aggregates (weighted / mean top-1 and top-5), if it is below the analytic
# prior on none of them", the only variant at or above the prior on all four (0.973 / 0.972 / 0.985 /
# 0.981 against the prior's 0.962 / 0.968 / 0.984 / 0.979; 40 x 10 scored 0.958 / 0.958 / 0.984 / 0.972,
# its learned part lowering the development reductions' top-5 from 0.978 to 0.936). Under features v7
# (stop 29) no variant passes that rule (40 x 7: 0.960 / 0.948 / 0.984 / 0.971 against the prior's 0.960 /
# 0.963 / 0.983 / 0.979; benchmarks/cost_model_dev.md); 40 x 7 is kept, the failure stated there.
# Stop 30: with uniform pools of 90 random development workloads added (scripts/bench_cost_model.py DEVRAND;
# 121 development workloads), 40 x 7 without centered features (``center=False``) is the rule's pick and at
# or above the prior on all four aggregates (benchmarks/cost_model_dev.md, stop 30 section).
# Stop 35: on the Xeon's development data (re-measured at stop 34, 98 workloads) under features v9 (the
# prior's last-level cache measured per host), the rule's pick is 150 x 15 with ``transfer_workloads=0``
# (0.961 / 0.948 / 0.983 / 0.984 against the prior's 0.876 / 0.922 / 0.983 / 0.979; 40 x 7 with 32
# transfer workloads 0.957 / 0.941 / 0.983 / 0.977; benchmarks/cost_model_dev.md, stop 35 section). It was
# the default for one commit and is not any more: in real `kiln tune` runs of the attention model (4 seeds
# each, scripts/bench_default_cost_model.py --models attention) it tuned 1.05-1.23x slower than TPE alone,
# 40 x 7 with 32 transfer workloads 0.94-1.05x (docs/cost_model.md, stop 35). devcv scores a model trained
# on ~30 workloads per kind; a tuning run transfers from the few tasks it tuned before, which it never sees.
TREES = {False: (150, 15), True: (40, 7)}
# the multiples of a transfer's correction weight that :meth:`GBDTModel._validate_transfer` chooses from
TRANSFER_SCALES = (0.0, 0.5, 1.0, 2.0)
MIN_VALIDATED = 4  # workloads of a kind below which its transfer is not validated (its scale stays 1)


def signatures(x: np.ndarray) -> list[bytes]:
    """Each row's workload as the bytes of its ``wl_*`` features (equal for all candidates of a workload)."""
    w = np.asarray(x, dtype=np.float64)[:, WORKLOAD_COLUMNS]
    return [np.ascontiguousarray(row).tobytes() for row in w]


def prior_trust(
    x: np.ndarray, latencies: np.ndarray, workloads: np.ndarray, pseudo: float
) -> dict[bytes, float]:
    """How far the analytic prior is trusted on each workload, learned from its measurements: the Spearman
    correlation between the prior's scores and the measured speed over the workload's successful samples
    (negative counts as 0), shrunk towards full trust by ``pseudo`` pseudo-samples,
    ``(n * max(rho, 0) + pseudo) / (n + pseudo)``. A workload whose measurements contradict the prior is
    ranked by what was learned instead of by the prior; with few samples the prior keeps most weight."""
    from scipy.stats import spearmanr

    lat = np.asarray(latencies, dtype=np.float64)
    wl = np.asarray(workloads)
    sig = signatures(x)
    out: dict[bytes, float] = {}
    for w in np.unique(wl):
        rows = np.flatnonzero(wl == w)
        ok = rows[np.isfinite(lat[rows]) & (lat[rows] > 0)]
        rho = 1.0
        if len(ok) >= 4 and np.ptp(lat[ok]) > 0 and np.ptp(x[ok, EST_INDEX]) > 0:
            rho = max(0.0, float(spearmanr(-x[ok, EST_INDEX], -lat[ok]).statistic))
        out[sig[rows[0]]] = (len(ok) * rho + pseudo) / (len(ok) + pseudo)
    return out


class GBDTModel(CostModel):
    """Gradient boosting on per-workload normalized labels; see the module docstring."""

    kind = "gbdt"

    def __init__(
        self,
        seed: int = 0,
        max_iter: int | None = None,
        learning_rate: float = 0.1,
        max_leaf_nodes: int | None = None,
        min_fit: int = 8,
        refit_every: int = 8,
        trust_samples: int = 48,
        prior_samples: float = 32.0,
        max_train: int = 6000,
        balance: bool = True,
        target: str = "rank",
        prior_scale: float = 1.0,
        center: bool = False,
        rank_objective: str = "lambdarank",
        inline_below: int = 64,
        prior_trust: float = 0.0,
        rank_params: dict[str, Any] | None = None,
        transfer_workloads: float = 32.0,
        own_samples: float = 32.0,
        transfer_folds: int = 4,
    ) -> None:
        if target not in TARGETS:
            raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
        super().__init__()
        self.seed = seed
        small = target == "rank"  # see TREES
        self.params = {
            "max_iter": TREES[small][0] if max_iter is None else int(max_iter),
            "learning_rate": learning_rate,
            "max_leaf_nodes": TREES[small][1] if max_leaf_nodes is None else int(max_leaf_nodes),
        }
        self.min_fit, self.refit_every = min_fit, refit_every
        self.trust_samples, self.max_train = trust_samples, max_train
        self.prior_samples = float(prior_samples)
        self.balance = balance
        self.target = target
        self.prior_scale = float(prior_scale)
        self.center = center
        self.rank_objective = rank_objective
        self.inline_below = int(inline_below)
        self.warmed = False  # warm_up() ran
        if prior_trust < 0:
            raise ValueError(f"prior_trust must be >= 0, got {prior_trust}")
        self.prior_trust = float(prior_trust)
        self.rank_params = dict(rank_params or {})
        if transfer_workloads < 0:
            raise ValueError(f"transfer_workloads must be >= 0, got {transfer_workloads}")
        self.transfer_workloads = float(transfer_workloads)
        if own_samples < 0:
            raise ValueError(f"own_samples must be >= 0, got {own_samples}")
        self.own_samples = float(own_samples)
        self.workload_samples: dict[bytes, int] = {}  # training samples of each workload the forest saw
        if transfer_folds < 0 or transfer_folds == 1:
            raise ValueError(f"transfer_folds must be 0 (off) or >= 2, got {transfer_folds}")
        self.transfer_folds = int(transfer_folds)
        self.transfer_scale = np.ones(len(KIND_COLUMNS))  # per kind, learned by _validate_transfer
        self._validated_on: tuple[str, ...] = ()  # the training workloads transfer_scale was learned on
        self.fit_workloads: set[bytes] = set()  # signatures of the workloads the forest was trained on
        self.kind_workloads = np.zeros(len(KIND_COLUMNS))  # of those workloads, how many of each kind
        self.trust: dict[bytes, float] = {}  # workload signature -> how far its prior is trusted
        self.x = np.zeros((0, 0), dtype=np.float32)
        self.lat = np.zeros(0)
        self.wl: list[str] = []
        self.forest: Forest | None = None
        self.n_fit = 0  # samples the current forest was trained on
        self.kind_counts = np.zeros(len(KIND_COLUMNS))  # of those samples, how many of each kind
        self.fits = 0

    # ----------------------------------------------------------------- data
    def update(
        self, features: Any, latencies: Sequence[float], workloads: Sequence[str], fit: bool = True
    ) -> None:
        x = check_features(features)
        lat = np.asarray(latencies, dtype=np.float64).reshape(-1)
        if len(x) != len(lat) or len(lat) != len(workloads):
            raise ValueError("features, latencies and workloads must have the same length")
        if not len(lat):
            return
        self.x = x.copy() if not len(self.x) else np.concatenate([self.x, x])
        self.lat = np.concatenate([self.lat, lat])
        self.wl += [str(w) for w in workloads]
        self.n_updates += len(lat)
        if fit or len(self.lat) <= self.inline_below:  # a fit on this little data costs milliseconds
            self.fit_if_due()

    def warm_up(self) -> None:
        """Import the learning library (LightGBM for ``rank``, scikit-learn for the regressions: about a
        second the first time) so that the first fit in line (``inline_below``) does not wait for it."""
        if self.target == "rank":
            import lightgbm  # noqa: F401
        else:
            import sklearn.ensemble  # noqa: F401
        self.warmed = True

    def fit_if_due(self) -> bool:
        due = self.min_fit if self.forest is None else self.n_fit + self.refit_every
        if len(self.lat) < due:
            return False
        fits = self.fits
        self.fit()
        return self.fits > fits

    @property
    def n_samples(self) -> int:
        return len(self.lat)

    def _training_rows(self) -> np.ndarray:
        n = len(self.lat)
        if n <= self.max_train:
            return np.arange(n)
        wl = np.asarray(self.wl)
        names = np.unique(wl)
        quota = max(1, self.max_train // len(names))
        keep = []
        rng = np.random.default_rng(self.seed)
        for w in names:
            rows = np.flatnonzero(wl == w)
            if len(rows) <= quota:
                keep.append(rows)
                continue
            lat = np.where(np.isfinite(self.lat[rows]), self.lat[rows], np.inf)
            best = rows[np.argsort(lat, kind="stable")[: quota // 4]]
            rest = np.setdiff1d(rows, best)
            keep.append(np.concatenate([best, rng.choice(rest, quota - len(best), replace=False)]))
        return np.sort(np.concatenate(keep))

    def _balanced(self, rows: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Repeat the rows of workloads with few samples (up to 8x, towards the median workload size), so
        a new workload's first measurements are not drowned by big ones. (Row repetition instead of
        ``sample_weight``: scikit-learn's weighted binning is 30x slower.)"""
        wl = np.asarray(self.wl)[rows]
        names, inverse, counts = np.unique(wl, return_inverse=True, return_counts=True)
        if len(names) < 2:
            return rows, y
        reps = np.clip(np.round(np.median(counts) / counts), 1, 8).astype(np.int64)[inverse]
        return np.repeat(rows, reps), np.repeat(y, reps)

    def fit(self) -> None:
        """Train on the data held now (called by :meth:`update` when it is worthwhile)."""
        rows = self._training_rows()
        forest = self._train(rows, keep_trust=True)
        if forest is None:
            return
        scale = self._validate_transfer(rows)  # before the new forest is in place: nothing half-updated
        self.forest = forest
        self.n_fit = len(self.lat)
        self._count_kinds()
        if scale is not None:
            self.transfer_scale, self._validated_on = scale
        self.fits += 1

    def _train(self, rows: np.ndarray, keep_trust: bool = False) -> Forest | None:
        """A forest trained on ``rows`` of the data held (None when they teach nothing); ``keep_trust``: keep
        the prior's trust learned per workload (:attr:`trust`) from them."""
        wl = np.asarray(self.wl)[rows]
        if self.target == "rank":
            return self._rank_forest(rows, wl, keep_trust)
        from sklearn.ensemble import HistGradientBoostingRegressor
        from threadpoolctl import threadpool_limits

        if self.target == "residual":
            y = residual_labels(self.x[rows], self.lat[rows], wl)
        else:
            y = normalized_labels(self.lat[rows], wl)
        if len(rows) < 2 or np.ptp(y) == 0:
            return None
        if self.balance:
            rows, y = self._balanced(rows, y)
        est = HistGradientBoostingRegressor(
            **self.params,
            max_bins=64,
            min_samples_leaf=int(np.clip(len(rows) // 40, 2, 20)),
            l2_regularization=1.0,
            early_stopping=False,
            random_state=self.seed,
        )
        # one thread: OpenMP threads on a loaded machine cost more than they save at this size
        with threadpool_limits(limits=1):
            est.fit(self.x[rows].astype(np.float64), y)
        return Forest.from_sklearn(est)

    def _rank_forest(self, rows: np.ndarray, wl: np.ndarray, keep_trust: bool) -> Forest | None:
        """LambdaMART (LightGBM's ``lambdarank``, one query per workload) boosted from the analytic prior:
        the prior's scores are the initial scores, so the trees learn only how to reorder what the prior
        gets wrong, and they learn it from the order within each workload (never from absolute times)."""
        import lightgbm as lgb

        order = np.argsort(wl, kind="stable")
        rows, wl = rows[order], wl[order]
        _, sizes = np.unique(wl, return_counts=True)
        y = rank_grades(self.lat[rows], wl)
        if len(rows) < 2 or np.ptp(y) == 0:
            return None
        x = self.x[rows].astype(np.float64)
        trust = np.ones(len(rows))
        if self.prior_trust > 0:
            learned_trust = prior_trust(x, self.lat[rows], wl, self.prior_trust)
            trust = np.asarray([learned_trust[k] for k in signatures(x)])
            if keep_trust:
                self.trust = learned_trust
        init = -self.prior_scale * trust * x[:, EST_INDEX]
        if self.center:
            x = centered(x, wl)
        params = {
            "objective": self.rank_objective,
            "learning_rate": self.params["learning_rate"],
            "num_leaves": self.params["max_leaf_nodes"],
            "min_data_in_leaf": int(np.clip(len(rows) // 40, 2, 20)),
            "lambda_l2": 1.0,
            "max_bin": 64,
            "num_threads": 1,  # OpenMP threads on a loaded machine cost more than they save at this size
            "deterministic": True,
            "force_row_wise": True,
            "seed": self.seed,
            "verbose": -1,
            **self.rank_params,
        }
        data = lgb.Dataset(x, y, group=sizes, init_score=init, params={"max_bin": 64, "verbose": -1})
        booster = lgb.train(params, data, num_boost_round=self.params["max_iter"])
        return Forest.from_lightgbm(booster)

    def _learned(self, forest: Forest, x: np.ndarray) -> np.ndarray:
        """The forest's raw output on one workload's pool ``x`` (centered first with ``center``)."""
        return forest.predict(centered(x, np.zeros(len(x))) if self.center and self.target == "rank" else x)

    def _validate_transfer(self, rows: np.ndarray) -> tuple[np.ndarray, tuple[str, ...]] | None:
        """Learn :attr:`transfer_scale`, per kind, from the training data itself: ``transfer_folds`` folds
        of its workloads (stratified by kind); each fold's workloads are ranked, as unseen transfers, by a
        forest trained on the other folds, with the correction weighted as :meth:`correction_weight` weighs
        a transfer times each of :data:`TRANSFER_SCALES`; a kind's scale is the one with the best mean of
        the top-1 and top-5 scores over its workloads (ties: the smaller, the prior's side). A kind with
        fewer than :data:`MIN_VALIDATED` workloads keeps 1. Done again only when the set of training
        workloads changes (a new task, a warm start's first measurements), not at every refit. Returns the
        new scales and the workloads they were learned on, or None to keep the current ones."""
        from cost_model.evaluate import top_k_score

        if self.transfer_folds < 2 or self.transfer_workloads <= 0 or self.target == "ratio":
            return None
        wl = np.asarray(self.wl)[rows]
        names, first = np.unique(wl, return_index=True)
        key = tuple(names.tolist())
        if key == self._validated_on:
            return None
        scale = np.ones(len(KIND_COLUMNS))
        name_kind = kind_index(self.x[rows[first]])
        fold = np.full(len(names), -1)
        rng = np.random.default_rng(self.seed)
        for k in range(len(KIND_COLUMNS)):
            of_kind = np.flatnonzero(name_kind == k)
            if len(of_kind) >= MIN_VALIDATED:
                fold[rng.permutation(of_kind)] = np.arange(len(of_kind)) % self.transfer_folds
        sign = -1.0 if self.target == "residual" else 1.0  # residual: the trees predict slowness
        scores: dict[int, list[np.ndarray]] = {}
        for f in range(self.transfer_folds):
            tested = names[fold == f]
            if not len(tested):
                continue
            train = rows[~np.isin(wl, tested)]
            forest = self._train(train)
            if forest is None:
                continue
            xt = self.x[train]
            n = np.bincount(kind_index(xt), minlength=len(KIND_COLUMNS)).astype(np.float64)
            m = np.bincount(name_kind[~np.isin(names, tested)], minlength=len(KIND_COLUMNS)).astype(float)
            weight = n / (n + self.prior_samples) * m / (m + self.transfer_workloads)
            for name, k in zip(tested, name_kind[fold == f]):
                r = rows[wl == name]
                lat = self.lat[r]
                if np.isfinite(lat).sum() < 2:
                    continue
                x = self.x[r]
                prior = -self.prior_scale * x[:, EST_INDEX].astype(np.float64)
                learned = sign * weight[k] * self._learned(forest, x)
                top = [[top_k_score(prior + s * learned, lat, j) for j in (1, 5)] for s in TRANSFER_SCALES]
                scores.setdefault(int(k), []).append(np.mean(top, axis=1))
        for k, per_workload in scores.items():
            mean = np.nanmean(per_workload, axis=0) if np.isfinite(per_workload).any() else None
            if mean is None or not np.isfinite(mean).all():
                continue
            scale[k] = TRANSFER_SCALES[int(np.flatnonzero(mean >= mean.max() - 1e-12)[0])]
        return scale, key

    def _count_kinds(self) -> None:
        """Samples and distinct workloads of each kind in the data the forest was just trained on."""
        x = self.x[: self.n_fit]
        self.kind_counts = np.bincount(kind_index(x), minlength=len(KIND_COLUMNS)).astype(np.float64)
        sig = signatures(x)
        kind_of = dict(zip(sig, kind_index(x).tolist()))  # each training workload's kind
        self.fit_workloads = set(kind_of)
        self.workload_samples = dict(Counter(sig))
        kinds = np.asarray(list(kind_of.values()), dtype=np.int64)
        self.kind_workloads = np.bincount(kinds, minlength=len(KIND_COLUMNS)).astype(np.float64)

    # ------------------------------------------------------------ predict
    def predict(self, features: Any) -> np.ndarray:
        x = check_features(features)
        prior = -x[:, EST_INDEX].astype(np.float64)
        if self.forest is None:
            return prior
        if self.target == "rank":  # the trees reorder the prior, trusted as same-kind data accumulates
            trust = np.asarray([self.trust.get(k, 1.0) for k in signatures(x)]) if self.trust else 1.0
            learned = self._learned(self.forest, x)  # the rows are one workload's pool
            return self.prior_scale * trust * prior + self.correction_weight(x) * learned
        if self.target == "residual":  # the correction is trusted as same-kind data accumulates
            return prior - self.correction_weight(x) * self.forest.predict(x)
        raw = self.forest.predict(x)
        alpha = min(1.0, self.n_fit / max(1, self.trust_samples))
        if alpha >= 1.0:
            return raw
        return alpha * rank01(raw) + (1.0 - alpha) * rank01(prior)

    def correction_weight(self, features: Any) -> np.ndarray:
        """Per row, ``n / (n + prior_samples)`` for the ``n`` training samples of the row's kind, times the
        transfer discount ``t + (1 - t) * k / (k + own_samples)``: ``t = m / (m + transfer_workloads)`` for
        the ``m`` distinct training workloads of its kind other than the row's own, ``k`` the training
        samples of the row's own workload (0 for a workload the forest was not trained on: a transfer). What
        a few workloads of a kind taught is a correlated guess about another, which the prior should still
        outweigh until the workload's own measurements confirm it; a row whose kind has no other workload
        (a cold search) is not discounted."""
        x = check_features(features)
        kinds = kind_index(x)
        n = self.kind_counts[kinds]
        w = n / (n + self.prior_samples)
        if self.transfer_workloads > 0 and len(x):
            own = np.asarray([self.workload_samples.get(sig, 0) for sig in signatures(x)], dtype=np.float64)
            others = self.kind_workloads[kinds] - (own > 0)
            t = np.minimum(1.0, self.transfer_scale[kinds] * others / (others + self.transfer_workloads))
            share = own / (own + self.own_samples) if self.own_samples > 0 else (own > 0).astype(np.float64)
            w = np.where(others > 0, w * (t + (1.0 - t) * share), w)
        return w

    # --------------------------------------------------------------- save
    def meta(self) -> dict[str, Any]:
        return {
            **super().meta(),
            "seed": self.seed,
            "params": self.params,
            "min_fit": self.min_fit,
            "refit_every": self.refit_every,
            "trust_samples": self.trust_samples,
            "prior_samples": self.prior_samples,
            "max_train": self.max_train,
            "balance": self.balance,
            "target": self.target,
            "prior_scale": self.prior_scale,
            "center": self.center,
            "rank_objective": self.rank_objective,
            "inline_below": self.inline_below,
            "prior_trust": self.prior_trust,
            "rank_params": self.rank_params,
            "transfer_workloads": self.transfer_workloads,
            "own_samples": self.own_samples,
            "transfer_folds": self.transfer_folds,
            "transfer_scale": [float(v) for v in self.transfer_scale],
            "n_fit": self.n_fit,
            "kind_counts": [float(v) for v in self.kind_counts],
            "fits": self.fits,
            "workloads": sorted(set(self.wl)),
        }

    def arrays(self) -> dict[str, np.ndarray]:
        names = sorted(set(self.wl))
        code = {w: i for i, w in enumerate(names)}
        out = {
            "x": self.x,
            "latencies": self.lat,
            "workload_codes": np.asarray([code[w] for w in self.wl], dtype=np.int64),
        }
        if self.forest is not None:
            out.update(self.forest.arrays())
        if self.trust:
            out["trust_signatures"] = np.stack([np.frombuffer(k, dtype=np.float64) for k in self.trust])
            out["trust_values"] = np.asarray(list(self.trust.values()))
        return out

    @classmethod
    def from_saved(cls, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> CostModel:
        model = cls(
            seed=int(meta.get("seed", 0)),
            min_fit=int(meta["min_fit"]),
            refit_every=int(meta["refit_every"]),
            trust_samples=int(meta["trust_samples"]),
            prior_samples=float(meta.get("prior_samples", 32.0)),
            max_train=int(meta["max_train"]),
            balance=bool(meta.get("balance", True)),
            target=str(meta.get("target", "residual")),
            prior_scale=float(meta.get("prior_scale", 1.0)),
            center=bool(meta.get("center", False)),
            rank_objective=str(meta.get("rank_objective", "lambdarank")),
            inline_below=int(meta.get("inline_below", 0)),
            prior_trust=float(meta.get("prior_trust", 0.0)),
            rank_params=dict(meta.get("rank_params") or {}),
            transfer_workloads=float(meta.get("transfer_workloads", 0.0)),  # off in models saved before it
            own_samples=float(meta.get("own_samples", 0.0)),  # likewise
            transfer_folds=int(meta.get("transfer_folds", 0)),  # likewise
            **{k: meta["params"][k] for k in ("max_iter", "learning_rate", "max_leaf_nodes")},
        )
        names = list(meta.get("workloads", []))
        model.x = np.asarray(arrays["x"], dtype=np.float32)
        model.lat = np.asarray(arrays["latencies"], dtype=np.float64)
        model.wl = [names[int(i)] for i in arrays["workload_codes"]]
        model.forest = Forest.from_arrays(arrays)
        if "trust_signatures" in arrays:
            sig = np.asarray(arrays["trust_signatures"], dtype=np.float64)
            model.trust = {row.tobytes(): float(v) for row, v in zip(sig, arrays["trust_values"])}
        model.n_fit = int(meta.get("n_fit", 0))
        if model.forest is not None and model.n_fit:
            model._count_kinds()
        model.kind_counts = np.asarray(meta.get("kind_counts", [0.0] * len(KIND_COLUMNS)), dtype=np.float64)
        scale = meta.get("transfer_scale", [1.0] * len(KIND_COLUMNS))
        model.transfer_scale = np.asarray(scale, dtype=np.float64)
        if model.forest is not None and model.n_fit:
            model._validated_on = tuple(sorted(set(model.wl[: model.n_fit])))
        model.fits = int(meta.get("fits", 0))
        model.n_updates = int(meta.get("n_updates", 0))
        return model
