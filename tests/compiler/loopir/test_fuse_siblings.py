"""Sibling-loop fusion (compiler/loopir/fuse_siblings.py): a loop reading only what the loop before it wrote
in the same iteration joins it; anything else is left alone. Results checked with the interpreter."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.backends import get_backend
from compiler.builder import GraphBuilder
from compiler.fusion import fuse
from compiler.loopir import evaluate
from compiler.loopir.expr import Compare, Load, Var, const
from compiler.loopir.fuse_siblings import FUSE_SIBLINGS, fuse_sibling_loops
from compiler.loopir.stmt import (
    Allocate,
    Buffer,
    BufferStore,
    For,
    IfThenElse,
    PrimFunc,
    Stmt,
    seq,
    walk_stmts,
)
from compiler.passes import optimize
from compiler.reference import run_reference
from tests.targets import X86_TARGETS

F32 = "float32"
N = 16


def _top_loops(s: Stmt) -> list[For]:
    return [x for x in walk_stmts(s) if isinstance(x, For) and x.kind == "serial" and x.extent == N // 4]


def _pair(second, *, guard: bool = False, shift: int = 0, between=None, b_writes_x: bool = False):
    """``for a: t[4a + i] = 2 x[4a + i]`` then (``between``) ``for b: y[4b + i] = second(t, 4b + i)``."""
    x, y = Buffer("x", (N,), F32), Buffer("y", (N,), F32)
    t, u = Buffer("t", (N + 4,), F32, "local"), Buffer("u", (1,), F32, "local")
    a, ai, b, bi = Var("a"), Var("ai"), Var("b"), Var("bi")
    store = BufferStore(t, (a * 4 + ai,), Load(x, (a * 4 + ai,)) * const(2.0, F32))
    if guard:
        store = IfThenElse(Compare("<", a * 4 + ai, const(N - 1)), store)
    first = For(a, N // 4, For(ai, 4, store, "vectorized"))
    idx = b * 4 + bi + shift
    out = BufferStore(x if b_writes_x else y, (b * 4 + bi,), second(t, idx))
    if b_writes_x:
        out = seq(out, BufferStore(y, (b * 4 + bi,), Load(t, (b * 4 + bi,))))
    body = seq(
        *(BufferStore(t, (const(N + k),), const(0.0, F32)) for k in range(4)),
        first,
        *(between(t, u) if between else ()),
        For(b, N // 4, For(bi, 4, out, "vectorized")),
    )
    return PrimFunc("pair", [x, y], Allocate(t, Allocate(u, body)), 1)


def _run(func: PrimFunc) -> np.ndarray:
    x = np.arange(N, dtype=np.float32) - 3.0
    return evaluate(func, [x.copy()])[0]


def test_a_loop_reading_what_its_sibling_wrote_in_the_same_iteration_joins_it():
    func = _pair(lambda t, i: Load(t, (i,)) + const(1.0, F32))
    fused = PrimFunc(func.name, func.params, fuse_sibling_loops(func.body), 1)
    assert len(_top_loops(func.body)) == 2 and len(_top_loops(fused.body)) == 1
    np.testing.assert_array_equal(_run(fused), _run(func))


@pytest.mark.parametrize(
    "case",
    [
        dict(shift=1),  # reads an element the next iteration writes
        dict(guard=True),  # the store may not run
        dict(b_writes_x=True),  # writes what the first loop reads
        dict(
            between=lambda t, u: [BufferStore(u, (const(0),), Load(t, (const(3),)))]
        ),  # a statement reads t between
    ],
    ids=["next_iteration", "guarded_store", "writes_its_input", "read_between"],
)
def test_anything_else_is_left_alone(case):
    func = _pair(lambda t, i: Load(t, (i,)) + const(1.0, F32), **case)
    assert fuse_sibling_loops(func.body) is func.body or len(_top_loops(fuse_sibling_loops(func.body))) == 2


@pytest.mark.parametrize("target", list(X86_TARGETS.values()), ids=list(X86_TARGETS))
def test_softmax_sums_its_kept_row_in_the_exp_loop(target):
    """The reduction sketch keeps softmax's exp row and asks for the fusion: after the CPU backend lowers it,
    one loop computes exp and accumulates the sum, and the kernel still computes softmax."""
    b = GraphBuilder("sm")
    graph = b.build([b.softmax(b.input("x", (3, 64)), axis=-1)])
    (group,) = fuse(optimize(graph), None).groups
    backend = get_backend(target)
    sketch = backend.sketch_for(group)
    config = sketch.default(group, target)
    assert config["keep"] == "buffer"
    sch = sketch.build(group, config, target)
    assert sch.func.attrs.get(FUSE_SIBLINGS)
    func = backend.lower(sch.func)

    def stored(loop: For) -> set[str]:
        return {s.buffer.name for s in walk_stmts(loop.body) if isinstance(s, BufferStore)}

    loops = [lp for lp in walk_stmts(func.body) if isinstance(lp, For) and lp.kind == "serial"]
    joint = [lp for lp in loops if {"exp", "reduce_sum_rf"} <= stored(lp) and "divide" not in stored(lp)]
    assert joint, func
    x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32) * 4
    np.testing.assert_allclose(evaluate(func, [x])[0], run_reference(graph, [x])[0], rtol=1e-5, atol=1e-7)
