"""A reference interpreter for lowered loop IR, with numpy scalar semantics.

Statements and expressions are compiled to Python closures once, then run on numpy arrays. Every load
and store is bounds-checked (an out-of-bounds access raises :class:`InterpError` naming the buffer and
index) and scratch buffers start poisoned (NaN, or a sentinel for integers), so a schedule that reads
uninitialized memory or writes outside a buffer is caught on a machine without the target hardware.

GPU-bound loops run in lockstep (see ``compiler.loopir.interp_simt``); CPU loop kinds (parallel,
vectorized, unrolled) run serially, which is one legal execution of each.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from compiler import dtypes
from compiler.errors import KilnError
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
from compiler.loopir.stmt import (
    Allocate,
    Barrier,
    Block,
    BufferStore,
    Evaluate,
    For,
    IfThenElse,
    LetStmt,
    PrimFunc,
    SeqStmt,
    Stmt,
)

Env = dict  # Var -> int, plus "__bufs__" -> {buffer uid: ndarray}


class InterpError(KilnError):
    """The interpreted program did something illegal (out-of-bounds access, unsupported node)."""


def _np_scalar(dtype: str) -> Callable[[Any], Any]:
    if dtype == "bool":
        return bool
    if dtypes.is_int(dtype):
        return int
    t = dtypes.to_numpy(dtype).type
    return t


def _math(name: str, dtype: str) -> Callable[..., Any]:
    t = _np_scalar(dtype)
    with np.errstate(all="ignore"):
        table: dict[str, Callable[..., Any]] = {
            "exp": lambda x: t(np.exp(t(x))),
            "exp_le0": lambda x: t(np.exp(t(x))),
            "log": lambda x: t(np.log(t(x))) if x > 0 else (t(-np.inf) if x == 0 else t(np.nan)),
            "sqrt": lambda x: t(np.sqrt(t(x))) if x >= 0 else t(np.nan),
            "rsqrt": lambda x: t(t(1) / np.sqrt(t(x))) if x > 0 else (t(np.inf) if x == 0 else t(np.nan)),
            "tanh": lambda x: t(np.tanh(t(x))),
            "erf": lambda x: t(math.erf(float(x))) if x == x else t(np.nan),
            "sigmoid": lambda x: t(t(1) / (t(1) + np.exp(-t(x)))),
            "abs": lambda x: t(abs(x)),
            "neg": lambda x: t(-x),
            "recip": lambda x: t(t(1) / t(x)) if x != 0 else t(math.copysign(np.inf, float(x))),
        }
    if name not in table:
        raise InterpError(f"the interpreter does not know intrinsic '{name}'")
    return table[name]


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


SCALAR_ONLY = (
    "the interpreters run scalar loop IR (what Backend.lower returns); vector expressions, let-bindings and "
    "lane extracts are made by code generation's passes (vectorization, CUDA vector accesses)"
)


def compile_expr(e: Expr) -> Callable[[Env], Any]:
    if lanes_of(e.dtype) > 1:
        raise InterpError(f"cannot interpret {e!r} of dtype {e.dtype}: " + SCALAR_ONLY)
    if isinstance(e, ExtractLane):
        raise InterpError(f"cannot interpret the lane extract {e!r}: " + SCALAR_ONLY)
    if isinstance(e, Const):
        v = _np_scalar(e.dtype)(e.value)
        return lambda env: v
    if isinstance(e, Var):
        return lambda env: env[e]
    if isinstance(e, Load):
        return _compile_load(e)
    if isinstance(e, Binary):
        return _compile_binary(e)
    if isinstance(e, Compare):
        a, b = compile_expr(e.a), compile_expr(e.b)
        op = {
            "==": lambda x, y: x == y,
            "!=": lambda x, y: x != y,
            "<": lambda x, y: x < y,
            "<=": lambda x, y: x <= y,
            ">": lambda x, y: x > y,
            ">=": lambda x, y: x >= y,
        }[e.op]
        return lambda env: bool(op(a(env), b(env)))
    if isinstance(e, Logical):
        a = compile_expr(e.a)
        if e.op == "not":
            return lambda env: not a(env)
        b = compile_expr(e.b)  # type: ignore[arg-type]
        if e.op == "and":
            return lambda env: bool(a(env)) and bool(b(env))
        return lambda env: bool(a(env)) or bool(b(env))
    if isinstance(e, Select):
        c, t, f = compile_expr(e.cond), compile_expr(e.t), compile_expr(e.f)
        return lambda env: t(env) if c(env) else f(env)
    if isinstance(e, Cast):
        v = compile_expr(e.value)
        conv = _np_scalar(e.dtype)
        if dtypes.is_int(e.dtype) and dtypes.is_float(e.value.dtype):
            return lambda env: math.trunc(float(v(env)))
        return lambda env: conv(v(env))
    if isinstance(e, Call):
        if e.name.startswith("warp_"):
            raise InterpError(f"intrinsic {e.name} needs the SIMT interpreter (a thread-bound loop)")
        fn = _math(e.name, e.dtype)
        args = [compile_expr(a) for a in e.args]
        return lambda env: fn(*(a(env) for a in args))
    raise InterpError(f"cannot interpret expression {type(e).__name__}")


def _compile_binary(e: Binary) -> Callable[[Env], Any]:
    a, b = compile_expr(e.a), compile_expr(e.b)
    if dtypes.is_int(e.dtype):
        ops = {
            "+": lambda x, y: x + y,
            "-": lambda x, y: x - y,
            "*": lambda x, y: x * y,
            "/": _trunc_div,
            "//": lambda x, y: x // y,
            "%": lambda x, y: x % y,
            "min": min,
            "max": max,
            "pow": lambda x, y: int(x**y),
        }
        op = ops[e.op]
        return lambda env: op(a(env), b(env))
    t = _np_scalar(e.dtype)
    with np.errstate(all="ignore"):
        fops = {
            "+": lambda x, y: t(x + y),
            "-": lambda x, y: t(x - y),
            "*": lambda x, y: t(x * y),
            "/": lambda x, y: t(np.divide(t(x), t(y))),
            "min": lambda x, y: x if x < y else y,
            "max": lambda x, y: x if x > y else y,
            "pow": lambda x, y: t(np.power(t(x), t(y))),
        }
    if e.op not in fops:
        raise InterpError(f"operator {e.op} is not defined on {e.dtype}")
    op = fops[e.op]

    def run(env: Env) -> Any:
        with np.errstate(all="ignore"):
            return op(a(env), b(env))

    return run


def _check(buf_name: str, shape: tuple[int, ...], idx: tuple[int, ...]) -> None:
    for d, (i, n) in enumerate(zip(idx, shape)):
        if not 0 <= i < n:
            raise InterpError(
                f"out-of-bounds access {buf_name}{list(idx)}: index {i} on axis {d} of size {n}"
            )


def _compile_load(e: Load) -> Callable[[Env], Any]:
    idx = [compile_expr(i) for i in e.indices]
    uid, name, shape = e.buffer.uid, e.buffer.name, e.buffer.shape

    def load(env: Env) -> Any:
        arr = env["__bufs__"][uid]
        ix = tuple(int(f(env)) for f in idx)
        _check(name, shape, ix)
        return arr[ix]

    return load


def compile_stmt(s: Stmt) -> Callable[[Env], None]:
    if isinstance(s, SeqStmt):
        parts = [compile_stmt(x) for x in s.stmts]

        def run_seq(env: Env) -> None:
            for p in parts:
                p(env)

        return run_seq
    if isinstance(s, For):
        if s.kind == "thread":
            from compiler.loopir.interp_simt import compile_thread_loop

            return compile_thread_loop(s)
        body = compile_stmt(s.body)
        var, n = s.var, s.extent

        def run_for(env: Env) -> None:
            for i in range(n):
                env[var] = i
                body(env)

        return run_for
    if isinstance(s, BufferStore):
        idx = [compile_expr(i) for i in s.indices]
        val = compile_expr(s.value)
        uid, name, shape = s.buffer.uid, s.buffer.name, s.buffer.shape

        def run_store(env: Env) -> None:
            ix = tuple(int(f(env)) for f in idx)
            _check(name, shape, ix)
            env["__bufs__"][uid][ix] = val(env)

        return run_store
    if isinstance(s, IfThenElse):
        c, t = compile_expr(s.cond), compile_stmt(s.then)
        f = compile_stmt(s.else_) if s.else_ is not None else None

        def run_if(env: Env) -> None:
            if c(env):
                t(env)
            elif f is not None:
                f(env)

        return run_if
    if isinstance(s, Allocate):
        body = compile_stmt(s.body)
        buf = s.buffer

        def run_alloc(env: Env) -> None:
            bufs = env["__bufs__"]
            saved = bufs.get(buf.uid)
            bufs[buf.uid] = poisoned(buf.shape, buf.dtype)
            body(env)
            if saved is None:
                del bufs[buf.uid]
            else:
                bufs[buf.uid] = saved

        return run_alloc
    if isinstance(s, Barrier):
        return lambda env: None
    if isinstance(s, Evaluate):
        fn = compile_expr(s.expr)
        return lambda env: (fn(env), None)[1]
    if isinstance(s, LetStmt):
        raise InterpError(f"cannot interpret the let-binding of {s.var.name}: " + SCALAR_ONLY)
    if isinstance(s, Block):
        raise InterpError(f"block {s.name} is still present: lower the function before interpreting it")
    raise InterpError(f"cannot interpret statement {type(s).__name__}")


def poisoned(shape: Sequence[int], dtype: str) -> np.ndarray:
    np_dtype = dtypes.to_numpy(dtype)
    if dtypes.is_float(dtype):
        return np.full(shape, np.nan, np_dtype)
    if dtype == "bool":
        return np.zeros(shape, np_dtype)
    return np.full(shape, np.iinfo(np_dtype).min // 2 + 7, np_dtype)


def run_func(func: PrimFunc, args: Sequence[np.ndarray]) -> None:
    """Run a lowered function on ``args`` (inputs then outputs, in parameter order); outputs in place."""
    if len(args) != len(func.params):
        raise InterpError(f"{func.name} takes {len(func.params)} buffers, got {len(args)}")
    bufs = {}
    for p, a in zip(func.params, args):
        if tuple(a.shape) != p.shape or a.dtype != dtypes.to_numpy(p.dtype):
            raise InterpError(
                f"{func.name}: buffer {p.name} must be {p.dtype}{list(p.shape)}, got {a.dtype}{list(a.shape)}"
            )
        bufs[p.uid] = a
    compile_stmt(func.body)({"__bufs__": bufs})


def evaluate(func: PrimFunc, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run a lowered function on inputs; outputs start poisoned, so unwritten elements show as NaN."""
    outs = [poisoned(b.shape, b.dtype) for b in func.outputs]
    run_func(func, [*inputs, *outs])
    return outs
