"""Each schedule primitive: a legal use computes the reference; illegal uses raise ScheduleError."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.errors import ScheduleError
from compiler.loopir import lower_func
from compiler.loopir.stmt import For, walk_stmts
from tests.compiler.loopir.util import assert_matches, chain_graph, matmul_graph, schedule_of, softmax_graph


def _mm():
    g = matmul_graph()
    sch = schedule_of(g)
    return g, sch, sch.get_block("matmul")


def test_split_divisible_and_with_tail():
    g, sch, mm = _mm()
    i, j, _k = sch.get_loops(mm)
    a, b = sch.split(i, [None, 3])
    assert (a.extent, b.extent) == (2, 3) and mm.predicate is None
    c, d = sch.split(j, [4, None])  # 10 -> 4 x 3 = 12: needs a guard
    assert (c.extent, d.extent) == (4, 3) and mm.predicate is not None
    assert_matches(sch, g)
    assert "split(i0, factors=[2, 3])" in sch.show_trace()


@pytest.mark.parametrize("factors", [[None, None], [0, None], [2, 2], [1.5, None], []])
def test_split_rejects_bad_factors(factors):
    _, sch, mm = _mm()
    with pytest.raises(ScheduleError, match="split of loop i0"):
        sch.split(sch.get_loops(mm)[0], factors)


def test_fuse_and_reorder():
    g, sch, mm = _mm()
    i, j, k = sch.get_loops(mm)
    sch.reorder(k, i, j)
    assert [lp.var.name for lp in sch.get_loops(mm)] == ["k0", "i0", "i1"]
    f = sch.fuse(i, j)
    assert f.extent == 60
    assert_matches(sch, g)


def test_fuse_rejects_non_nested_and_reorder_rejects_imperfect_nest():
    g = softmax_graph()
    sch = schedule_of(g)
    for name in ("broadcast_to", "subtract", "broadcast_to_1"):
        sch.compute_inline(sch.get_block(name))
    div = sch.get_block("divide")
    i, j = sch.get_loops(div)
    mx = sch.get_block("reduce_max")
    with pytest.raises(ScheduleError, match="not the only statement"):
        sch.fuse(sch.get_loops(mx)[0], j)
    sch.compute_at(sch.get_block("reduce_sum"), i)
    with pytest.raises(ScheduleError, match="perfect nest"):
        sch.reorder(j, i)
    with pytest.raises(ScheduleError, match="given twice"):
        sch.reorder(i, i)


def test_parallel_vectorize_unroll_legality():
    g, sch, mm = _mm()
    i, j, k = sch.get_loops(mm)
    with pytest.raises(ScheduleError, match="drives reduction variable"):
        sch.parallel(k)
    with pytest.raises(ScheduleError, match="not innermost"):
        sch.vectorize(i)
    sch.parallel(i)
    sch.reorder(i, k, j)
    sch.vectorize(j)
    sch.unroll(k)
    kinds = [lp.kind for lp in sch.get_loops(mm)]
    assert kinds == ["parallel", "unrolled", "vectorized"]
    assert_matches(sch, g)


def test_bind_checks():
    _, sch, mm = _mm()
    i, _j, k = sch.get_loops(mm)
    with pytest.raises(ScheduleError, match="unknown thread axis"):
        sch.bind(i, "warpIdx.x")
    with pytest.raises(ScheduleError, match="drives reduction"):
        sch.bind(k, "blockIdx.x")
    sch.bind(i, "blockIdx.x")
    assert i.kind == "thread" and i.thread == "blockIdx.x"


def test_compute_inline_and_its_illegal_cases():
    g = chain_graph()
    sch = schedule_of(g)
    sch.compute_inline(sch.get_block("constant"))
    sch.compute_inline(sch.get_block("exp"))
    sch.compute_inline(sch.get_block("multiply"))
    assert [b.name for b in sch.blocks()] == ["tanh"]
    assert_matches(sch, g)
    sch2 = schedule_of(g)
    with pytest.raises(ScheduleError, match="function output"):
        sch2.compute_inline(sch2.get_block("tanh"))
    sm = schedule_of(softmax_graph())
    with pytest.raises(ScheduleError, match="reduction"):
        sm.compute_inline(sm.get_block("reduce_max"))


def test_reverse_compute_inline():
    g = chain_graph()
    sch = schedule_of(g)
    with pytest.raises(ScheduleError, match="exactly one intermediate"):
        sch.reverse_compute_inline(sch.get_block("multiply"))  # reads exp and the scalar constant
    sch.compute_inline(sch.get_block("constant"))
    sch.reverse_compute_inline(sch.get_block("tanh"))
    sch.reverse_compute_inline(sch.get_block("multiply"))
    assert [b.name for b in sch.blocks()] == ["exp"]
    assert_matches(sch, g)
    sm = schedule_of(softmax_graph())
    with pytest.raises(ScheduleError, match="is a reduction"):
        sm.reverse_compute_inline(sm.get_block("broadcast_to"))


def test_compute_at_and_region():
    g = softmax_graph(3, 16)
    sch = schedule_of(g)
    for name in ("broadcast_to", "subtract", "broadcast_to_1"):
        sch.compute_inline(sch.get_block(name))
    div = sch.get_block("divide")
    i, _ = sch.get_loops(div)
    with pytest.raises(ScheduleError, match="outside loop"):
        sch.compute_at(sch.get_block("exp"), i)  # reduce_sum, a consumer, is still outside
    sch.compute_at(sch.get_block("reduce_sum"), i)
    sch.compute_at(sch.get_block("exp"), i)
    sch.compute_at(sch.get_block("reduce_max"), i)
    with pytest.raises(ScheduleError, match="already inside"):
        sch.compute_at(sch.get_block("exp"), i)
    assert_matches(sch, g)
    low = lower_func(sch.func)
    from compiler.loopir.stmt import Allocate

    allocs = {s.buffer.name: s.buffer.shape for s in walk_stmts(low.body) if isinstance(s, Allocate)}
    assert allocs["exp"] == (1, 16)  # compacted to one row


def test_reverse_compute_at_with_cache_write():
    g, sch, mm = _mm()
    out = sch.func.outputs[0]
    wb = sch.cache_write(mm, out, "local")
    i, j, k = sch.get_loops(mm)
    io, ii = sch.split(i, [None, 2])
    sch.reorder(io, j, ii, k)
    sch.reverse_compute_at(wb, j)
    sch.decompose_reduction(mm, ii)
    assert_matches(sch, g)
    low = lower_func(sch.func)
    from compiler.loopir.stmt import Allocate

    shapes = [s.buffer.shape for s in walk_stmts(low.body) if isinstance(s, Allocate)]
    assert shapes == [(2, 1)]
    with pytest.raises(ScheduleError, match="does not write"):
        sch.cache_write(mm, sch.func.inputs[0], "local")


def test_cache_read_and_transform_layout():
    g, sch, mm = _mm()
    b = sch.func.inputs[1]
    pack = sch.cache_read(mm, b, "global")
    i, _j, _k = sch.get_loops(mm)
    sch.compute_at(pack, i)
    cache = next(buf for buf in sch.root.alloc_buffers if buf.name.endswith("_global"))
    sch.transform_layout(cache, lambda kk, n: [n // 5, kk, n % 5], [2, 5, 5])
    assert_matches(sch, g)
    with pytest.raises(ScheduleError, match="does not read"):
        sch.cache_read(mm, sch.func.outputs[0], "local")
    with pytest.raises(ScheduleError, match="function parameter"):
        sch.set_scope(b, "local")


def test_rfactor_and_decompose_reduction():
    g = softmax_graph(2, 32)
    sch = schedule_of(g)
    mx = sch.get_block("reduce_max")
    loops = sch.get_loops(mx)
    with pytest.raises(ScheduleError, match="drives spatial variables"):
        sch.rfactor(loops[0])
    _ko, ki = sch.split(loops[-1], [None, 8])
    rf = sch.rfactor(ki)
    assert rf.name == "reduce_max_rf" and any(iv.kind == "S" and iv.extent == 8 for iv in rf.iter_vars)
    init = sch.decompose_reduction(rf, sch.get_loops(rf)[-2])
    assert init.name.endswith("_init") and rf.init is None
    with pytest.raises(ScheduleError, match="has no init"):
        sch.decompose_reduction(rf, sch.get_loops(rf)[0])
    assert_matches(sch, g)


@pytest.mark.parametrize("extent", [8, 7])
def test_reduce_tree_unrolls_a_horizontal_reduction_into_a_balanced_tree(extent):
    """The write-back of an rfactor, unrolled with the REDUCE_TREE annotation, becomes one store of a
    balanced tree (depth ceil(log2(n)) instead of a chain of n) and still computes the reference."""
    from compiler.loopir.expr import Binary, Load
    from compiler.loopir.lower import REDUCE_TREE
    from compiler.loopir.stmt import BufferStore

    g = softmax_graph(3, 8 * extent)
    sch = schedule_of(g)
    for name in ("reduce_max", "reduce_sum"):
        b = sch.get_block(name)
        _ko, ki = sch.split(sch.get_loops(b)[-1], [None, extent])
        sch.rfactor(ki)
        wb = sch.get_block(name)
        sch.decompose_reduction(wb, sch.get_loops(wb)[-1])
        sch.unroll(sch.get_loops(wb)[-1])
        sch.get_loops(wb)[-1].annotations[REDUCE_TREE] = True
    assert_matches(sch, g)
    low = lower_func(sch.func)
    assert not any(isinstance(s, For) and s.annotations.get(REDUCE_TREE) for s in walk_stmts(low.body))

    def depth(e):
        return 1 + max(depth(e.a), depth(e.b)) if isinstance(e, Binary) and e.op in ("+", "max") else 0

    stores = [s for s in walk_stmts(low.body) if isinstance(s, BufferStore) and s.buffer.name == "reduce_sum"]
    tree = next(s.value.b for s in stores if isinstance(s.value, Binary) and isinstance(s.value.a, Load))
    assert depth(tree) == int(np.ceil(np.log2(extent)))


def test_interpreter_catches_out_of_bounds():
    from compiler.loopir.interp import InterpError

    _, sch, _ = _mm()
    low = lower_func(sch.func)
    for s in walk_stmts(low.body):
        if isinstance(s, For) and s.var.name == "i0":
            s.extent += 1  # a broken schedule writes one row too many
    with pytest.raises(InterpError, match="out-of-bounds"):
        from compiler.loopir import evaluate

        evaluate(low, [np.zeros((6, 5), np.float32), np.zeros((5, 10), np.float32)])
