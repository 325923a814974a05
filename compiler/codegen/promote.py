"""Register promotion of local buffers.

A ``local`` buffer whose every access has a compile-time-constant flat index becomes plain variables
(``float acc_0, acc_1, ...``) or, when it is accessed by explicit vector loops, vector variables
(``kiln_f32x16 acc_0, acc_1``; a scalar access is a lane, ``acc_1[3]``). This is what keeps a GEMM
micro-kernel's accumulator tile in registers. An index is constant when it depends only on loop variables
the printer can expand (``unrolled`` loops up to 64 iterations, ``serial`` ones up to 16, vectorized loops
that fall back to scalar code) and, in vector code, on the vector lane with coefficient 1 at an offset that is
a multiple of the vector width. Loops whose variable appears in such an index are fully expanded.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from compiler import dtypes
from compiler.errors import CompileError
from compiler.loopir import simplify as simp
from compiler.loopir.expr import Const, Expr, Load, Var, const, free_vars, substitute, walk
from compiler.loopir.stmt import Allocate, Buffer, BufferStore, For, Stmt
from compiler.loopir.visitor import StmtExprVisitor, StmtVisitor

if TYPE_CHECKING:
    from compiler.codegen.cstyle import CStylePrinter

MAX_ELEMS = 1024  # larger buffers stay arrays
MAX_EXPANSION = 4096  # most copies of one statement that expansion may create
_SCALAR_TYPES = ("float32", "float64", "int32", "int64", "float16", "int8", "uint8", "bool")


@dataclass
class Promotion:
    """How a promoted buffer is held: ``width`` 1 = one scalar per element, else vectors of ``width``."""

    width: int
    names: list[str] = field(default_factory=list)


class _Reject(Exception):
    pass


@dataclass
class _Analysis:
    buf: Buffer
    loops: dict[Var, For] = field(default_factory=dict)
    vector_ok: dict[Var, bool] = field(default_factory=dict)
    stack: list[For] = field(default_factory=list)
    expand: set[Var] = field(default_factory=set)
    widths: set[int] = field(default_factory=set)


def analyze(p: CStylePrinter, alloc: Allocate) -> tuple[Promotion, set[Var]] | None:
    """Decide whether ``alloc``'s buffer can live in registers; return the plan and loops to expand."""
    buf = alloc.buffer
    if buf.scope != "local" or buf.numel > MAX_ELEMS or buf.dtype not in _SCALAR_TYPES:
        return None
    st = _Analysis(buf)
    saved = p.buf_names.get(buf)
    p.buf_names[buf] = buf.name
    try:
        _Visit(p, st).visit_stmt(alloc.body)
    except (_Reject, CompileError):
        return None
    finally:
        if saved is None:
            p.buf_names.pop(buf, None)
    widths = st.widths
    if len(widths) > 1:
        return None
    width = next(iter(widths), 1)
    if width > 1 and (buf.dtype not in ("float32", "int32") or buf.numel % width):
        return None
    return Promotion(width), st.expand


class _Visit(StmtVisitor):
    """Checks every access of the candidate buffer under the loops that enclose it."""

    def __init__(self, p: CStylePrinter, st: _Analysis) -> None:
        self.p, self.st = p, st

    def visit_expr(self, e: Expr) -> None:
        _check_exprs(self.p, [e], self.st)

    def visit_For(self, s: For) -> None:
        p, st = self.p, self.st
        if s.kind in ("parallel", "thread") and mentions(s.body, st.buf):
            raise _Reject
        with p.loop_var(s.var, s.extent):
            st.loops[s.var] = s
            if s.kind == "vectorized":
                st.vector_ok[s.var] = p.try_vector(s)
            st.stack.append(s)
            try:
                self.visit_stmt(s.body)
            finally:
                st.stack.pop()

    def visit_BufferStore(self, s: BufferStore) -> None:
        self.generic_visit_stmt(s)
        if s.buffer is self.st.buf:
            _check_access(self.p, s.indices, self.st)

    def visit_Allocate(self, s: Allocate) -> None:
        with _bound_name(self.p, s.buffer):
            self.visit_stmt(s.body)


