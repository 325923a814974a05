"""The CUDA vector-access pass (``compiler.backends.cuda.vector_access.vectorize_accesses``, run by
``codegen.prepare``): the loop IR after it holds the vector nodes (``LetStmt`` of a ``float32x4`` load,
``ExtractLane``, ``MakeVector`` stores), the printer writes them as float4/float2 code, the interpreters
refuse them clearly, and the code compiles with nvcc."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.backends.cuda.codegen import generate_cuda, prepare
from compiler.backends.cuda.nvrtc import nvcc_available, nvcc_check
from compiler.backends.cuda.vector_access import vectorize_accesses
from compiler.loopir import evaluate
from compiler.loopir.expr import ExtractLane, Load, MakeVector, Var, const, walk
from compiler.loopir.interp import InterpError
from compiler.loopir.printer import stmt_str
from compiler.loopir.stmt import Buffer, BufferStore, For, LetStmt, PrimFunc, Stmt, stmt_exprs, walk_stmts
from tests.compiler.backends.cuda.util import CUDA

N = 64  # threads, 4 elements each


def kernel(name: str, offset: int = 0, in_place: bool = False, thread: bool = True) -> PrimFunc:
    """``y[4*tx + k + offset] = x[4*tx + k + offset] * 2`` for a vectorized k < 4 (``y`` is ``x`` when
    ``in_place``; ``tx`` a serial loop unless ``thread``)."""
    x = Buffer("x", (4 * N + 4,), "float32")
    y = x if in_place else Buffer("y", (4 * N + 4,), "float32")
    tx, k = Var("tx"), Var("k")
    i = tx * 4 + k + offset
    inner = For(k, 4, BufferStore(y, (i,), Load(x, (i,)) * const(2.0)), "vectorized")
    body = For(tx, N, inner, "thread", "threadIdx.x") if thread else For(tx, N, inner)
    return PrimFunc(name, [x] if in_place else [x, y], body, 0 if in_place else 1)


def lets(s: Stmt) -> list[LetStmt]:
    return [x for x in walk_stmts(s) if isinstance(x, LetStmt)]


def exprs(s: Stmt) -> list:
    return [e for x in walk_stmts(s) for top in stmt_exprs(x) for e in walk(top)]


def test_aligned_run_becomes_one_vector_load_and_one_vector_store():
    f = kernel("aligned")
    body = prepare(f.body)
    bound = lets(body)
    loads = [b for b in bound if b.var.dtype == "float32x4"]
    assert len(loads) == 1 and isinstance(loads[0].value, Load) and loads[0].value.lanes == 4
    assert loads[0].value.buffer is f.params[0]
    lanes = sorted(e.lane for e in exprs(body) if isinstance(e, ExtractLane))
    assert lanes == [0, 1, 2, 3]
    assert not any(isinstance(e, Load) and e.lanes == 1 for e in exprs(body))  # every read is a lane
    temps = [b for b in bound if b.var.dtype == "float32"]
    assert len(temps) == 4
    (store,) = [x for x in walk_stmts(body) if isinstance(x, BufferStore)]
    assert store.buffer is f.params[1] and isinstance(store.value, MakeVector)
    assert store.value.dtype == "float32x4" and list(store.value.elems) == [t.var for t in temps]
    text = stmt_str(body)
    assert "let v: float32x4 = x[" in text and ": +4]" in text and "lane(v, 3)" in text
    src = generate_cuda([f], CUDA)
    assert "const float4 v = *reinterpret_cast<const float4*>(&x[4 * tx]);" in src
    assert "const float st = v.x * 2.0f;" in src
    assert "*reinterpret_cast<float4*>(&y[4 * tx]) = make_float4(st, st_1, st_2, st_3);" in src


def test_misaligned_run_keeps_scalar_edges_around_a_float2():
    body = prepare(kernel("shifted", offset=1).body)
    assert [b.var.dtype for b in lets(body) if b.var.dtype != "float32"] == ["float32x2"]
    stores = [x for x in walk_stmts(body) if isinstance(x, BufferStore)]
    assert [x.value.dtype for x in stores] == ["float32", "float32x2", "float32"]
    src = generate_cuda([kernel("shifted", offset=1)], CUDA)
    assert "const float2 v = *reinterpret_cast<const float2*>(&x[(4 * tx) + 2]);" in src
    assert "make_float2(st, st_1)" in src


def test_buffer_read_and_written_in_the_run_stays_scalar():
    f = kernel("in_place", in_place=True)
    body = prepare(f.body)
    assert not lets(body)
    assert "float4" not in generate_cuda([f], CUDA)


def test_pass_alone_leaves_scalar_code_untouched():
    """Without the expansion of vectorized loops there is no straight-line run to combine."""
    f = kernel("loop")
    assert vectorize_accesses(f.body) is f.body


@pytest.mark.parametrize("thread", [True, False], ids=["simt", "serial"])
def test_interpreters_refuse_the_vector_nodes(thread):
    f = kernel("aligned", thread=thread)
    x = np.arange(4 * N + 4, dtype=np.float32)
    (y,) = evaluate(f, [x])  # the scalar IR runs
    np.testing.assert_array_equal(y[: 4 * N], 2 * x[: 4 * N])
    g = PrimFunc(f.name, f.params, prepare(f.body), f.num_inputs)
    assert lets(g.body)
    with pytest.raises(InterpError, match=r"let-binding of v: .*CUDA vector accesses"):
        evaluate(g, [x])


@pytest.mark.skipif(not nvcc_available(), reason="nvcc is not installed (CUDA toolkit needed for this check)")
def test_vector_code_compiles_with_nvcc():
    funcs = [kernel("aligned"), kernel("shifted", offset=1), kernel("in_place", in_place=True)]
    res = nvcc_check(generate_cuda(funcs, CUDA))
    assert {"aligned", "shifted", "in_place"} <= set(res)
