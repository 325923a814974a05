"""Share a tuning budget between tasks (Ansor / MetaSchedule style).

A round-robin warm-up gives every task one batch (its default config first). After that each round goes
to the task with the largest expected gain per trial in whole-model latency: weight x (recent rate of
improvement of its best latency, with an optimistic floor proportional to its current best), plus a
small epsilon of random choice so no task starves. Tasks that stopped early or exhausted their space
leave the rotation. The budget is a number of measured trials or a wall-clock time, whichever is given.

Several workers sharing a run (:mod:`tuner.workers`) each run a scheduler: each takes, among the tasks it
would pick, the first that no other worker is tuning, and stops when the run's shared trial budget is
spent (waiting while the rest of it is in flight with other workers, whose claims come back if they die).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tuner.search import TaskTuner
from tuner.workers import GO, STOP, LocalShare, WorkShare


@dataclass
class Budget:
    """A tuning budget: measured trials in total, trials per selected task, and/or wall-clock seconds."""

    trials: int | None = None
    seconds: float | None = None
    trials_per_task: int | None = None

    def __post_init__(self) -> None:
        if self.trials is None and self.seconds is None and self.trials_per_task is None:
            raise ValueError("a budget needs trials, trials per task or seconds")
        if self.trials is not None and self.trials_per_task is not None:
            raise ValueError("a budget has trials or trials per task, not both")

    def total_trials(self, n_tasks: int) -> int | None:
        """The number of measured trials this budget allows over ``n_tasks`` tasks (None: no limit)."""
        if self.trials_per_task is not None:
            return self.trials_per_task * n_tasks
        return self.trials


def model_latency(tuners: Sequence[TaskTuner], which: str = "best") -> float | None:
    """sum(weight x latency) over tasks: the whole-model estimate from per-kernel measurements."""
    total = 0.0
    for t in tuners:
        v = t.state.best_us if which == "best" else t.state.default_us
        if v is None:
            return None
        total += t.task.weight * v
    return total


class TaskScheduler:
    def __init__(
        self,
        tuners: Sequence[TaskTuner],
        budget: Budget,
        batch: int = 8,
        epsilon: float = 0.05,
        window: int = 3,
        seed: int = 0,
        on_round: Callable[[TaskTuner, int], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        share: WorkShare | None = None,
    ) -> None:
        self.tuners = list(tuners)
        self.budget = budget
        self.batch = batch
        self.epsilon = epsilon
        self.window = window
        self.rng = random.Random(seed)
        self.on_round = on_round
        self.measured = 0
        self.clock = clock  # seconds; injectable so a time budget is testable without a wall clock
        self.started = clock()
        self.share = share if share is not None else LocalShare()

    def _left(self) -> bool:
        if self.budget.trials is not None and self.measured >= self.budget.trials:
            return False
        if self.budget.seconds is not None and self.clock() - self.started >= self.budget.seconds:
            return False
        return any(not t.state.done for t in self.tuners)

    def _batch_for(self) -> int:
        if self.budget.trials is None:
            return self.batch
        return max(1, min(self.batch, self.budget.trials - self.measured))

    def gain(self, t: TaskTuner) -> float:
        """Expected decrease of whole-model latency (us) per trial spent on ``t``."""
        s = t.state
        if s.best_us is None:
            return float("inf")
        hist = s.history[-(self.window + 1) :]
        rate = 0.0
        if len(hist) >= 2 and hist[-1][0] > hist[0][0]:
            rate = (hist[0][1] - hist[-1][1]) / (hist[-1][0] - hist[0][0])
        optimistic = s.best_us / max(1, s.trials) * 0.5  # untried tasks and early plateaus still get a look
        return t.task.weight * max(rate, optimistic)

    def _pick(self, warm: list[TaskTuner]) -> TaskTuner:
        """The warm-up's next task (one without any record yet), else (epsilon) a random one, else the one
        of largest gain; among those in that order, the first no other worker is tuning (WorkShare.choose)."""
        for t in warm:  # another worker may have tuned it meanwhile: its records end its warm-up
            if t.state.trials == 0:
                t.refresh()
        live = [t for t in self.tuners if not t.state.done]
        warm[:] = [t for t in warm if not t.state.done and t.state.trials == 0]
        if warm:
            order = warm + [t for t in live if t not in warm]
        elif self.rng.random() < self.epsilon:
            order = self.rng.sample(live, len(live))
        else:
            order = sorted(live, key=self.gain, reverse=True)
        chosen = order[self.share.choose([t.ident for t in order])]
        if chosen in warm:
            warm.remove(chosen)
        return chosen

    def run(self) -> int:
        """Spend the budget; returns the number of measured trials. Ctrl-C stops after the current batch's
        results are committed (the measurer finishes or is interrupted; nothing half-written is kept)."""
        warm = [t for t in self.tuners if not t.state.done]
        while self._left():
            gate = self.share.gate()
            if gate == STOP:
                break
            if gate != GO:
                self.share.pause()
                continue
            t = self._pick(warm)
            n = t.step(self._batch_for())
            self.measured += n
            if self.on_round is not None:
                self.on_round(t, n)
            if n == 0 and not t.state.done:  # other workers hold every candidate asked: let them finish
                self.share.pause()
        return self.measured
