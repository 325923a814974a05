"""Readable text of loop IR, in the style of CINN's AST dumps:

serial for (i, 0, 64)
{
  ScheduleBlock(max)
  {
    i0 = axis.bind(i)
    max[i0] = max(max[i0], x[i0, k])
  }
}
"""

from __future__ import annotations

import math

from compiler.loopir.expr import (
    Binary,
    Broadcast,
    Call,
    Cast,
    Compare,
    Const,
    Expr,
    ExtractLane,
    Load,
    Logical,
    MakeVector,
    Ramp,
    Reduce,
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
    Intrinsic,
    LetStmt,
    PrimFunc,
    SeqStmt,
    Stmt,
)

_INFIX = {"+", "-", "*", "/", "//", "%"}


def _const_str(c: Const) -> str:
    v = c.value
    if c.dtype == "bool":
        return "true" if v else "false"
    if isinstance(v, float):
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        text = repr(v)
        return text + ("f" if c.dtype == "float32" else "")
    return str(v)


def expr_str(e: Expr) -> str:
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Const):
        return _const_str(e)
    if isinstance(e, Binary):
        if e.op in _INFIX:
            return f"({expr_str(e.a)} {e.op} {expr_str(e.b)})"
        return f"{e.op}({expr_str(e.a)}, {expr_str(e.b)})"
    if isinstance(e, Compare):
        return f"({expr_str(e.a)} {e.op} {expr_str(e.b)})"
    if isinstance(e, Logical):
        if e.b is None:
            return f"!{expr_str(e.a)}"
        return f"({expr_str(e.a)} {'&&' if e.op == 'and' else '||'} {expr_str(e.b)})"
    if isinstance(e, Select):
        return f"select({expr_str(e.cond)}, {expr_str(e.t)}, {expr_str(e.f)})"
    if isinstance(e, Cast):
        return f"{e.dtype}({expr_str(e.value)})"
    if isinstance(e, Call):
        return f"{e.name}({', '.join(expr_str(a) for a in e.args)})"
    if isinstance(e, Load):
        idx = ", ".join(expr_str(i) for i in e.indices)
        return f"{e.buffer.name}[{idx}]" if e.lanes == 1 else f"{e.buffer.name}[{idx} : +{e.lanes}]"
    if isinstance(e, Ramp):
        return f"ramp({expr_str(e.base)}, {expr_str(e.stride)}, {e.lanes})"
    if isinstance(e, Broadcast):
        return f"broadcast({expr_str(e.value)}, {e.lanes})"
    if isinstance(e, MakeVector):
        return f"vector({', '.join(expr_str(x) for x in e.elems)})"
    if isinstance(e, ExtractLane):
        return f"lane({expr_str(e.value)}, {e.lane})"
    if isinstance(e, Reduce):
        axes = ", ".join(f"{iv.var.name}:{iv.extent}" for iv in e.axis)
        return f"reduce_{e.combiner}({expr_str(e.source)}, axis=[{axes}])"
    return f"<{type(e).__name__}>"


def _loop_head(s: For) -> str:
    if s.kind == "thread":
        kind = f"thread_bind[{s.thread}]"
    else:
        kind = s.kind
    return f"{kind} for ({s.var.name}, 0, {s.extent})"


def _lines(s: Stmt, depth: int, out: list[str]) -> None:
    pad = "  " * depth
    if isinstance(s, SeqStmt):
        for x in s.stmts:
            _lines(x, depth, out)
    elif isinstance(s, For):
        out.append(pad + _loop_head(s))
        out.append(pad + "{")
        _lines(s.body, depth + 1, out)
        out.append(pad + "}")
    elif isinstance(s, Block):
        out.append(f"{pad}ScheduleBlock({s.name})")
        out.append(pad + "{")
        inner = pad + "  "
        for b in s.alloc_buffers:
            out.append(f"{inner}alloc {b.name}[{', '.join(map(str, b.shape))}] : {b.dtype} ({b.scope})")
        if s.iter_vars:
            names = ", ".join(iv.var.name for iv in s.iter_vars)
            kinds = "".join(iv.kind for iv in s.iter_vars)
            out.append(
                f"{inner}{names} = axis.bind({', '.join(expr_str(b) for b in s.bindings)})  // {kinds}"
            )
        if s.predicate is not None:
            out.append(f"{inner}where {expr_str(s.predicate)}")
        if s.init is not None:
            out.append(f"{inner}init:")
            _lines(s.init, depth + 2, out)
        _lines(s.body, depth + 1, out)
        out.append(pad + "}")
    elif isinstance(s, BufferStore):
        idx = ", ".join(expr_str(i) for i in s.indices)
        lanes = lanes_of(s.value.dtype)
        span = f" : +{lanes}" if lanes > 1 else ""
        out.append(f"{pad}{s.buffer.name}[{idx}{span}] = {expr_str(s.value)}")
    elif isinstance(s, IfThenElse):
        out.append(f"{pad}if ({expr_str(s.cond)})")
        out.append(pad + "{")
        _lines(s.then, depth + 1, out)
        out.append(pad + "}")
        if s.else_ is not None:
            out.append(pad + "else")
            out.append(pad + "{")
            _lines(s.else_, depth + 1, out)
            out.append(pad + "}")
    elif isinstance(s, Allocate):
        b = s.buffer
        notes = "".join(f" {k}={v}" for k, v in s.annotations.items())
        out.append(f"{pad}alloc {b.name}[{', '.join(map(str, b.shape))}] : {b.dtype} ({b.scope}){notes}")
        _lines(s.body, depth, out)
    elif isinstance(s, LetStmt):
        out.append(f"{pad}let {s.var.name}: {s.var.dtype} = {expr_str(s.value)}")
        _lines(s.body, depth, out)
    elif isinstance(s, Evaluate):
        out.append(pad + expr_str(s.expr))
    elif isinstance(s, Intrinsic):
        ops = ", ".join(f"{b.name}+{expr_str(o)}" for b, o in zip(s.buffers, s.offsets))
        args = "".join(f", {expr_str(a)}" for a in s.args)
        out.append(f"{pad}{s.name}({ops}{args})")
    elif isinstance(s, Barrier):
        out.append(pad + "__syncthreads()")
    else:
        out.append(pad + f"<{type(s).__name__}>")


def stmt_str(s: Stmt, depth: int = 0) -> str:
    out: list[str] = []
    _lines(s, depth, out)
    return "\n".join(out)


def func_str(f: PrimFunc) -> str:
    params = ", ".join(f"{b.name}: {b.dtype}[{','.join(map(str, b.shape))}]" for b in f.params)
    return f"// function {f.name} ({params})\n{{\n{stmt_str(f.body, 1)}\n}}"
