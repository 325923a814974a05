"""Held-out evaluation of cost models: cross-validation by workload, rank metrics, a plot.

Every fold trains a fresh model on the other workloads' records and scores the held-out workloads' ``ok``
records (leave-one-workload-out by default, or k folds of workloads). Metrics per held-out workload:

- Spearman rank correlation between the score and the measured speed (``-latency``);
- top-k score (TenSet): ``true best latency / best latency among the model's k highest scores``, so 1.0
  means the model's top k contains the best measured candidate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cost_model.dataset import Dataset
from cost_model.model import CostModel


def top_k_score(scores: np.ndarray, latencies: np.ndarray, k: int) -> float:
    """``min(latencies) / min(latencies of the k highest scores)`` over finite latencies (1.0 is perfect)."""
    lat = np.asarray(latencies, dtype=np.float64)
    ok = np.isfinite(lat)
    if not ok.any():
        return math.nan
    s, lat = np.asarray(scores, dtype=np.float64)[ok], lat[ok]
    top = np.argsort(-s, kind="stable")[:k]
    return float(lat.min() / lat[top].min())


def spearman(scores: np.ndarray, latencies: np.ndarray) -> float:
    """Spearman correlation of scores with speed (``-latency``) over finite latencies (nan if undefined)."""
    from scipy.stats import spearmanr

    lat = np.asarray(latencies, dtype=np.float64)
    ok = np.isfinite(lat)
    s = np.asarray(scores, dtype=np.float64)[ok]
    if ok.sum() < 3 or np.ptp(s) == 0 or np.ptp(lat[ok]) == 0:
        return math.nan
    return float(spearmanr(s, -lat[ok]).statistic)


@dataclass
class WorkloadScore:
    workload: str
    kind: str
    n: int
    spearman: float
    top1: float
    top5: float


@dataclass
class EvalResult:
    """Held-out scores of one model: one row per workload, and the raw predictions for plots."""

    model: str
    folds: str
    rows: list[WorkloadScore] = field(default_factory=list)
    predictions: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def mean(self, metric: str) -> float:
        vals = [getattr(r, metric) for r in self.rows if not math.isnan(getattr(r, metric))]
        return float(np.mean(vals)) if vals else math.nan


def fold_of(workloads: list[str], folds: int) -> dict[str, int]:
    """Workload -> fold: leave-one-workload-out when ``folds`` is 0 (or >= the number of workloads)."""
    names = sorted(set(workloads))
    if folds <= 0 or folds >= len(names):
        return {w: i for i, w in enumerate(names)}
    return {w: i % folds for i, w in enumerate(names)}


def cross_validate(
    data: Dataset, make: Callable[[], CostModel], name: str, folds: int = 0, min_ok: int = 5
) -> EvalResult:
    """Train ``make()`` on all but one fold of workloads, score the held-out fold; see the module
    docstring. Workloads with fewer than ``min_ok`` ok records are scored but not reported."""
    fold = fold_of(data.workloads, folds)
    label = "leave-one-workload-out" if len(set(fold.values())) == len(fold) else f"{folds}-fold by workload"
    result = EvalResult(name, label)
    wl = np.asarray(data.workloads)
    for f in sorted(set(fold.values())):
        held = [w for w, k in fold.items() if k == f]
        train = ~np.isin(wl, held)
        model = make()
        if train.any():
            model.update(data.x[train], data.latencies[train], list(wl[train]))
        score_pools(model, data, held, result, min_ok)
    result.rows.sort(key=lambda r: (r.kind, r.workload))
    return result


def train_and_score(
    train: Dataset, test: Dataset, make: Callable[[], CostModel], name: str, min_ok: int = 5
) -> EvalResult:
    """Train ``make()`` on every record of ``train``, then score each workload of ``test`` once (a fixed
    held-out set rather than folds)."""
    model = make()
    if len(train):
        model.update(train.x, train.latencies, list(train.workloads))
    result = EvalResult(name, "trained on a separate set")
    score_pools(model, test, sorted(set(test.workloads)), result, min_ok)
    result.rows.sort(key=lambda r: (r.kind, r.workload))
    return result


def score_pools(
    model: CostModel, data: Dataset, workloads: list[str], result: EvalResult, min_ok: int
) -> None:
    """Add ``model``'s scores of each workload's records in ``data`` to ``result`` (rows and predictions);
    workloads with fewer than ``min_ok`` ok records are left out."""
    wl = np.asarray(data.workloads)
    for w in workloads:
        rows = np.flatnonzero(wl == w)
        lat = data.latencies[rows]
        if np.isfinite(lat).sum() < min_ok:
            continue
        scores = np.asarray(model.predict(data.x[rows]), dtype=np.float64)
        result.predictions[w] = (scores, lat)
        result.rows.append(
            WorkloadScore(
                w,
                data.kinds.get(w, "?"),
                int(np.isfinite(lat).sum()),
                spearman(scores, lat),
                top_k_score(scores, lat, 1),
                top_k_score(scores, lat, 5),
            )
        )


def plot(results: list[EvalResult], path: str | Path, title: str = "") -> Path:
    """Bars of held-out Spearman / top-1 / top-5 per workload for each model, and predicted rank vs
    measured speed for the first model. Written with matplotlib's Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    workloads = [r.workload for r in results[0].rows]
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.2), gridspec_kw={"width_ratios": [1, 1, 1, 1.1]})
    width = 0.8 / max(1, len(results))
    xs = np.arange(len(workloads))
    for ax, metric in zip(axes[:3], ("spearman", "top1", "top5")):
        for j, res in enumerate(results):
            by = {r.workload: getattr(r, metric) for r in res.rows}
            ax.bar(xs + j * width, [by.get(w, math.nan) for w in workloads], width, label=res.model)
        ax.set_xticks(xs + width * (len(results) - 1) / 2)
        ax.set_xticklabels([f"{w[:6]}\n{_kind(results[0], w)}" for w in workloads], fontsize=7)
        ax.set_title(f"held-out {metric}")
        ax.set_ylim(min(0.0, ax.get_ylim()[0]), 1.05)
        ax.axhline(0.9 if metric == "top5" else 0, color="grey", lw=0.6, ls="--")
    axes[0].legend(fontsize=8)
    ax = axes[3]
    for w, (scores, lat) in results[0].predictions.items():
        ok = np.isfinite(lat)
        rank = np.argsort(np.argsort(scores[ok])) / max(1, ok.sum() - 1)
        ax.scatter(rank, lat[ok].min() / lat[ok], s=6, alpha=0.5, label=w[:6])
    ax.set_xlabel(f"{results[0].model} score rank (held out)")
    ax.set_ylabel("best latency / latency")
    ax.set_title("predicted rank vs measured speed")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _kind(res: EvalResult, w: str) -> str:
    return next((r.kind for r in res.rows if r.workload == w), "?")
