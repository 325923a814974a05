"""Sketches: named, versioned ways to schedule a kind of group.

A sketch offers ``space(group, target)`` (knobs, each with a finite list of legal values),
``default(group, target)`` (a good rule-based config) and ``build(group, config, target)`` (a schedule
written with the loop-IR primitives). A config is a plain JSON-able dict of knob name -> value;
``check`` rejects configs the knob lists allow but the target or shape cannot run, raising
``ScheduleError`` before anything is built (the tuner skips those)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from compiler.errors import ScheduleError
from compiler.fusion import Group
from compiler.loopir import analysis as A
from compiler.loopir.schedule import Schedule
from compiler.loopir.stmt import Block, PrimFunc
from compiler.target import Target
from compiler.te import lower as te_lower
from compiler.te_ops import graph_to_te

Config = dict[str, Any]


@dataclass(frozen=True)
class Knob:
    name: str
    values: tuple[Any, ...]
    doc: str = ""

    def __post_init__(self) -> None:
        if not self.values:
            raise ScheduleError(f"knob {self.name} has no legal values")


class Sketch(ABC):
    """A way to schedule one kind of group.

    Contract: ``space`` lists knobs whose values are all individually legal for this group and target;
    ``check(group, config, target)`` raises ScheduleError (naming the knob) for a config with unknown or
    missing knobs, values outside the lists, or combinations the target cannot run; ``default`` returns
    a config that passes ``check``; ``build`` returns a :class:`Schedule` whose function computes the
    group exactly (the numpy reference is the judge) for every config that passes ``check``.
    """

    name: str = "sketch"
    version: int = 1
    kinds: tuple[str, ...] = ()

    def applies(self, group: Group) -> bool:
        return group.kind in self.kinds

    @abstractmethod
    def space(self, group: Group, target: Target) -> list[Knob]: ...

    @abstractmethod
    def default(self, group: Group, target: Target) -> Config: ...

    @abstractmethod
    def build(self, group: Group, config: Config, target: Target) -> Schedule: ...

    def check(self, group: Group, config: Config, target: Target) -> None:
        check_against_space(self.name, self.space(group, target), config)
        self.check_combination(group, config, target)

    def check_combination(self, group: Group, config: Config, target: Target) -> None:  # noqa: B027
        """Extra constraints between knobs (override); the base has none."""


def check_against_space(sketch: str, knobs: Sequence[Knob], config: Config) -> None:
    if not isinstance(config, dict):
        raise ScheduleError(
            f"{sketch}: a config must be a dict of knob -> value, got {type(config).__name__}"
        )
    names = {k.name for k in knobs}
    unknown = sorted(set(config) - names)
    missing = sorted(names - set(config))
    if unknown or missing:
        raise ScheduleError(
            f"{sketch}: config knobs do not match the space "
            f"(unknown: {unknown or 'none'}, missing: {missing or 'none'})"
        )
    for k in knobs:
        if config[k.name] not in k.values:
            raise ScheduleError(
                f"{sketch}: knob '{k.name}' = {config[k.name]!r} is not one of {list(k.values)}"
            )


def prepare(
    group: Group, name: str | None = None, keep: Callable[[Block], bool] | None = None
) -> tuple[Schedule, list[Block]]:
    """Lower the group to blocks and inline every elementwise intermediate that can be inlined (except the
    ones ``keep`` selects). Returns the schedule and the blocks that remain, in program order."""
    func: PrimFunc = te_lower(graph_to_te(group.subgraph, name or group.name))
    sch = Schedule(func)
    outputs = {id(b) for b in func.outputs}
    for b in list(sch.blocks()):
        if b.is_reduction or any(id(w) in outputs for w in A.writes(b)):
            continue
        if keep is not None and keep(b):
            continue
        sch.compute_inline(b)
    return sch, sch.blocks()


# Below this much work (elements touched, or flops / 8 for contractions) an OpenMP fork/join costs more
# than it saves, and on a loaded machine a spinning thread pool can cost milliseconds: stay serial.
PARALLEL_MIN_WORK = 1 << 16


def divisors_upto(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def pow2_upto(limit: int) -> list[int]:
    out, v = [], 1
    while v <= limit:
        out.append(v)
        v *= 2
    return out


def output_blocks(sch: Schedule) -> list[Block]:
    outs = {id(b) for b in sch.func.outputs}
    return [b for b in sch.blocks() if any(id(w) in outs for w in A.writes(b))]
