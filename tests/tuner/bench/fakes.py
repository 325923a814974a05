"""Contenders for the bench tests: in-memory timings (tuner.bench.contenders.InMemoryContender) plus ones
that compute wrong, fail, or cannot run."""

from __future__ import annotations

from typing import Any

import numpy as np

from compiler.errors import KilnError
from tuner.bench.contenders import BenchContext, Contender, InMemoryContender, Prepared, PreparedWorkload
from tuner.bench.timing import ManualClock


class WrongContender(Contender):
    name = "wrong"
    note = "returns zeros"

    def prepare(self, workload: PreparedWorkload, ctx: BenchContext) -> Prepared:
        zeros = [np.zeros_like(r) + 1.0 for r in workload.refs]
        return Prepared(lambda: zeros)


class BrokenContender(Contender):
    name = "broken"
    note = "cannot compile anything"

    def prepare(self, workload: PreparedWorkload, ctx: BenchContext) -> Prepared:
        raise KilnError(f"op softmax of {workload.name} is not supported")


class MissingContender(Contender):
    name = "missing"
    note = "its package is not installed"

    def unavailable(self, ctx: BenchContext) -> str | None:
        return "missingpkg is not installed"

    def prepare(self, workload: PreparedWorkload, ctx: BenchContext) -> Prepared:  # pragma: no cover
        raise AssertionError("never prepared")


def fake_pair(fast_us: float = 1000.0, slow_us: float = 2000.0, seed: int = 0) -> list[Any]:
    clock = ManualClock()
    return [
        InMemoryContender("fake kiln", fast_us, seed=seed, clock=clock),
        InMemoryContender("fake peer", slow_us, seed=seed + 1, clock=clock),
    ]
