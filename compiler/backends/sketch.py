"""Sketches: named, versioned ways to schedule a kind of group.

A sketch offers ``space(group, target)`` (knobs, each with a finite list of legal values),
``default(group, target)`` (a good rule-based config) and ``build(group, config, target)`` (a schedule
written with the loop-IR primitives). A config is a plain JSON-able dict of knob name -> value;
``check`` rejects configs the knob lists allow but the target or shape cannot run, raising
``ScheduleError`` before anything is built (the tuner skips those).

Each backend lists its own sketches (``Backend.sketches()``); a sketch's identity in the tuning database
is (backend, sketch name, version). This module also holds the scheduling steps every backend's sketches
start from: :func:`prepare` (lower and inline), :func:`output_blocks`, :func:`fuse_loops` and
:func:`place_windows`. Target-independent analysis of a group lives in
:mod:`compiler.backends.group_analysis`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from compiler.backends import group_analysis as G
from compiler.errors import ScheduleError
from compiler.fusion import Group
from compiler.loopir import analysis as A
from compiler.loopir.schedule import Schedule
from compiler.loopir.stmt import Block, For, PrimFunc
from compiler.target import Target
from compiler.te import lower as te_lower
from compiler.te_ops import graph_to_te

Config = dict[str, Any]


@dataclass(frozen=True)
class Knob:
    """One tunable knob of a sketch and its finite list of legal values."""

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

    def applies_to(self, group: Group, target: Target | None) -> bool:
        """Whether the sketch schedules ``group`` on ``target`` (None: on some target of its backend);
        sketches whose use depends on the target (architecture, math mode) override it."""
        return self.applies(group)

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
    group: Group, name: str | None = None, keep: Callable[[Schedule, Block], bool] | None = None
) -> tuple[Schedule, list[Block]]:
    """Lower the group to blocks and inline every elementwise intermediate that can be inlined (except the
    ones ``keep(schedule, block)`` selects). Returns the schedule and the blocks that remain, in program
    order."""
    func: PrimFunc = te_lower(graph_to_te(group.subgraph, name or group.name))
    sch = Schedule(func)
    outputs = {id(b) for b in func.outputs}
    for b in list(sch.blocks()):
        if b.is_reduction or any(id(w) in outputs for w in A.writes(b)):
            continue
        if keep is not None and keep(sch, b):
            continue
        sch.compute_inline(b)
    return sch, sch.blocks()


def output_blocks(sch: Schedule) -> list[Block]:
    """The blocks that write an output of the scheduled function, in program order."""
    outs = {id(b) for b in sch.func.outputs}
    return [b for b in sch.blocks() if any(id(w) in outs for w in A.writes(b))]


def fuse_loops(sch: Schedule, loops: Sequence[For]) -> For | None:
    """``loops`` (directly nested) fused into one: the loop itself when there is one, None for none."""
    if not loops:
        return None
    return sch.fuse(*loops) if len(loops) > 1 else loops[0]


def place_windows(sch: Schedule, out: Block) -> list[For]:
    """Prepare the output block ``out`` of a pointwise group for tiling and return its spatial loops:
    every reduction stage feeding it (a pooling window) is computed inside its innermost spatial loop,
    and its own reduction (if any) has its init split off."""
    loops = sch.get_loops(out)
    n_sp = G.n_spatial(out)
    spatial = loops[:n_sp]
    for b in sch.blocks():
        if b is not out and b.is_reduction and spatial and G.feeds(b, out):
            sch.compute_at(b, spatial[-1])
    if out.is_reduction and out.init is not None and len(loops) > n_sp:
        sch.decompose_reduction(out, loops[n_sp])
    return spatial


def contraction_stages(sch: Schedule, blocks: Sequence[Block]) -> tuple[Block, Block]:
    """(the contraction block, its epilogue block) of a contraction group after :func:`prepare`. The
    contraction accumulates into a local buffer: when it wrote the output directly, a ``cache_write``
    splits off the epilogue (a copy); otherwise its result becomes local and the epilogue is its reader."""
    mm = next(b for b in blocks if b.is_reduction)
    out_buf = A.writes(mm)[0]
    if any(p is out_buf for p in sch.func.params):
        return mm, sch.cache_write(mm, out_buf, "local")
    sch.set_scope(out_buf, "local")
    return mm, next(b for b in sch.blocks() if out_buf in A.reads(b))
