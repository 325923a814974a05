"""GPU lowering: cross-thread reductions become warp shuffles (+ a shared-memory block reduce), thread
variables are unified, stores outside thread loops are guarded, barriers are inserted where threads
communicate through shared memory, and the launch shape is recorded."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.backends.cuda.lower import lower_gpu_func, stmt_exprs
from compiler.builder import GraphBuilder
from compiler.errors import CompileError
from compiler.fusion import fuse
from compiler.loopir import evaluate
from compiler.loopir.expr import Call, walk
from compiler.loopir.schedule import Schedule
from compiler.loopir.stmt import Allocate, Barrier, BufferStore, For, PrimFunc, walk_stmts
from compiler.passes import optimize
from compiler.te import lower as te_lower
from compiler.te_ops import graph_to_te
from tests.compiler.backends.cuda.util import PLAIN, check_group


def softmax_group(rows=3, cols=64):
    b = GraphBuilder("sm")
    return fuse(optimize(b.build([b.softmax(b.input("x", (rows, cols)))]))).groups[0]


def red_config(t, rpb=1, v=1, keep="reread", unroll=1):
    return {
        "threads_per_row": t,
        "rows_per_block": rpb,
        "vector": v,
        "keep_row": keep,
        "unroll": unroll,
        "fast_math": 0,
    }


def calls(func: PrimFunc) -> list[Call]:
    return [e for s in walk_stmts(func.body) for x in stmt_exprs(s) for e in walk(x) if isinstance(e, Call)]


def barriers(s) -> int:
    return sum(isinstance(x, Barrier) for x in walk_stmts(s))


def test_one_warp_reduction_is_shuffles_only():
    func = check_group(softmax_group(), red_config(32))
    warps = [c.name for c in calls(func) if c.name.startswith("warp_")]
    assert warps == ["warp_reduce_max", "warp_reduce_sum"]
    assert barriers(func.body) == 0
    assert not any(isinstance(s, Allocate) and s.buffer.scope == "shared" for s in walk_stmts(func.body))
    assert func.attrs["launch"] == {"grid": [3, 1, 1], "block": [32, 1, 1], "shared_bytes": 0}


def test_block_reduction_goes_through_shared_memory():
    func = check_group(softmax_group(4, 96), red_config(128, rpb=2, v=2))
    shared = [
        s.buffer for s in walk_stmts(func.body) if isinstance(s, Allocate) and s.buffer.scope == "shared"
    ]
    assert sorted(b.shape for b in shared) == [(2, 4), (2, 4)]  # [rows per block, warps] per reduction
    assert barriers(func.body) == 4  # publish + reuse, for each of the two reductions
    widths = [int(c.args[1].value) for c in calls(func) if c.name.startswith("warp_")]
    assert widths == [32, 4, 32, 4]
    assert func.attrs["launch"]["block"] == [128, 2, 1] and func.attrs["launch"]["grid"] == [2, 1, 1]


def test_registers_mode_keeps_the_row_per_thread():
    func = check_group(softmax_group(2, 256), red_config(32, v=4, keep="registers"))
    local = {s.buffer.name: s.buffer.shape for s in walk_stmts(func.body) if isinstance(s, Allocate)}
    assert local["in0_local"] == (1, 1, 2, 4)  # C x V values of its row per thread


def test_thread_variables_are_unified():
    func = lower_gpu_func(_schedule_rows().func)
    names = {s.var.name for s in walk_stmts(func.body) if isinstance(s, For) and s.kind == "thread"}
    assert names == {"bx", "tx"}


def _schedule_rows(bind_reduce_directly: bool = False, mismatch: bool = False):
    g = GraphBuilder("rs")
    x = g.input("x", (4, 64))
    sch = Schedule(te_lower(graph_to_te(optimize(g.build([g.apply("reduce_sum", x, axes=[-1])])))))
    block = sch.blocks()[0]
    i, k = sch.get_loops(block)
    sch.bind(i, "blockIdx.x")
    if mismatch:  # another loop of the kernel makes the block 64 threads wide
        copy = sch.cache_read(block, sch.func.params[0], "local")
        sch.compute_at(copy, i)
        sch.bind(sch.get_loops(copy)[-1], "threadIdx.x")
    if bind_reduce_directly:
        ko, ki = sch.split(k, [None, 32])
        sch.bind(ki, "threadIdx.x", allow_reduce=True)  # serial ko + thread ki in one reduction
        return sch
    ko, ki = sch.split(k, [None, 32])
    sch.reorder(ki, ko)
    rf = sch.rfactor(ki)
    sch.bind(ki, "threadIdx.x")
    wb = sch.get_block(block.name)
    sch.reverse_compute_at(wb, i)
    (r,) = [lp for lp in sch.get_loops(wb) if lp is not i]
    sch.bind(r, "threadIdx.x", allow_reduce=True)
    for buf in sch.root.alloc_buffers:
        buf.scope = "local"
    del rf
    return sch


def test_rows_schedule_by_hand_matches_reference():
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    (y,) = evaluate(lower_gpu_func(_schedule_rows().func), [x])
    np.testing.assert_allclose(y, x.sum(-1), rtol=1e-5, atol=1e-5)


def test_cross_thread_reduction_over_serial_and_thread_loops_is_rejected():
    with pytest.raises(CompileError, match="rfactor the thread-bound loop first"):
        lower_gpu_func(_schedule_rows(bind_reduce_directly=True).func)


def test_cross_thread_reduction_must_span_the_block():
    with pytest.raises(CompileError, match="runs over 32 threads but the block has 64"):
        lower_gpu_func(_schedule_rows(mismatch=True).func)


def test_row_outputs_are_stored_by_one_thread():
    b = GraphBuilder("mean")
    x = b.input("x", (2, 3, 8, 8))
    group = fuse(optimize(b.build([b.global_avg_pool2d(x)]))).groups[0]
    func = check_group(group, red_config(64))
    guards = [s for s in walk_stmts(func.body) if isinstance(s, For) and s.kind == "thread" and s.extent == 1]
    assert guards and all(isinstance(g.body, BufferStore) and g.body.buffer.scope == "global" for g in guards)


@pytest.mark.parametrize("double_buffer", [0, 1])
def test_shared_tiles_get_barriers(double_buffer):
    b = GraphBuilder("mm")
    group = fuse(optimize(b.build([b.matmul(b.input("a", (32, 48)), b.input("w", (48, 32)))]))).groups[0]
    cfg = {
        "bm": 32,
        "bn": 32,
        "bk": 8,
        "tm": 4,
        "tn": 4,
        "vector": 4,
        "double_buffer": double_buffer,
        **PLAIN,
    }
    func = check_group(group, cfg)
    (ko,) = [s for s in walk_stmts(func.body) if isinstance(s, For) and s.kind != "thread" and s.extent == 6]
    assert barriers(ko) == (1 if double_buffer else 2)
    assert barriers(func.body) == 2  # double buffering moves one out of the loop (after the prologue)
    staged = [
        s.buffer for s in walk_stmts(func.body) if isinstance(s, Allocate) and s.buffer.scope == "shared"
    ]
    assert all(b.shape[0] == 2 for b in staged) == bool(double_buffer)


def test_a_kernel_without_blockidx_runs_as_one_block():
    g = GraphBuilder("pw")
    x = g.input("x", (40,))
    sch = Schedule(te_lower(graph_to_te(optimize(g.build([g.exp(x)])))))
    (i,) = sch.get_loops(sch.blocks()[0])
    sch.bind(i, "threadIdx.x")
    func = lower_gpu_func(sch.func)
    assert func.attrs["launch"] == {"grid": [1, 1, 1], "block": [40, 1, 1], "shared_bytes": 0}
    x_np = np.linspace(-1, 1, 40, dtype=np.float32)
    np.testing.assert_allclose(evaluate(func, [x_np])[0], np.exp(x_np), rtol=1e-6)
