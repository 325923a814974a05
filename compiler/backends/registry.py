"""Sketch registry: which sketch schedules a group, and lookup by name for stored records."""

from __future__ import annotations

from compiler.backends.cpu.sketches.contraction import ContractionSketch
from compiler.backends.cpu.sketches.generic import GenericSketch
from compiler.backends.cpu.sketches.pointwise import PointwiseSketch
from compiler.backends.cpu.sketches.reduction import ReductionSketch
from compiler.backends.sketch import Config, Knob, Sketch, check_against_space
from compiler.errors import KilnError
from compiler.fusion import Group

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
