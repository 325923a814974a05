"""Expressions of the SIMT interpreter (``compiler.loopir.interp_simt``): every expression compiles to
``fn(ctx, active_threads) -> value per active thread`` (a numpy array, or a scalar when uniform).
``select``, ``&&`` and ``||`` evaluate only the taken side per thread; loads check bounds and the
shared/global race rules; ``warp_reduce_*`` runs the xor butterfly over aligned lane groups."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from compiler import dtypes
from compiler.loopir.expr import (
    Binary,
    Call,
    Cast,
    Compare,
    Const,
    Expr,
    ExtractLane,
    Load,
    Logical,
    Select,
    Var,
    lanes_of,
)
from compiler.loopir.interp import SCALAR_ONLY, InterpError

if TYPE_CHECKING:
    from compiler.loopir.interp_simt import _Ctx

WARP = 32
Fn = Callable[["_Ctx", np.ndarray], Any]


def _err(msg: str) -> Exception:
    return InterpError(msg)


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
    if lanes_of(e.dtype) > 1:
        raise _err(f"cannot interpret {e!r} of dtype {e.dtype}: " + SCALAR_ONLY)
    if isinstance(e, ExtractLane):
        raise _err(f"cannot interpret the lane extract {e!r}: " + SCALAR_ONLY)
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
        if e.name in TC_CALLS:
            f, args = TC_CALLS[e.name], [_expr(a) for a in e.args]
            return lambda ctx, act: f(*(np.asarray(a(ctx, act)) for a in args))
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
    elif name in FAST_MATH_MODELS:
        if dtype != "float32":
            raise _err(f"intrinsic '{name}' is float32 only, not {dtype}")
        table = {name: FAST_MATH_MODELS[name]}
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


_LOG2E = np.float32(1.4426950408889634)
_LN2 = np.float32(0.6931471805599453)
_TINY = np.finfo(np.float32).tiny


def _ftz(x: np.ndarray) -> np.ndarray:
    """Flush float32 subnormals to (signed) zero, as the .ftz forms of the approximate instructions do."""
    return np.where(np.abs(x) < _TINY, np.float32(0) * x, x).astype(np.float32)


def fast_exp_model(x: Any) -> np.ndarray:
    """``__expf(x)``: ``ex2.approx.ftz.f32(x * log2(e))`` with log2(e) and the product rounded to float32
    (the error that grows with |x|: up to 2|x| * 2^-24 relative); ex2.approx itself is modelled as exact
    (PTX ISA: at most 2 ulp more), subnormal inputs and results are flushed to zero."""
    with np.errstate(all="ignore"):
        p = _ftz(np.asarray(x, np.float32)) * _LOG2E
        return _ftz(np.exp2(p.astype(np.float64)).astype(np.float32))


def fast_log_model(x: Any) -> np.ndarray:
    """``__logf(x)``: ``lg2.approx.ftz.f32(x) * ln(2)`` with both steps rounded to float32."""
    with np.errstate(all="ignore"):
        lg = np.log2(_ftz(np.asarray(x, np.float32)).astype(np.float64)).astype(np.float32)
        return (lg * _LN2).astype(np.float32)


FAST_MATH_MODELS: dict[str, Callable[[Any], np.ndarray]] = {
    "fast_exp": fast_exp_model,
    "fast_log": fast_log_model,
}


def _tf32_round(x: np.ndarray) -> np.ndarray:
    from compiler.loopir.interp_simt_tc import tf32_round

    return tf32_round(x)


# index and conversion intrinsics of the tensor-core sketch: ``xor(a, b)`` (int ``^``, XOR-swizzled shared
# tiles) and ``tf32_round(x)`` (``cvt.rna.tf32.f32``)
TC_CALLS: dict[str, Callable[..., Any]] = {
    "xor": lambda a, b: np.bitwise_xor(a.astype(np.int64), b.astype(np.int64)),
    "tf32_round": _tf32_round,
}


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
