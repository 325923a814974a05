"""Lockstep (SIMT) interpretation of GPU-bound loops.

The interpreter (``compiler.loopir.interp``) hands every outermost thread-bound loop to
:func:`compile_thread_loop`. ``blockIdx`` loops run serially, one thread block after the other; the code
inside the innermost one is a *block region* run by all threads of the block at once: each statement is
executed for every active thread before the next statement starts (maximal loop fission at every
statement, hence at every barrier). Values are numpy arrays over the active threads:

* a loop bound to ``threadIdx.*`` narrows the active threads to those whose index on that axis is below
  its extent, and its variable is that index; serial loops and uniform code run once for all threads;
  an ``if`` splits the active threads between its branches;
* ``local`` buffers hold one copy per thread, ``shared`` buffers one per block, ``global`` ones are the
  kernel arguments;
* ``warp_reduce_sum/max/min(value, width)`` combines the value over each aligned group of ``width``
  lanes of a warp (lane = linear thread index % 32) with the xor butterfly CUDA's ``__shfl_xor_sync``
  performs; every lane of a group must be active;
* :class:`~compiler.loopir.stmt.Intrinsic` statements (tensor cores: ``mma``, ``ldmatrix``, ``cp.async``)
  run with the PTX ISA's semantics and fragment layouts: ``compiler.loopir.interp_simt_tc``.

What would be undefined on a GPU raises :class:`~compiler.loopir.interp.InterpError`: out-of-bounds
accesses, a ``__syncthreads()`` not reached by every thread of the block, a warp reduce with inactive
lanes, and data races: a thread reading shared memory another thread wrote (or writing what another
thread read) with no barrier in between, two threads storing different values to one element, a block
reading global memory another block wrote in the same launch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from compiler import dtypes
from compiler.loopir.expr import (
    Var,
)
from compiler.loopir.interp import SCALAR_ONLY
from compiler.loopir.interp_simt_expr import Fn, _err, _expr, _full, _indices, _raise_if
from compiler.loopir.stmt import (
    Allocate,
    Barrier,
    Block,
    BufferStore,
    Evaluate,
    For,
    IfThenElse,
    Intrinsic,
    LetStmt,
    SeqStmt,
    Stmt,
    walk_stmts,
)


@dataclass
class _Launch:
    """State of one kernel launch: blocks started so far and who wrote which global element."""

    blocks: int = 0
    writer: dict[int, np.ndarray] = field(default_factory=dict)  # global thread id, -1 = not written
    wblock: dict[int, np.ndarray] = field(default_factory=dict)
    wepoch: dict[int, np.ndarray] = field(default_factory=dict)


@dataclass
class _Shared:
    writer: np.ndarray
    wepoch: np.ndarray
    reader: np.ndarray  # thread id, -2 = several threads
    repoch: np.ndarray


class _Ctx:
    def __init__(self, env: dict, dims: tuple[int, int, int], launch: _Launch) -> None:
        self.env = env
        self.bufs: dict[int, np.ndarray] = env["__bufs__"]
        self.dims = dims
        self.n = dims[0] * dims[1] * dims[2]
        ids = np.arange(self.n)
        self.axis = {
            "threadIdx.x": ids % dims[0],
            "threadIdx.y": (ids // dims[0]) % dims[1],
            "threadIdx.z": ids // (dims[0] * dims[1]),
        }
        self.pvars: dict[Var, np.ndarray] = {}
        self.local: set[int] = set()
        self.shared: dict[int, _Shared] = {}
        self.launch = launch
        self.block = launch.blocks
        launch.blocks += 1
        self.epoch = 0
        self.cp_open: list = []  # cp.async copies issued since the last commit (interp_simt_tc)
        self.cp_groups: list[list] = []  # committed groups not yet waited for, oldest first

    def where(self) -> str:
        return f"block {self.block}"


# ------------------------------------------------------------------ entry
def compile_thread_loop(loop: For) -> Callable[[dict], None]:
    """A runner for an outermost thread-bound loop (see the module docstring)."""
    from compiler.loopir.interp import compile_stmt

    tag = loop.thread or ""
    if tag.startswith("blockIdx"):
        nested = any(
            isinstance(s, For) and (s.thread or "").startswith("blockIdx") for s in walk_stmts(loop.body)
        )
        body = compile_stmt(loop.body) if nested else _region(loop.body)
        var, n = loop.var, loop.extent

        def run_grid(env: dict) -> None:
            own = "__simt_launch__" not in env
            if own:
                env["__simt_launch__"] = _Launch()
            try:
                for i in range(n):
                    env[var] = i
                    body(env)
            finally:
                if own:
                    del env["__simt_launch__"]

        return run_grid
    return _region(loop)  # a kernel without blockIdx loops: one block


def _region(s: Stmt) -> Callable[[dict], None]:
    dims_map: dict[str, int] = {}
    for x in walk_stmts(s):
        if isinstance(x, For) and x.kind == "thread" and (x.thread or "").startswith("threadIdx"):
            dims_map[x.thread] = max(dims_map.get(x.thread, 1), x.extent)  # type: ignore[index]
    dims = (dims_map.get("threadIdx.x", 1), dims_map.get("threadIdx.y", 1), dims_map.get("threadIdx.z", 1))
    body = _stmt(s)

    def run(env: dict) -> None:
        launch = env.get("__simt_launch__")
        if launch is None:
            launch = env["__simt_launch__"] = _Launch()
            try:
                ctx = _Ctx(env, dims, launch)
                body(ctx, np.arange(ctx.n))
            finally:
                del env["__simt_launch__"]
            return
        ctx = _Ctx(env, dims, launch)
        body(ctx, np.arange(ctx.n))

    return run


# ------------------------------------------------------------- statements
def _stmt(s: Stmt) -> Fn:
    if isinstance(s, SeqStmt):
        parts = [_stmt(x) for x in s.stmts]

        def run_seq(ctx: _Ctx, act: np.ndarray) -> None:
            for p in parts:
                p(ctx, act)

        return run_seq
    if isinstance(s, For):
        return _for(s)
    if isinstance(s, BufferStore):
        return _store(s)
    if isinstance(s, IfThenElse):
        cond, then = _expr(s.cond), _stmt(s.then)
        other = _stmt(s.else_) if s.else_ is not None else None

        def run_if(ctx: _Ctx, act: np.ndarray) -> None:
            if not len(act):
                return
            c = _full(cond(ctx, act), len(act)).astype(bool)
            if c.any():
                then(ctx, act[c])
            if other is not None and not c.all():
                other(ctx, act[~c])

        return run_if
    if isinstance(s, Allocate):
        return _allocate(s)
    if isinstance(s, Barrier):

        def run_barrier(ctx: _Ctx, act: np.ndarray) -> None:
            if len(act) != ctx.n:
                raise _err(
                    f"__syncthreads() reached by {len(act)} of the {ctx.n} threads of {ctx.where()}: "
                    "a barrier "
                    "under a thread-dependent condition is undefined behaviour"
                )
            ctx.epoch += 1

        return run_barrier
    if isinstance(s, Evaluate):
        fn = _expr(s.expr)
        return lambda ctx, act: (fn(ctx, act) if len(act) else None, None)[1]
    if isinstance(s, Intrinsic):
        from compiler.loopir.interp_simt_tc import compile_intrinsic

        return compile_intrinsic(s)
    if isinstance(s, LetStmt):
        raise _err(f"cannot interpret the let-binding of {s.var.name}: " + SCALAR_ONLY)
    if isinstance(s, Block):
        raise _err(f"block {s.name} is still present: lower the function before interpreting it")
    raise _err(f"cannot interpret statement {type(s).__name__}")


def _for(s: For) -> Fn:
    body, var, n = _stmt(s.body), s.var, s.extent
    tag = s.thread or ""
    if s.kind == "thread" and tag.startswith("blockIdx"):
        raise _err(
            f"loop {s.var.name} is bound to {tag} inside a thread block (blockIdx loops must be outermost)"
        )
    if s.kind == "thread":

        def run_thread(ctx: _Ctx, act: np.ndarray) -> None:
            ids = ctx.axis[tag]
            sub = act[ids[act] < n]
            old = ctx.pvars.get(var)
            ctx.pvars[var] = ids
            try:
                if len(sub):
                    body(ctx, sub)
            finally:
                if old is None:
                    del ctx.pvars[var]
                else:
                    ctx.pvars[var] = old

        return run_thread

    def run_for(ctx: _Ctx, act: np.ndarray) -> None:
        if not len(act):
            return
        env = ctx.env
        for i in range(n):
            env[var] = i
            body(ctx, act)

    return run_for


def _allocate(s: Allocate) -> Fn:
    from compiler.loopir.interp import poisoned

    body, buf = _stmt(s.body), s.buffer
    if buf.scope == "global":
        raise _err(
            f"buffer {buf.name} is allocated in global memory inside a thread block; use shared or local"
        )

    def run_alloc(ctx: _Ctx, act: np.ndarray) -> None:
        saved = ctx.bufs.get(buf.uid)
        saved_sh = ctx.shared.get(buf.uid)
        if buf.scope == "local":
            ctx.bufs[buf.uid] = poisoned((ctx.n, *buf.shape), buf.dtype)
            ctx.local.add(buf.uid)
        else:
            ctx.bufs[buf.uid] = poisoned(buf.shape, buf.dtype)
            size = max(1, buf.numel)
            ctx.shared[buf.uid] = _Shared(
                np.full(size, -1, np.int64),
                np.zeros(size, np.int64),
                np.full(size, -1, np.int64),
                np.zeros(size, np.int64),
            )
        try:
            body(ctx, act)
        finally:
            if saved is None:
                del ctx.bufs[buf.uid]
                ctx.local.discard(buf.uid)
            else:
                ctx.bufs[buf.uid] = saved
            if saved_sh is None:
                ctx.shared.pop(buf.uid, None)
            else:
                ctx.shared[buf.uid] = saved_sh

    return run_alloc


def _store(s: BufferStore) -> Fn:
    idx = [_expr(i) for i in s.indices]
    val = _expr(s.value)
    buf = s.buffer
    uid, name, shape, np_dtype = buf.uid, buf.name, buf.shape, dtypes.to_numpy(buf.dtype)

    def run_store(ctx: _Ctx, act: np.ndarray) -> None:
        k = len(act)
        if not k:
            return
        v = _full(val(ctx, act), k).astype(np_dtype)
        ix = _indices(idx, ctx, act, name, shape)
        arr = ctx.bufs[uid]
        if uid in ctx.local:
            arr[(act, *ix)] = v
            return
        if buf.scope == "local":
            raise _err(f"local buffer {name} is allocated outside the thread block that uses it")
        flat = np.ravel_multi_index(ix, shape) if shape else np.zeros(k, np.int64)
        _check_same_values(flat, v, act, ctx, name)
        gid = act + ctx.block * ctx.n
        old = arr[tuple(ix)] if shape else np.full(k, arr[()])
        changed = ~_same(old, v)
        sh = ctx.shared.get(uid)
        if sh is not None:
            cur_r = np.where(sh.repoch[flat] == ctx.epoch, sh.reader[flat], -1)
            war = (cur_r != -1) & (cur_r != act)
            _raise_if(war, act, flat, shape, name, ctx, "overwrites what another thread read", cur_r)
            cur_w = np.where(sh.wepoch[flat] == ctx.epoch, sh.writer[flat], -1)
            waw = (cur_w >= 0) & (cur_w != act) & changed
            _raise_if(
                waw,
                act,
                flat,
                shape,
                name,
                ctx,
                "overwrites with a different value what another thread wrote",
                cur_w,
            )
            sh.writer[flat] = act
            sh.wepoch[flat] = ctx.epoch
        else:
            L = ctx.launch
            if uid not in L.writer:
                size = max(1, math.prod(shape))
                L.writer[uid] = np.full(size, -1, np.int64)
                L.wblock[uid] = np.full(size, -1, np.int64)
                L.wepoch[uid] = np.zeros(size, np.int64)
            w, wb, we = L.writer[uid][flat], L.wblock[uid][flat], L.wepoch[uid][flat]
            other_block = (w >= 0) & (wb != ctx.block) & changed
            _raise_if(
                other_block,
                act,
                flat,
                shape,
                name,
                ctx,
                "overwrites with a different value what another block wrote",
                w,
            )
            same_epoch = (w >= 0) & (w != gid) & (wb == ctx.block) & (we == ctx.epoch) & changed
            _raise_if(
                same_epoch,
                act,
                flat,
                shape,
                name,
                ctx,
                "overwrites with a different value what another thread wrote",
                w,
            )
            L.writer[uid][flat] = gid
            L.wblock[uid][flat] = ctx.block
            L.wepoch[uid][flat] = ctx.epoch
        if shape:
            arr[tuple(ix)] = v
        else:
            arr[()] = v[-1]

    return run_store


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if dtypes.is_float_numpy(a.dtype):
        return (a == b) | (np.isnan(a) & np.isnan(b))
    return a == b


def _check_same_values(flat: np.ndarray, v: np.ndarray, act: np.ndarray, ctx: _Ctx, name: str) -> None:
    if len(flat) < 2:
        return
    order = np.argsort(flat, kind="stable")
    f, vv = flat[order], v[order]
    dup = f[1:] == f[:-1]
    if dup.any():
        differ = dup & ~_same(vv[1:], vv[:-1])
        if differ.any():
            j = int(np.argmax(differ))
            raise _err(
                f"data race on {name} (flat element {int(f[j])}) in {ctx.where()}: "
                f"threads {int(act[order][j])} and "
                f"{int(act[order][j + 1])} store different values in the same statement"
            )
