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
  performs; every lane of a group must be active.

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
from typing import Any

import numpy as np

from compiler import dtypes
from compiler.loopir.expr import (
    Binary,
    Call,
    Cast,
    Compare,
    Const,
    Expr,
    Load,
    Logical,
    Select,
    Var,
)
from compiler.loopir.stmt import (
    Allocate,
    Barrier,
    Block,
    BufferStore,
    Evaluate,
    For,
    IfThenElse,
    SeqStmt,
    Stmt,
    walk_stmts,
)

WARP = 32
Fn = Callable[["_Ctx", np.ndarray], Any]


def _err(msg: str) -> Exception:
    from compiler.loopir.interp import InterpError

    return InterpError(msg)


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


def _indices(
    fns: list[Fn], ctx: _Ctx, act: np.ndarray, name: str, shape: tuple[int, ...]
) -> list[np.ndarray]:
    k = len(act)
    ix = [_full(f(ctx, act), k).astype(np.int64) for f in fns]
    for d, (i, size) in enumerate(zip(ix, shape)):
        bad = (i < 0) | (i >= size)
        if bad.any():
            j = int(np.argmax(bad))
            where = [int(x[j]) for x in ix]
            raise _err(
                f"out-of-bounds access {name}{where} by thread {int(act[j])} of {ctx.where()}: "
                f"index {where[d]} "
                f"on axis {d} of size {size}"
            )
    return ix


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
    if a.dtype.kind == "f":
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


def _raise_if(bad, act, flat, shape, name, ctx: _Ctx, what: str, other) -> None:
    if not bad.any():
        return
    j = int(np.argmax(bad))
    where = list(np.unravel_index(int(flat[j]), shape)) if shape else []
    o = int(other[j])
    who = (
        "several threads"
        if o == -2
        else f"thread {o % ctx.n}" + (f" of block {o // ctx.n}" if o >= ctx.n else "")
    )
    raise _err(
        f"data race on {name}{[int(x) for x in where]} in {ctx.where()}: thread {int(act[j])} {what} ({who}) "
        "with no barrier in between"
    )


# ------------------------------------------------------------- expressions
def _full(v: Any, k: int) -> np.ndarray:
    a = np.asarray(v)
    if a.shape == (k,):
        return a
    return np.broadcast_to(a, (k,)).copy()


def _np_dtype(dtype: str) -> np.dtype:
    if dtypes.is_int(dtype):
        return np.dtype(np.int64)
    return dtypes.to_numpy(dtype)


def _expr(e: Expr) -> Fn:
    if isinstance(e, Const):
        v = _scalar(e)
        return lambda ctx, act: v
    if isinstance(e, Var):

        def var(ctx: _Ctx, act: np.ndarray) -> Any:
            p = ctx.pvars.get(e)
            return p[act] if p is not None else ctx.env[e]

        return var
    if isinstance(e, Load):
        return _load(e)
    if isinstance(e, Binary):
        return _binary(e)
    if isinstance(e, Compare):
        a, b = _expr(e.a), _expr(e.b)
        op = {
            "==": np.equal,
            "!=": np.not_equal,
            "<": np.less,
            "<=": np.less_equal,
            ">": np.greater,
            ">=": np.greater_equal,
        }[e.op]
        return lambda ctx, act: op(a(ctx, act), b(ctx, act))
    if isinstance(e, Logical):
        return _logical(e)
    if isinstance(e, Select):
        return _select(e)
    if isinstance(e, Cast):
        v = _expr(e.value)
        to = _np_dtype(e.dtype)
        if e.dtype == "bool":
            return lambda ctx, act: np.asarray(v(ctx, act)) != 0
        if dtypes.is_int(e.dtype) and dtypes.is_float(e.value.dtype):
            return lambda ctx, act: np.trunc(np.asarray(v(ctx, act), np.float64)).astype(to)
        return lambda ctx, act: np.asarray(v(ctx, act)).astype(to)
    if isinstance(e, Call):
        if e.name.startswith("warp_reduce_"):
            return _warp_reduce(e)
        fn = _math(e.name, e.dtype)
        args = [_expr(a) for a in e.args]
        return lambda ctx, act: fn(*(np.asarray(a(ctx, act)) for a in args))
    raise _err(f"cannot interpret expression {type(e).__name__}")


