"""The live progress display of `kiln tune` (an overall progress bar with elapsed time and ETA above the
per-task table) and its final summary table (rich is imported only when shown, so that `kiln --help`
stays fast)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from tuner.scheduler import model_latency
from tuner.search import TaskResult, TaskTuner


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"


def task_rows(
    results: Sequence[TaskResult], speedup: Callable[[TaskResult], str] | None = None
) -> list[dict]:
    """One table row per task (the columns of :data:`COLUMNS`). The speed-up column is ``speedup(result)``
    (the confirmed speed-up with its spread, see :mod:`tuner.confirm`); without it, or before a task has
    both latencies, it says ``unconfirmed`` or ``-``: a speed-up from the search's single measurements is
    never printed as one."""
    rows = []
    for i, s in enumerate(results):
        errors = ", ".join(f"{k} {v}" for k, v in sorted(s.errors.items())) or "-"
        rows.append(
            {
                "#": i,
                "task": s.task.name,
                "kind": s.task.kind,
                "weight": s.task.weight,
                "trials": s.measured,
                "default us": _us(s.default_us),
                "best us": _us(s.best_us),
                "speed-up": "-"
                if s.speedup is None
                else (speedup(s) if speedup is not None else "unconfirmed"),
                "errors": errors,
                "state": "done" if s.done else "",
            }
        )
    return rows


COLUMNS = ["#", "task", "kind", "weight", "trials", "default us", "best us", "speed-up", "errors", "state"]


def _clock(seconds: float) -> str:
    whole = max(0, round(seconds))
    h, rest = divmod(whole, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}"


class LiveProgress:
    """An overall rich progress bar (trials done of the budget, or seconds of a time budget; elapsed and
    ETA) above a per-task table, refreshed after every measured batch; plain lines when not a terminal.

    ``done`` and ``spent_seconds`` are what a resumed run had already used; ``file`` is where it is shown
    (default stdout; ``kiln tune --format json`` shows it on stderr)."""

    def __init__(
        self,
        tuners: Sequence[TaskTuner],
        budget_text: str,
        *,
        total_trials: int | None = None,
        seconds: float | None = None,
        done: int = 0,
        spent_seconds: float = 0.0,
        file: TextIO | None = None,
        console: Any = None,
    ) -> None:
        from rich.console import Console

        self.tuners = tuners
        self.budget_text = budget_text
        self.console = console if console is not None else Console(file=file)
        self.file = file
        self.started = time.monotonic()
        self.live: Any = None
        self.total_trials = total_trials
        self.seconds = seconds
        self.done = done  # trials stored under the run, earlier invocations included
        self.spent_before = spent_seconds
        self.measured = 0  # measured by this invocation
        self.progress: Any = None
        self.bar: Any = None

    def _elapsed(self) -> float:
        return time.monotonic() - self.started

    def _by_time(self) -> bool:
        return self.total_trials is None

    def eta_seconds(self) -> float | None:
        """Seconds left at this invocation's rate (for a time budget, what is left of it); None before the
        first batch of a trial budget."""
        if self._by_time():
            return max(0.0, float(self.seconds or 0) - self.spent_before - self._elapsed())
        left = max(0, int(self.total_trials or 0) - self.done)
        eta = left * self._elapsed() / self.measured if self.measured else None
        if self.seconds is not None:  # a trial budget with a time limit ends at whichever comes first
            by_time = max(0.0, self.seconds - self.spent_before - self._elapsed())
            eta = by_time if eta is None else min(eta, by_time)
        return eta

    def _make_progress(self):  # type: ignore[no-untyped-def]
        from rich.progress import (
            BarColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        eta = TextColumn("ETA {task.fields[eta]}")
        count = TextColumn("{task.fields[count]}")
        progress = Progress(
            TextColumn("[bold]kiln tune"),
            BarColumn(),
            TaskProgressColumn(),
            count,
            TextColumn("elapsed"),
            TimeElapsedColumn(),
            eta,
            console=self.console,
            auto_refresh=False,
        )
        total = float(self.seconds or 0) if self._by_time() else float(self.total_trials or 0)
        self.bar = progress.add_task("tune", total=max(total, 1e-9), **self._fields())
        progress.update(self.bar, completed=self._completed())
        return progress

    def _completed(self) -> float:
        if self._by_time():
            return min(float(self.seconds or 0), self.spent_before + self._elapsed())
        return float(self.done)

    def _fields(self) -> dict[str, str]:
        eta = self.eta_seconds()
        if self._by_time():
            count = f"{self.done} trials, {self.spent_before + self._elapsed():.0f}/{self.seconds:g} s"
        else:
            count = f"{self.done}/{self.total_trials} trials"
        return {"eta": "-:--:--" if eta is None else _clock(eta), "count": count}

    def _table(self):  # type: ignore[no-untyped-def]
        from rich.table import Table

        est_default, est_best = model_latency(self.tuners, "default"), model_latency(self.tuners, "best")
        title = f"{self.measured} measured now ({self.budget_text})" + (
            f"; model estimate {est_default:,.0f} -> {est_best:,.0f} us" if est_default and est_best else ""
        )
        table = Table(title=title)
        for c in COLUMNS:
            table.add_column(c)
        for r in task_rows([TaskResult.of(t) for t in self.tuners]):
            table.add_row(*(str(r[c]) for c in COLUMNS))
        return table

    def renderable(self):  # type: ignore[no-untyped-def]
        """The overall progress bar above the per-task table (what the live display shows)."""
        from rich.console import Group

        if self.progress is None:
            self.progress = self._make_progress()
        self.progress.update(self.bar, completed=self._completed(), **self._fields())
        return Group(self.progress, self._table())

    def __enter__(self) -> LiveProgress:
        if self.console.is_terminal:
            from rich.live import Live

            self.live = Live(self.renderable(), console=self.console, refresh_per_second=4)
            self.live.__enter__()
        return self

    def update(self, tuner: TaskTuner, n: int) -> None:
        """After a batch of ``n`` measured candidates of ``tuner``."""
        self.measured += n
        self.done += n
        if self.live is not None:
            self.live.update(self.renderable(), refresh=True)  # every batch is drawn, however quick
        else:
            s = tuner.state
            eta = self.eta_seconds()
            budget = (
                f"{self.done}/{self.total_trials} trials"
                if not self._by_time()
                else f"{self.done} trials, {self.spent_before + self._elapsed():.0f}/{self.seconds:g} s"
            )
            print(
                f"[{self._elapsed():6.1f}s] {tuner.task.name}: "
                f"+{n} trials, best {_us(s.best_us)} us"
                + (f" (default {_us(s.default_us)} us, speed-up unconfirmed)" if s.speedup else "")
                + f"; {budget}, ETA {'-' if eta is None else _clock(eta)}",
                file=self.file or sys.stdout,
                flush=True,
            )

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.update(self.renderable())
            self.live.__exit__(*exc)
