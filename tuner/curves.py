"""Tuning curves: the best-so-far latency of each task over its trials, read from the tuning database's
records in measurement order, as rows (``kiln query curve``) or a matplotlib plot (``kiln tune --plot``,
``kiln query curve --plot``; matplotlib is an optional dependency, imported only to plot)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compiler.errors import KilnError
from db.status import Status

PLOT_HINT = "plotting needs matplotlib: pip install matplotlib (or pip install 'kiln-tuner[plot]')"


@dataclass(frozen=True)
class CurvePoint:
    """One record of a task, in measurement order: its trial number (1-based), status, median latency
    (None unless ok) and the best ok latency up to and including it (None before the first ok one)."""

    trial: int
    status: str
    median_us: float | None
    best_us: float | None


@dataclass(frozen=True)
class Curve:
    """The tuning curve of one task (workload) on one target."""

    workload_key: str
    label: str
    points: list[CurvePoint]

    @property
    def best_us(self) -> float | None:
        return self.points[-1].best_us if self.points else None


def curve_of(db: Any, workload_key: str, target_key: str, label: str, run_id: int | None = None) -> Curve:
    """The curve of ``workload_key`` on ``target_key`` over every stored record (only those of run
    ``run_id``, when given), ordered by record id (the order they were committed)."""
    records = sorted(db.find_records(workload_key, target_key), key=lambda r: r.id)
    if run_id is not None:
        records = [r for r in records if r.run_id == run_id]
    points: list[CurvePoint] = []
    best: float | None = None
    for i, r in enumerate(records, start=1):
        status = r.status.value if isinstance(r.status, Status) else str(r.status)
        median = r.median_us if status == Status.OK.value else None
        if median is not None and (best is None or median < best):
            best = median
        points.append(CurvePoint(i, status, median, best))
    return Curve(workload_key, label, points)


def model_curves(db: Any, model_name: str, target_key: str) -> list[Curve]:
    """The curves of every registered task of ``model_name`` on ``target_key`` (KilnError when the model
    has no registered tasks)."""
    tasks = db.model_tasks(model_name)
    if not tasks:
        raise KilnError(f"model {model_name!r} has no registered tasks in {db.url}; run `kiln tune` first")
    kinds = {w.key: w.kind for w in db.workloads(model_name)}
    return [curve_of(db, key, target_key, f"{kinds.get(key, 'task')}[{key[:8]}]") for key, _ in tasks]


def curve_rows(curves: Sequence[Curve]) -> list[dict[str, Any]]:
    """One row per task per trial: task, workload, trial, status, median_us, best_us."""
    return [
        {
            "task": c.label,
            "workload": c.workload_key,
            "trial": p.trial,
            "status": p.status,
            "median_us": p.median_us,
            "best_us": p.best_us,
        }
        for c in curves
        for p in c.points
    ]


CURVE_COLUMNS = ["task", "workload", "trial", "status", "median_us", "best_us"]


def plot_curves(curves: Sequence[Curve], path: str | Path, title: str) -> Path:
    """Draw best-so-far latency over trials, one line per task, into ``path`` (PNG, SVG, PDF by suffix).
    KilnError with the install command when matplotlib is missing, or when no task has an ok record."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise KilnError(PLOT_HINT) from None
    drawn = [c for c in curves if any(p.best_us is not None for p in c.points)]
    if not drawn:
        raise KilnError("no task has a successful measurement to plot yet")
    path = Path(path)
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    try:
        for c in drawn:
            xs = [p.trial for p in c.points if p.best_us is not None]
            ys = [p.best_us for p in c.points if p.best_us is not None]
            ax.step(xs, ys, where="post", label=f"{c.label} ({ys[-1]:,.1f} us)")
        ax.set_xlabel("trial (records in measurement order)")
        values = [p.best_us for c in drawn for p in c.points if p.best_us is not None]
        log = max(values) > 20 * min(values)  # a slow default would flatten the rest of the curve
        if log:
            ax.set_yscale("log")
        ax.set_ylabel("best latency so far (us" + (", log scale)" if log else ")"))
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
        fig.tight_layout()
        try:
            fig.savefig(path)
        except (OSError, ValueError) as exc:
            raise KilnError(f"cannot write the plot to {path}: {exc}") from None
    finally:
        plt.close(fig)
    return path