def _scalar(c: Const) -> Any:
    if c.dtype == "bool":
        return bool(c.value)
    if dtypes.is_int(c.dtype):
        return np.int64(c.value)
    return dtypes.to_numpy(c.dtype).type(c.value)


def _load(e: Load) -> Fn:
    idx = [_expr(i) for i in e.indices]
    buf = e.buffer
    uid, name, shape = buf.uid, buf.name, buf.shape

    def load(ctx: _Ctx, act: np.ndarray) -> Any:
        k = len(act)
        ix = _indices(idx, ctx, act, name, shape)
        arr = ctx.bufs[uid]
        if uid in ctx.local:
            return arr[(act, *ix)]
        if buf.scope == "local":
            raise _err(f"local buffer {name} is allocated outside the thread block that uses it")
        flat = np.ravel_multi_index(ix, shape) if shape else np.zeros(k, np.int64)
        sh = ctx.shared.get(uid)
        if sh is not None:
            w = np.where(sh.wepoch[flat] == ctx.epoch, sh.writer[flat], -1)
            _raise_if(
                (w >= 0) & (w != act), act, flat, shape, name, ctx, "reads what another thread wrote", w
            )
            cur = np.where(sh.repoch[flat] == ctx.epoch, sh.reader[flat], -1)
            new = np.where((cur == -1) | (cur == act), act, -2)
            if k > 1:
                _, inv, counts = np.unique(flat, return_inverse=True, return_counts=True)
                new = np.where(counts[inv] > 1, -2, new)
            sh.reader[flat] = new
            sh.repoch[flat] = ctx.epoch
        else:
            L = ctx.launch
            wr = L.writer.get(uid)
            if wr is not None:
                w, wb, we = wr[flat], L.wblock[uid][flat], L.wepoch[uid][flat]
                gid = act + ctx.block * ctx.n
                cross = (w >= 0) & (wb != ctx.block)
                _raise_if(
                    cross, act, flat, shape, name, ctx, "reads what another block wrote in this launch", w
                )
                race = (w >= 0) & (w != gid) & (we == ctx.epoch)
                _raise_if(race, act, flat, shape, name, ctx, "reads what another thread wrote", w)
        return arr[tuple(ix)] if shape else np.full(k, arr[()])

    return load


def _binary(e: Binary) -> Fn:
    a, b = _expr(e.a), _expr(e.b)
    if dtypes.is_int(e.dtype):
        ops: dict[str, Callable[[Any, Any], Any]] = {
            "+": np.add,
            "-": np.subtract,
            "*": np.multiply,
            "/": _trunc_div,
            "//": np.floor_divide,
            "%": np.mod,
            "min": np.minimum,
            "max": np.maximum,
            "pow": lambda x, y: np.power(np.asarray(x, np.int64), np.asarray(y, np.int64)),
        }
        op = ops[e.op]

        def run_int(ctx: _Ctx, act: np.ndarray) -> Any:
            with np.errstate(all="ignore"):
                return op(np.asarray(a(ctx, act), np.int64), np.asarray(b(ctx, act), np.int64))

        return run_int
    t = _np_dtype(e.dtype)
    fops: dict[str, Callable[[Any, Any], Any]] = {
        "+": np.add,
        "-": np.subtract,
        "*": np.multiply,
        "/": np.divide,
        "min": lambda x, y: np.where(x < y, x, y),
        "max": lambda x, y: np.where(x > y, x, y),
        "pow": np.power,
    }
    if e.op not in fops:
        raise _err(f"operator {e.op} is not defined on {e.dtype}")
    fop = fops[e.op]

    def run(ctx: _Ctx, act: np.ndarray) -> Any:
        with np.errstate(all="ignore"):
            return np.asarray(fop(np.asarray(a(ctx, act), t), np.asarray(b(ctx, act), t)), t)

    return run


def _trunc_div(x: Any, y: Any) -> Any:
    q = np.abs(x) // np.abs(y)
    return np.where((np.asarray(x) >= 0) == (np.asarray(y) >= 0), q, -q)


