"""Loop IR: expressions, statements with blocks, printer, simplifier, schedule primitives, lowering
and an interpreter."""

from __future__ import annotations

from compiler.loopir.interp import evaluate, run_func
from compiler.loopir.lower import lower_func
from compiler.loopir.schedule import Schedule

__all__ = ["Schedule", "evaluate", "lower_func", "run_func"]
