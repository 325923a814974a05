"""What the confirmation tests share: the softmax task they confirm and valid configs of it other than its
default."""

from __future__ import annotations

from compiler.errors import ScheduleError
from compiler.frontend import load_model
from compiler.target import Target
from tuner.task import extract_tasks


def softmax_task():
    (task,) = extract_tasks(load_model("softmax"), Target.host())
    return task


def other_configs(task, n: int) -> list[dict]:
    """``n`` valid configs of the task, none of them its default (each differs from it in one knob)."""
    default, found = task.default(), []
    for knob in task.space():
        for value in knob.values:
            config = {**default, knob.name: value}
            if value == default[knob.name]:
                continue
            try:
                task.check(config)
            except ScheduleError:
                continue
            found.append(config)
            if len(found) == n:
                return found
    raise AssertionError(f"the task has fewer than {n} other valid configs")