def _logical(e: Logical) -> Fn:
    a = _expr(e.a)
    if e.op == "not":
        return lambda ctx, act: ~np.asarray(a(ctx, act), bool)
    b = _expr(e.b)  # type: ignore[arg-type]
    is_and = e.op == "and"

    def run(ctx: _Ctx, act: np.ndarray) -> Any:
        k = len(act)
        out = _full(a(ctx, act), k).astype(bool)
        todo = out if is_and else ~out  # only these threads evaluate the right side
        if todo.any():
            out[todo] = _full(b(ctx, act[todo]), int(todo.sum())).astype(bool)
        return out

    return run


def _select(e: Select) -> Fn:
    c, t, f = _expr(e.cond), _expr(e.t), _expr(e.f)
    dt = _np_dtype(e.dtype) if e.dtype != "bool" else np.dtype(bool)

    def run(ctx: _Ctx, act: np.ndarray) -> Any:
        k = len(act)
        m = _full(c(ctx, act), k).astype(bool)
        out = np.empty(k, dt)
        if m.any():
            out[m] = _full(t(ctx, act[m]), int(m.sum()))
        if not m.all():
            out[~m] = _full(f(ctx, act[~m]), int((~m).sum()))
        return out

    return run


def _math(name: str, dtype: str) -> Callable[..., Any]:
    t = _np_dtype(dtype).type

    def erf(x: np.ndarray) -> np.ndarray:
        flat = np.asarray(x, np.float64).reshape(-1)
        out = np.array([math.erf(v) if v == v else math.nan for v in flat], np.float64)
        return out.reshape(np.shape(x)).astype(t)

    def guarded(f: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def g(x: Any) -> Any:
            with np.errstate(all="ignore"):
                return np.asarray(f(np.asarray(x, t)), t)

        return g

    if dtypes.is_int(dtype):
        table = {"abs": np.abs, "neg": np.negative}
    else:
        table = {
            "exp": guarded(np.exp),
            "log": guarded(np.log),
            "sqrt": guarded(np.sqrt),
            "rsqrt": guarded(lambda x: t(1) / np.sqrt(x)),
            "tanh": guarded(np.tanh),
            "erf": erf,
            "sigmoid": guarded(lambda x: t(1) / (t(1) + np.exp(-x))),
            "abs": guarded(np.abs),
            "neg": guarded(np.negative),
            "recip": guarded(lambda x: t(1) / x),
        }
    if name not in table:
        raise _err(f"the interpreter does not know intrinsic '{name}' on {dtype}")
    return table[name]


_WARP_OPS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "sum": np.add,
    "max": np.fmax,  # CUDA's fmaxf/fminf: a NaN operand yields the other one
    "min": np.fmin,
}


def _warp_reduce(e: Call) -> Fn:
    comb = e.name[len("warp_reduce_") :]
    if comb not in _WARP_OPS or len(e.args) != 2 or not isinstance(e.args[1], Const):
        raise _err(f"bad warp intrinsic {e.name}: expected warp_reduce_sum/max/min(value, constant width)")
    width = int(e.args[1].value)
    if width < 1 or width > WARP or width & (width - 1):
        raise _err(f"{e.name}: width {width} must be a power of two up to {WARP}")
    value, op = _expr(e.args[0]), _WARP_OPS[comb]
    if dtypes.is_int(e.dtype) and comb != "sum":
        op = np.maximum if comb == "max" else np.minimum
    dt = _np_dtype(e.dtype)

    def run(ctx: _Ctx, act: np.ndarray) -> Any:
        k = len(act)
        v = _full(value(ctx, act), k).astype(dt)
        groups, counts = np.unique(act // width, return_counts=True)
        if (counts != width).any():
            g = int(groups[np.argmax(counts != width)])
            raise _err(
                f"{e.name}(.., {width}) in {ctx.where()}: "
                f"lanes {g * width}..{g * width + width - 1} are not all "
                "active (a warp shuffle needs every lane of its group)"
            )
        size = -(-ctx.n // WARP) * WARP
        full = np.zeros(size, dt)
        full[act] = v
        ids = np.arange(size)
        off = width // 2
        with np.errstate(all="ignore"):
            while off:
                full = op(full, full[ids ^ off]).astype(dt)
                off //= 2
        return full[act]

    return run
