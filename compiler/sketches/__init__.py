"""Sketch registry: which sketch schedules a group, and lookup by name for stored records."""

from __future__ import annotations

from compiler.errors import KilnError
from compiler.fusion import Group
from compiler.sketches.base import Config, Knob, Sketch, check_against_space
from compiler.sketches.contraction import ContractionSketch
from compiler.sketches.generic import GenericSketch
from compiler.sketches.pointwise import PointwiseSketch
from compiler.sketches.reduction import ReductionSketch

SKETCHES: dict[str, Sketch] = {
    s.name: s for s in (PointwiseSketch(), ReductionSketch(), ContractionSketch(), GenericSketch())
}


def sketch_for(group: Group) -> Sketch:
    for s in SKETCHES.values():
        if s.applies(group):
            return s
    raise KilnError(f"no sketch schedules group {group.name} of kind {group.kind}")


def get_sketch(name: str) -> Sketch:
    try:
        return SKETCHES[name]
    except KeyError:
        raise KilnError(f"unknown sketch '{name}'; known: {', '.join(SKETCHES)}") from None


__all__ = ["SKETCHES", "Config", "Knob", "Sketch", "check_against_space", "get_sketch", "sketch_for"]
