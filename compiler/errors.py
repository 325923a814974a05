"""Errors Kiln reports to users. Every message names what was wrong: the op, node, knob, or file."""

from __future__ import annotations


class KilnError(Exception):
    """Base class of every error Kiln raises on bad input; the CLI prints it without a traceback."""


class GraphError(KilnError):
    """A malformed graph: a dangling value, a cycle, a duplicate definition."""


class TypeInferenceError(GraphError):
    """An op was given inputs or attributes it cannot accept (shapes, dtypes, attrs)."""


class UnknownOpError(GraphError):
    """A node names an op that is not registered."""


class ScheduleError(KilnError):
    """A schedule primitive or a knob configuration that is illegal for the loop nest it was applied to."""


class CompileError(KilnError):
    """Generated code failed to compile; the message carries the kernel name and the compiler's lines."""


class ModelError(KilnError):
    """An unknown model name or a model file that cannot be loaded."""
