"""The live progress display of `kiln tune` and its final summary table (rich is imported only when
shown, so that `kiln --help` stays fast)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from tuner.scheduler import model_latency
from tuner.search import TaskResult, TaskTuner


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"


def task_rows(results: Sequence[TaskResult]) -> list[dict]:
    """One table row per task (the columns of :data:`COLUMNS`)."""
    rows = []
    for i, s in enumerate(results):
        errors = ", ".join(f"{k} {v}" for k, v in sorted(s.errors.items())) or "-"
        rows.append(
            {
                "#": i,
                "task": s.task.name,
                "kind": s.task.kind,
                "weight": s.task.weight,
                "trials": s.trials,
                "default us": _us(s.default_us),
                "best us": _us(s.best_us),
                "speed-up": "-" if s.speedup is None else f"{s.speedup:.2f}x",
                "errors": errors,
                "state": "done" if s.done else "",
            }
        )
    return rows


COLUMNS = ["#", "task", "kind", "weight", "trials", "default us", "best us", "speed-up", "errors", "state"]


class LiveProgress:
    """A rich Live table refreshed after every measured batch (plain lines when not a terminal)."""

    def __init__(self, tuners: Sequence[TaskTuner], budget_text: str) -> None:
        from rich.console import Console

        self.tuners = tuners
        self.budget_text = budget_text
        self.console = Console()
        self.started = time.monotonic()
        self.live = None
        self.measured = 0

    def _table(self):
        from rich.table import Table

        est_default, est_best = model_latency(self.tuners, "default"), model_latency(self.tuners, "best")
        title = (
            f"kiln tune: {self.measured} measured ({self.budget_text}), "
            f"{time.monotonic() - self.started:.0f} s"
            + (
                f"; model estimate {est_default:,.0f} -> {est_best:,.0f} us"
                if est_default and est_best
                else ""
            )
        )
        table = Table(title=title)
        for c in COLUMNS:
            table.add_column(c)
        for r in task_rows([TaskResult.of(t) for t in self.tuners]):
            table.add_row(*(str(r[c]) for c in COLUMNS))
        return table

    def __enter__(self) -> LiveProgress:
        if self.console.is_terminal:
            from rich.live import Live

            self.live = Live(self._table(), console=self.console, refresh_per_second=4)
            self.live.__enter__()
        return self

    def update(self, tuner: TaskTuner, n: int) -> None:
        self.measured += n
        if self.live is not None:
            self.live.update(self._table())
        else:
            s = tuner.state
            print(
                f"[{time.monotonic() - self.started:6.1f}s] {tuner.task.name}: "
                f"+{n} trials, best {_us(s.best_us)} us"
                + (f" ({s.speedup:.2f}x over default)" if s.speedup else ""),
                flush=True,
            )

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)