@contextmanager
def _bound_name(p: CStylePrinter, buf: Buffer) -> Iterator[None]:
    p.buf_names[buf] = buf.name
    try:
        yield
    finally:
        p.buf_names.pop(buf, None)


class _Found(Exception):
    pass


class _Mentions(StmtExprVisitor):
    def __init__(self, buf: Buffer) -> None:
        self.buf = buf

    def visit_BufferStore(self, s: BufferStore) -> None:
        if s.buffer is self.buf:
            raise _Found
        self.generic_visit_stmt(s)

    def visit_Load(self, e: Load) -> None:
        if e.buffer is self.buf:
            raise _Found
        self.generic_visit_expr(e)


def mentions(s: Stmt, buf: Buffer) -> bool:
    """Whether any statement under ``s`` loads or stores ``buf``."""
    try:
        _Mentions(buf).visit_stmt(s)
    except _Found:
        return True
    return False


def _check_exprs(p: CStylePrinter, exprs: list[Expr], st: _Analysis) -> None:
    for ex in exprs:
        for e in walk(ex):
            if isinstance(e, Load) and e.buffer is st.buf:
                _check_access(p, e.indices, st)


def _check_access(p: CStylePrinter, indices: tuple[Expr, ...], st: _Analysis) -> None:
    flat = p.flat_index(st.buf, indices)
    inner_vec = next((f for f in reversed(st.stack) if f.kind == "vectorized"), None)
    copies = 1
    for var in free_vars(flat):
        loop = st.loops.get(var)
        if loop is None:
            raise _Reject  # depends on a variable outside the allocation
        if loop is inner_vec and st.vector_ok.get(var) and simp.linear_coeff(flat, var, p.ranges) == 1:
            base = simp.to_affine(substitute(flat, {var: const(0)}), p.ranges)
            w = loop.extent
            if base.const % w or any(
                not isinstance(a, Var) or c % w or st.loops.get(a) is None for a, c in base.terms.values()
            ):
                raise _Reject
            st.widths.add(w)
            continue
        limit = 64 if loop.kind in ("unrolled", "vectorized") else 16 if loop.kind == "serial" else 0
        if loop.extent > limit:
            raise _Reject
        st.expand.add(var)
    for f in st.stack:
        if f.var in st.expand:
            copies *= f.extent
    if copies > MAX_EXPANSION:
        raise _Reject


def declare_promoted(plan: Promotion, buf: Buffer, p: CStylePrinter, name: str) -> list[str]:
    """Declaration lines of a promoted buffer's variables (names are recorded in ``plan``)."""
    n = math.ceil(buf.numel / plan.width)
    plan.names = [p.names.fresh(f"{name}_{k}") for k in range(n)]
    ctype = dtypes.DTYPES[buf.dtype].c_type if plan.width == 1 else f"kiln_{buf.dtype[0]}32x{plan.width}"
    return [f"{ctype} {', '.join(plan.names[i : i + 8])};" for i in range(0, n, 8)]


def promoted_scalar(plan: Promotion, buf: Buffer, flat: Expr) -> str:
    """The C lvalue of one element of a promoted buffer."""
    if not isinstance(flat, Const):
        raise CompileError(f"internal: promoted buffer {buf.name} accessed with a non-constant index {flat}")
    k = int(flat.value)
    if not 0 <= k < buf.numel:
        raise CompileError(f"access to {buf.name} at flat index {k} is out of bounds (size {buf.numel})")
    if plan.width == 1:
        return plan.names[k]
    return f"{plan.names[k // plan.width]}[{k % plan.width}]"


def promoted_vector(plan: Promotion, base: Expr, width: int) -> str | None:
    """The vector variable holding lanes ``base .. base+width-1``, or None if they are not one slot."""
    if plan.width != width or not isinstance(base, Const) or int(base.value) % width:
        return None
    k = int(base.value) // width
    return plan.names[k] if 0 <= k < len(plan.names) else None
