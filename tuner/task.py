"""Tuning tasks: one per unique workload of a model for a target."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from compiler.backends import sketch_for
from compiler.backends.sketch import Config, Knob, Sketch
from compiler.fusion import FusionPlan, Group, fuse
from compiler.graph import Graph
from compiler.passes import optimize
from compiler.target import Target


@dataclass
class Task:
    """A workload to tune: its group, how often the model runs it (weight), and its sketch."""

    workload_key: str
    group: Group
    target: Target
    weight: int
    sketch: Sketch

    @property
    def name(self) -> str:
        return f"{self.group.name}[{self.workload_key[:8]}]"

    @property
    def kind(self) -> str:
        return self.group.kind

    @property
    def flops(self) -> float:
        return self.group.flops

    @property
    def bytes(self) -> float:
        return self.group.bytes

    def space(self) -> list[Knob]:
        return self.sketch.space(self.group, self.target)

    def default(self) -> Config:
        return self.sketch.default(self.group, self.target)

    def check(self, config: Config) -> None:
        self.sketch.check(self.group, config, self.target)


def extract_tasks(graph: Graph, target: Target | str, plan: FusionPlan | None = None) -> list[Task]:
    """Tasks of a model: unique workload keys in first-occurrence order, weight = occurrences.
    Groups that are only views (aliased reshapes) have nothing to tune. ``plan`` is a fusion plan of the
    optimized graph (whole-graph edge ids), None for the rules'."""
    target = Target.parse(target)
    return tasks_of_groups(fuse(optimize(graph), plan, target).groups, target)


def tasks_of_groups(groups: Iterable[Group], target: Target | str) -> list[Task]:
    """One task per unique workload among ``groups`` (views skipped), weight = occurrences: what the
    fusion-plan search tunes for the groups of one plan of a region."""
    target = Target.parse(target)
    tasks: dict[str, Task] = {}
    for group in groups:
        if group.is_view:
            continue
        key = group.workload_key
        if key in tasks:
            tasks[key].weight += 1
        else:
            tasks[key] = Task(key, group, target, 1, sketch_for(group, target))
    return list(tasks.values())
