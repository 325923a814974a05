"""The C target's vectorization pass: the loop IR after the pass (vector loads/stores, broadcasts, ramps,
gathers, guarded tails, scalar fallbacks), and compiled runs of the result against numpy."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from compiler.backends.cpu.codegen import generate_c, prepare
from compiler.backends.cpu.vectorize import vectorize_loops
from compiler.loopir import evaluate
from compiler.loopir.expr import (
    Broadcast,
    Load,
    MakeVector,
    Ramp,
    Select,
    Var,
    call,
    cast,
    const,
    select,
    walk,
)
from compiler.loopir.interp import InterpError
from compiler.loopir.stmt import Buffer, BufferStore, For, IfThenElse, PrimFunc, Stmt, seq, walk_stmts
from compiler.target import Target
from tests.compiler.backends.cpu.util import run

F32 = "float32"


def _exprs(s: Stmt) -> list:
    return [
        e for x in walk_stmts(s) if isinstance(x, BufferStore) for i in (*x.indices, x.value) for e in walk(i)
    ]


def _axpy() -> PrimFunc:
    """y[i, j] = x[i, j] * 2 + s[i] + float(j), j vectorized (16 lanes)."""
    x, s, y = Buffer("x", (4, 16), F32), Buffer("s", (4,), F32), Buffer("y", (4, 16), F32)
    i, j = Var("i"), Var("j")
    value = Load(x, (i, j)) * 2.0 + Load(s, (i,)) + cast(j, F32)
    return PrimFunc("axpy", [x, s, y], For(i, 4, For(j, 16, BufferStore(y, (i, j), value), "vectorized")), 2)


def test_contiguous_loop_becomes_vector_statements():
    f = _axpy()
    body = vectorize_loops(f.body)
    assert not any(isinstance(x, For) and x.kind == "vectorized" for x in walk_stmts(body))
    (store,) = [x for x in walk_stmts(body) if isinstance(x, BufferStore)]
    assert store.value.dtype == "float32x16" and [str(i) for i in store.indices] == ["i", "0"]
    es = _exprs(body)
    assert any(isinstance(e, Load) and e.buffer.name == "x" and e.lanes == 16 for e in es)
    assert any(
        isinstance(e, Broadcast) and isinstance(e.value, Load) and e.value.buffer.name == "s" for e in es
    )
    assert any(isinstance(e, Ramp) for e in es)
    with pytest.raises(InterpError, match="scalar loop IR"):  # the interpreters never run vector IR
        evaluate(
            PrimFunc(f.name, f.params, body, 2), [np.zeros((4, 16), np.float32), np.zeros(4, np.float32)]
        )


def test_strided_load_is_a_gather():
    x, y = Buffer("x", (16, 4), F32), Buffer("y", (4, 16), F32)
    i, j = Var("i"), Var("j")
    f = PrimFunc(
        "tr", [x, y], For(i, 4, For(j, 16, BufferStore(y, (i, j), Load(x, (j, i))), "vectorized")), 1
    )
    body = vectorize_loops(f.body)
    gathers = [e for e in _exprs(body) if isinstance(e, MakeVector)]
    assert len(gathers) == 1 and len(gathers[0].elems) == 16


def _tail() -> PrimFunc:
    """y[o*16 + v] = exp(x[o*16 + v]) for o*16 + v < 40: the last chunk is partial."""
    x, y = Buffer("x", (40,), F32), Buffer("y", (40,), F32)
    o, v = Var("o"), Var("v")
    idx = o * 16 + v
    guarded = IfThenElse(idx.lt(40), BufferStore(y, (idx,), call("exp", Load(x, (idx,)))))
    return PrimFunc("tail", [x, y], For(o, 3, For(v, 16, guarded, "vectorized")), 1)


def test_guarded_tail_is_vector_code_or_the_scalar_loop():
    f = _tail()
    body = vectorize_loops(f.body)
    (guard,) = [x for x in walk_stmts(body) if isinstance(x, IfThenElse) and x.else_ is not None]
    assert isinstance(guard.else_, For) and guard.else_.kind == "vectorized"  # the scalar fallback
    assert [x.value.dtype for x in walk_stmts(guard.then) if isinstance(x, BufferStore)] == ["float32x16"]


def test_loop_invariant_store_stays_scalar():
    x, y = Buffer("x", (16,), F32), Buffer("y", (1,), F32)
    v = Var("v")
    loop = For(v, 16, BufferStore(y, (const(0),), Load(x, (v,))), "vectorized")
    assert vectorize_loops(loop) is loop


def test_prepare_splits_to_the_target_width():
    x, y = Buffer("x", (64,), F32), Buffer("y", (64,), F32)
    v = Var("v")
    f = PrimFunc("cp", [x, y], For(v, 64, BufferStore(y, (v,), Load(x, (v,)) + 1.0), "vectorized"), 1)
    for vector_bytes, lanes in ((64, 16), (32, 8), (16, 4)):
        out = prepare(f, dataclasses.replace(Target.host(), vector_bytes=vector_bytes))
        widths = {x.value.dtype for x in walk_stmts(out.body) if isinstance(x, BufferStore)}
        assert widths == {f"float32x{lanes}"}
    assert f.body.kind == "vectorized"  # the input is untouched


@pytest.mark.parametrize("make", [_axpy, _tail])
def test_vectorized_kernels_match_numpy(make):
    f = make()
    rng = np.random.default_rng(1)
    ins = [rng.standard_normal(b.shape).astype(np.float32) for b in f.inputs]
    got = run(f, *ins)
    want = evaluate(f, ins)  # the scalar loop IR in the interpreter
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def _column_masks() -> PrimFunc:
    """A flat convolution tile's column padding: the lanes of ``(16 + j) % 12`` known at every lane, so the
    selects have constant lane masks: z = c + select(col >= 1, x[j + 1], 0) * w (a masked FMA),
    y = select(col < 11, x[j], 0) (a zero-masking load), u = select(col < 12, x[j], 0) (every lane)."""
    x, c, w = Buffer("x", (17,), F32), Buffer("c", (16,), F32), Buffer("w", (1,), F32)
    z, y, u = Buffer("z", (16,), F32), Buffer("y", (16,), F32), Buffer("u", (16,), F32)
    j = Var("j")
    col = (j + 16) % 12
    zero, weight = const(0.0, F32), Load(w, (const(0),))
    stores = [
        BufferStore(z, (j,), Load(c, (j,)) + select(col.ge(1), Load(x, (j + 1,)), zero) * weight),
        BufferStore(y, (j,), select(col.lt(11), Load(x, (j,)), zero)),
        BufferStore(u, (j,), select(col.lt(12), Load(x, (j,)), zero)),
    ]
    return PrimFunc("masks", [x, c, w, z, y, u], For(j, 16, seq(*stores), "vectorized"), 3)


def test_selects_on_constant_lane_masks_are_masked_fmas_and_loads():
    f = _column_masks()
    body = vectorize_loops(f.body)
    stores = [x for x in walk_stmts(body) if isinstance(x, BufferStore)]
    assert [s.value.dtype for s in stores] == ["float32x16"] * 3  # vector code, no scalar fallback
    masks = [e for s in stores for e in walk(s.value) if isinstance(e, Select)]
    assert len(masks) == 2 and all(isinstance(m.cond, MakeVector) for m in masks)  # u's select is gone
    assert [bool(b.value) for b in masks[0].cond.elems] == [(k + 16) % 12 >= 1 for k in range(16)]
    src = generate_c([f], dataclasses.replace(Target.host(), vector_bytes=64))
    assert "kiln_fma_mask_f32x16(" in src and "kiln_maskz_load_f32x16(" in src
    rng = np.random.default_rng(2)
    ins = [rng.standard_normal(b.shape).astype(np.float32) for b in f.inputs]
    for got, want in zip(run(f, *ins), evaluate(f, ins)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
