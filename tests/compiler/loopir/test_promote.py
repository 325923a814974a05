"""Register promotion as a loop-IR pass: which local buffers are promoted, which loops are expanded, and
that the promoted function still computes the same result (interpreter)."""

from __future__ import annotations

import numpy as np

from compiler.backends.cpu import vectorize
from compiler.loopir import evaluate
from compiler.loopir.expr import Const, Load, Var, const, walk
from compiler.loopir.promote import MEMORY_TILE, PROMOTE, expand_fallback_loops, promote_locals
from compiler.loopir.stmt import Allocate, Buffer, BufferStore, For, PrimFunc, Stmt, seq, walk_stmts
from compiler.loopir.visitor import StmtExprVisitor

F32 = "float32"


def _rowsum(acc_len: int, inner_kind: str, chunk: int = 4) -> PrimFunc:
    """out[r] = sum(x[r, :]) through a local accumulator of ``acc_len`` partial sums."""
    rows, cols = 3, 32
    x, out = Buffer("x", (rows, cols), F32), Buffer("out", (rows,), F32)
    acc = Buffer("acc", (acc_len,), F32, "local")
    r, ko, j, j0, lane = Var("r"), Var("ko"), Var("j"), Var("j0"), Var("lane")
    body = Allocate(
        acc,
        seq(
            For(j0, acc_len, BufferStore(acc, (j0,), const(0.0, F32)), inner_kind),
            For(
                ko,
                cols // acc_len,
                For(
                    j,
                    acc_len,
                    BufferStore(acc, (j,), Load(acc, (j,)) + Load(x, (r, ko * acc_len + j))),
                    inner_kind,
                ),
            ),
            BufferStore(out, (r,), const(0.0, F32)),
            For(lane, acc_len, BufferStore(out, (r,), Load(out, (r,)) + Load(acc, (lane,))), "unrolled"),
        ),
    )
    return PrimFunc("rowsum", [x, out], For(r, rows, body, "parallel"), 1)


def _allocs(s: Stmt) -> list[Allocate]:
    return [x for x in walk_stmts(s) if isinstance(x, Allocate)]


class _Indices(StmtExprVisitor):
    def __init__(self, buf: Buffer) -> None:
        self.buf, self.found = buf, []

    def visit_Load(self, e: Load) -> None:
        if e.buffer is self.buf:
            self.found.append(e.indices)
        self.generic_visit_expr(e)

    def visit_BufferStore(self, s: BufferStore) -> None:
        if s.buffer is self.buf:
            self.found.append(s.indices)
        self.generic_visit_stmt(s)


def _check(func: PrimFunc, body: Stmt) -> None:
    x = np.random.default_rng(0).standard_normal((3, 32)).astype(np.float32)
    (got,) = evaluate(PrimFunc(func.name, func.params, body, func.num_inputs), [x])
    np.testing.assert_allclose(got, x.astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)


def test_scalar_promotion_expands_the_loops_indexing_the_buffer():
    func = _rowsum(4, "unrolled")
    body = promote_locals(func.body)
    (alloc,) = _allocs(body)
    assert alloc.annotations == {PROMOTE: 1}
    # every loop over the accumulator's index is gone and each access has a constant index
    assert [x.var.name for x in walk_stmts(body) if isinstance(x, For)] == ["r", "ko"]
    v = _Indices(alloc.buffer)
    v.visit_stmt(body)
    assert v.found and all(isinstance(i, Const) for idx in v.found for i in idx)
    assert func.body is not body and _allocs(func.body)[0].annotations == {}  # the input is untouched
    _check(func, body)


def test_buffer_indexed_by_a_long_serial_loop_stays_an_array():
    func = _rowsum(32, "serial")  # a serial loop of 32 iterations is not expanded (limit 16)
    body = promote_locals(func.body)
    assert _allocs(body)[0].annotations == {}
    assert body is func.body


def test_buffer_used_inside_a_parallel_loop_is_not_promoted():
    acc = Buffer("acc", (4,), F32, "local")
    out = Buffer("out", (4,), F32)
    i = Var("i")
    body = Allocate(
        acc,
        For(
            i,
            4,
            seq(BufferStore(acc, (i,), const(1.0, F32)), BufferStore(out, (i,), Load(acc, (i,)))),
            "parallel",
        ),
    )
    assert _allocs(promote_locals(body))[0].annotations == {}


def test_vector_promotion_keeps_the_vector_lane_and_vectorizes():
    func = _rowsum(16, "vectorized")
    body = promote_locals(func.body, vectorize.vectorizable)
    (alloc,) = _allocs(body)
    assert alloc.annotations == {PROMOTE: 16}
    vec = expand_fallback_loops(vectorize.vectorize_loops(body))
    stores = [x for x in walk_stmts(vec) if isinstance(x, BufferStore) and x.buffer is alloc.buffer]
    assert stores and all(s.value.dtype == "float32x16" for s in stores)
    assert any(isinstance(e, Load) and e.lanes == 16 for s in stores for e in walk(s.value))
    _check(func, body)  # the promoted (scalar) IR still runs in the interpreter


def test_scalar_fallback_loop_over_a_promoted_buffer_is_expanded():
    func = _rowsum(4, "vectorized")
    # width 4 vector code is possible, but here nothing vectorizes: the loops over acc are expanded
    body = expand_fallback_loops(promote_locals(func.body, lambda loop, ranges, promoted: False))
    assert _allocs(body)[0].annotations == {PROMOTE: 1}
    assert not any(isinstance(x, For) and x.kind == "vectorized" for x in walk_stmts(body))
    _check(func, body)


def test_a_scalar_tile_over_max_scalars_stays_an_array_marked_as_a_memory_tile():
    """``max_scalars`` caps scalar promotion: the tile stays an array with its loops, marked MEMORY_TILE
    (indexed like a register tile, too large); it still computes the row sums. A buffer that is not
    indexed like a tile (a long serial loop) gets no mark."""
    func = _rowsum(8, "unrolled")
    body = promote_locals(func.body, max_scalars=4)
    (alloc,) = _allocs(body)
    assert alloc.annotations == {MEMORY_TILE: True}
    assert [x.var.name for x in walk_stmts(body) if isinstance(x, For)] == ["r", "j0", "ko", "j", "lane"]
    _check(func, body)
    assert _allocs(promote_locals(func.body, max_scalars=8))[0].annotations == {PROMOTE: 1}
    serial = _rowsum(32, "serial")
    assert _allocs(promote_locals(serial.body, max_scalars=4))[0].annotations == {}
