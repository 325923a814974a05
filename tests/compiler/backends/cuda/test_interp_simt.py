"""The SIMT interpreter: lockstep semantics, per-thread / per-block storage, warp reduce, and the GPU
bugs it must refuse (races, divergent barriers, partial warp shuffles, out-of-bounds threads)."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.loopir import evaluate
from compiler.loopir.expr import Call, Load, Var, const, select
from compiler.loopir.interp import InterpError
from compiler.loopir.stmt import Allocate, Barrier, Buffer, BufferStore, For, IfThenElse, PrimFunc, seq


def tloop(var: Var, n: int, body, axis: str = "threadIdx.x") -> For:
    return For(var, n, body, "thread", axis)


def reverse_in_block(barrier: bool, n: int = 8, blocks: int = 3) -> PrimFunc:
    """y[b, i] = x[b, n-1-i] through shared memory: write, (barrier), read another thread's element."""
    x, y = Buffer("x", (blocks, n), "float32"), Buffer("y", (blocks, n), "float32")
    sh = Buffer("sh", (n,), "float32", "shared")
    bx, tx = Var("bx"), Var("tx")
    body = seq(
        tloop(tx, n, BufferStore(sh, (tx,), Load(x, (bx, tx)))),
        Barrier() if barrier else None,
        tloop(tx, n, BufferStore(y, (bx, tx), Load(sh, (const(n - 1) - tx,)))),
    )
    return PrimFunc("rev", [x, y], For(bx, blocks, Allocate(sh, body), "thread", "blockIdx.x"), 1)


def test_shared_memory_exchange_with_barrier():
    x = np.arange(24, dtype=np.float32).reshape(3, 8)
    (y,) = evaluate(reverse_in_block(True), [x])
    np.testing.assert_array_equal(y, x[:, ::-1])


def test_missing_barrier_is_a_race():
    x = np.arange(24, dtype=np.float32).reshape(3, 8)
    with pytest.raises(InterpError, match=r"data race on sh.*without|with no barrier"):
        evaluate(reverse_in_block(False), [x])


def test_divergent_barrier_is_rejected():
    x, y = Buffer("x", (8,), "float32"), Buffer("y", (8,), "float32")
    tx = Var("tx")
    body = tloop(tx, 8, seq(IfThenElse(tx.lt(4), Barrier()), BufferStore(y, (tx,), Load(x, (tx,)))))
    with pytest.raises(InterpError, match=r"__syncthreads\(\) reached by 4 of the 8 threads"):
        evaluate(PrimFunc("f", [x, y], body, 1), [np.zeros(8, np.float32)])


def test_partial_thread_loop_guards_and_local_buffers_are_per_thread():
    # block of 8 threads (from the second loop); the first loop only runs on threads 0..4
    x, y = Buffer("x", (8,), "float32"), Buffer("y", (8,), "float32")
    acc = Buffer("acc", (1,), "float32", "local")
    tx = Var("tx")
    z = (const(0),)
    body = Allocate(
        acc,
        seq(
            tloop(tx, 8, BufferStore(acc, z, const(-1.0))),
            tloop(tx, 5, BufferStore(acc, z, Load(x, (tx,)) * 2.0)),
            tloop(tx, 8, BufferStore(y, (tx,), Load(acc, z))),
        ),
    )
    x_np = np.arange(8, dtype=np.float32)
    kernel = For(Var("bx"), 1, body, "thread", "blockIdx.x")  # the block region holds the allocation
    (y_np,) = evaluate(PrimFunc("f", [x, y], kernel, 1), [x_np])
    np.testing.assert_array_equal(y_np, np.where(np.arange(8) < 5, 2 * x_np, -1))


@pytest.mark.parametrize("op,width", [("sum", 32), ("max", 32), ("min", 8), ("sum", 4)])
def test_warp_reduce_semantics(op, width):
    n = 64
    x, y = Buffer("x", (n,), "float32"), Buffer("y", (n,), "float32")
    tx = Var("tx")
    red = Call(f"warp_reduce_{op}", (Load(x, (tx,)), const(width)), "float32")
    f = PrimFunc("w", [x, y], tloop(tx, n, BufferStore(y, (tx,), red)), 1)
    x_np = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    (y_np,) = evaluate(f, [x_np])
    groups = x_np.reshape(-1, width)
    want = {"sum": groups.sum(1), "max": groups.max(1), "min": groups.min(1)}[op]
    np.testing.assert_allclose(y_np, np.repeat(want, width), rtol=1e-6, atol=1e-6)


def test_warp_reduce_needs_every_lane_of_its_group():
    x, y = Buffer("x", (32,), "float32"), Buffer("y", (32,), "float32")
    tx = Var("tx")
    red = Call("warp_reduce_sum", (Load(x, (tx,)), const(32)), "float32")
    body = tloop(tx, 32, IfThenElse(tx.lt(20), BufferStore(y, (tx,), red)))
    with pytest.raises(InterpError, match="are not all active"):
        evaluate(PrimFunc("w", [x, y], body, 1), [np.ones(32, np.float32)])


def test_two_threads_storing_different_values_race():
    x, y = Buffer("x", (4,), "float32"), Buffer("y", (1,), "float32")
    tx = Var("tx")
    body = tloop(tx, 4, BufferStore(y, (const(0),), Load(x, (tx,))))
    with pytest.raises(InterpError, match="store different values in the same statement"):
        evaluate(PrimFunc("f", [x, y], body, 1), [np.arange(4, dtype=np.float32)])


def test_reading_another_blocks_output_is_a_race():
    x, y = Buffer("x", (4,), "float32"), Buffer("y", (4,), "float32")
    bx = Var("bx")
    body = For(
        bx,
        4,
        BufferStore(y, (bx,), select(bx.gt(0), Load(y, (bx - 1,)), Load(x, (bx,)))),
        "thread",
        "blockIdx.x",
    )
    with pytest.raises(InterpError, match="another block wrote"):
        evaluate(PrimFunc("f", [x, y], body, 1), [np.ones(4, np.float32)])


def test_out_of_bounds_names_the_thread():
    x, y = Buffer("x", (4,), "float32"), Buffer("y", (8,), "float32")
    tx = Var("tx")
    body = tloop(tx, 8, BufferStore(y, (tx,), Load(x, (tx,))))
    with pytest.raises(InterpError, match=r"out-of-bounds access x\[4\] by thread 4"):
        evaluate(PrimFunc("f", [x, y], body, 1), [np.ones(4, np.float32)])


def test_select_only_evaluates_the_taken_side_per_thread():
    x, y = Buffer("x", (4,), "float32"), Buffer("y", (8,), "float32")
    tx = Var("tx")
    body = tloop(tx, 8, BufferStore(y, (tx,), select(tx.lt(4), Load(x, (tx % 8,)), const(0.0))))
    (y_np,) = evaluate(PrimFunc("f", [x, y], body, 1), [np.arange(4, dtype=np.float32)])
    np.testing.assert_array_equal(y_np, [0, 1, 2, 3, 0, 0, 0, 0])


def test_two_dimensional_blocks():
    x, y = Buffer("x", (4, 8), "float32"), Buffer("y", (4, 8), "float32")
    ty, tx = Var("ty"), Var("tx")
    body = tloop(ty, 4, tloop(tx, 8, BufferStore(y, (ty, tx), Load(x, (ty, tx)) + 1.0)), "threadIdx.y")
    x_np = np.arange(32, dtype=np.float32).reshape(4, 8)
    (y_np,) = evaluate(PrimFunc("f", [x, y], body, 1), [x_np])
    np.testing.assert_array_equal(y_np, x_np + 1)
