"""Explicit SIMD for ``vectorized`` loops with GCC vector extensions (C target).

A vectorized loop ``For(v, W)`` (W in 4, 8, 16; wider loops are first split into an unrolled loop of
W-lane chunks) whose body is a sequence of stores is printed as vector statements. For every load and store
the coefficient of ``v`` in the flat index decides the access: 1 -> a contiguous (unaligned-safe) vector
load/store, 0 -> a scalar broadcast, anything else -> a gather built lane by lane. A body guarded by
``if (cond)`` with ``cond`` a conjunction of comparisons linear in ``v`` (a split tail) becomes
``if (all lanes pass) vector code else scalar loop``.

Anything else falls back to a scalar loop with ``#pragma GCC ivdep`` (always correct): non-contiguous or
loop-invariant stores, loads in a Select branch that may be out of bounds (both sides of a vector select are
evaluated), integer division in a Select branch, dtypes other than float32/int32, nested control flow,
Evaluate statements, and a load of a stored buffer at another index (a cross-lane dependence).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from compiler.codegen.cstyle import _balanced
from compiler.codegen.promote import promoted_vector
from compiler.errors import CompileError
from compiler.loopir import simplify as simp
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
    const,
    free_vars,
    substitute,
    walk,
)
from compiler.loopir.stmt import BufferStore, For, IfThenElse, SeqStmt, Stmt
from compiler.loopir.visitor import post_order, substitute_stmt

if TYPE_CHECKING:
    from compiler.backends.cpu.codegen import CPrinter

WIDTHS = (16, 8, 4)
_VT = {"float32": "f32", "int32": "i32"}


class NoVector(Exception):
    """Raised while printing vector code for a loop that must fall back to scalar code."""


# ------------------------------------------------------------------ splitting
def split_vector_loops(s: Stmt, max_lanes: int) -> Stmt:
    """Rewrite vectorized loops wider than ``max_lanes`` into unrolled chunks of a supported width."""

    def split(x: Stmt) -> Stmt | None:
        if not (isinstance(x, For) and x.kind == "vectorized"):
            return None
        width = next((w for w in WIDTHS if w <= max_lanes and x.extent % w == 0), None)
        if width is None or width == x.extent:
            return None
        outer, inner = Var(f"{x.var.name}_o"), Var(f"{x.var.name}_i")
        body = substitute_stmt(x.body, {x.var: outer * width + inner})
        return For(outer, x.extent // width, For(inner, width, body, "vectorized"), "unrolled")

    return post_order(s, split)


# ------------------------------------------------------------------- printing
def emit_vector_loop(p: CPrinter, s: For) -> None:
    """Print ``s`` as vector code, a guarded vector/scalar pair, or a scalar fallback loop."""
    body = s.body
    guard = _guard(p, s, body) if isinstance(body, IfThenElse) else None
    lines = _try_lines(p, s, body.then if guard is not None else body)  # type: ignore[union-attr]
    if lines is None:
        p.emit_scalar_fallback(s)
        return
    if guard is not None:
        with p.block(f"if ({guard})"):
            p.lines.extend(p.indent_unit * p.depth + x for x in lines)
        with p.block("else"):
            p.emit_scalar_fallback(s)
        return
    p.lines.extend(p.indent_unit * p.depth + x for x in lines)


def try_vector(p: CPrinter, s: For) -> bool:
    body = s.body
    if isinstance(body, IfThenElse):
        if _guard(p, s, body) is None:
            return False
        body = body.then
    return _try_lines(p, s, body) is not None


def _guard(p: CPrinter, s: For, body: IfThenElse) -> str | None:
    """``cond`` at the first and last lane when it holds for all lanes iff it holds at both ends."""
    if body.else_ is not None or not _interval_cond(body.cond):
        return None
    v = s.var
    ends = [p.simplified(substitute(body.cond, {v: const(k, v.dtype)})) for k in (0, s.extent - 1)]
    try:
        text = [p.expr(e) for e in ends]
    except CompileError:
        return None
    return f"{text[0]} && {text[1]}"


def _interval_cond(e: Expr) -> bool:
    if isinstance(e, Logical) and e.op == "and":
        return e.b is not None and _interval_cond(e.a) and _interval_cond(e.b)
    if isinstance(e, Compare) and e.op in ("<", "<=", ">", ">="):
        return not any(isinstance(x, Load) for x in walk(e))
    return False


def _try_lines(p: CPrinter, s: For, body: Stmt) -> list[str] | None:
    if s.extent not in WIDTHS:
        return None
    stores = body.stmts if isinstance(body, SeqStmt) else [body]
    if not all(isinstance(x, BufferStore) for x in stores):
        return None
    saved = p.lines
    p.lines = []
    try:
        with p.loop_var(s.var, s.extent):
            _VectorBody(p, s.var, s.extent).emit(stores)  # type: ignore[arg-type]
        return [x.strip() for x in p.lines]
    except NoVector:
        return None
    finally:
        p.lines = saved


def _strip(text: str) -> str:
    if text.startswith("(") and text.endswith(")") and _balanced(text[1:-1]):
        return text[1:-1]
    return text


class _VectorBody:
    def __init__(self, p: CPrinter, v: Var, width: int) -> None:
        self.p, self.v, self.w = p, v, width

    def vt(self, dtype: str) -> str:
        if dtype not in _VT:
            raise NoVector(f"no vectors of {dtype}")
        return f"{_VT[dtype]}x{self.w}"

    def varying(self, e: Expr) -> bool:
        return self.v in free_vars(e)

    def emit(self, stores: list[BufferStore]) -> None:
        p = self.p
        p.prelude.use_width(self.w)
        stored: dict[object, set[tuple]] = {}
        for st in stores:
            stored.setdefault(st.buffer, set()).add(simp.key(p.flat_index(st.buffer, st.indices)))
        for st in stores:
            for e in walk(st.value):
                if (
                    isinstance(e, Load)
                    and e.buffer in stored
                    and simp.key(p.flat_index(e.buffer, e.indices)) not in stored[e.buffer]
                ):
                    raise NoVector("cross-lane dependence")
        for st in stores:
            self.store(st)

    def store(self, st: BufferStore) -> None:
        p, buf = self.p, st.buffer
        vt = self.vt(buf.dtype)
        flat = p.flat_index(buf, st.indices)
        if simp.linear_coeff(flat, self.v, p.ranges) != 1:
            raise NoVector("store is not contiguous")
        value = self.vec(st.value, buf.dtype)
        base = p.simplified(substitute(flat, {self.v: const(0)}))
        plan = p.promoted.get(buf)
        if plan is not None:
            slot = promoted_vector(plan, base, self.w)
            if slot is None:
                raise NoVector("promoted buffer slot mismatch")
            p.line(f"{slot} = {_strip(value)};")
        else:
            p.line(f"kiln_store_{vt}(&{p.buf_name(buf)}[{p.top(base)}], {value});")

    def vec(self, e: Expr, dtype: str) -> str:
        """``e`` as a vector of ``dtype`` (scalars are broadcast)."""
        code, kind = self.x(e)
        if kind == "m":
            raise NoVector("mask where a value is needed")
        if kind == "s":
            return f"kiln_splat_{self.vt(dtype)}({self.p.top(e)})"
        return code

    def mask(self, e: Expr) -> str:
        code, kind = self.x(e)
        if kind == "m":
            return code
        if kind == "s":
            return f"kiln_splat_i32x{self.w}(-(int32_t){code})"
        raise NoVector("value where a mask is needed")

    def x(self, e: Expr) -> tuple[str, str]:
        """(code, kind): kind 's' scalar, 'v' vector, 'm' lane mask (int32 lanes of 0 / -1)."""
        p = self.p
        if not self.varying(e):
            return p.expr(e), "s"
        if isinstance(e, Var):
            return f"kiln_iota_i32x{self.w}()", "v"
        if isinstance(e, Load):
            return self.load(e), "v"
        if isinstance(e, Binary):
            return self.binary(e), "v"
        if isinstance(e, Compare):
            if e.a.dtype not in _VT:
                raise NoVector("compare dtype")
            a, ka = self.x(e.a)
            b, kb = self.x(e.b)
            if "m" in (ka, kb):
                raise NoVector("compare of masks")
            return f"({a} {e.op} {b})", "m"
        if isinstance(e, Logical):
            if e.op == "not":
                return f"(~{self.mask(e.a)})", "m"
            assert e.b is not None
            return f"({self.mask(e.a)} {'&' if e.op == 'and' else '|'} {self.mask(e.b)})", "m"
        if isinstance(e, Select):
            return self.select(e), "v"
        if isinstance(e, Cast):
            return self.cast(e)
        if isinstance(e, Call):
            return self.call(e), "v"
        raise NoVector(type(e).__name__)

    def load(self, e: Load) -> str:
        p, buf = self.p, e.buffer
        vt = self.vt(buf.dtype)
        flat = p.flat_index(buf, e.indices)
        coeff = simp.linear_coeff(flat, self.v, p.ranges)
        plan = p.promoted.get(buf)
        if coeff == 1:
            base = p.simplified(substitute(flat, {self.v: const(0)}))
            if plan is not None:
                slot = promoted_vector(plan, base, self.w)
                if slot is None:
                    raise NoVector("promoted buffer slot mismatch")
                return slot
            return f"kiln_load_{vt}(&{p.buf_name(buf)}[{p.top(base)}])"
        lanes = []
        for k in range(self.w):
            with p.bound_const(self.v, k):
                lanes.append(p.access(buf, e.indices))
        return f"(kiln_{vt}){{{', '.join(lanes)}}}"

    def binary(self, e: Binary) -> str:
        vt = self.vt(e.dtype)
        a, b = self.x(e.a), self.x(e.b)
        if "m" in (a[1], b[1]):
            raise NoVector("arithmetic on masks")
        if e.op in ("+", "-", "*", "/"):
            return f"({a[0]} {e.op} {b[0]})"
        if e.op in ("//", "%") and e.dtype == "int32" and self.p.nonneg(e.a) and self.p.nonneg(e.b):
            return f"({a[0]} {'/' if e.op == '//' else '%'} {b[0]})"
        if e.op in ("min", "max") or (e.op == "pow" and e.dtype == "float32"):
            return f"kiln_{e.op}_{vt}({self.vec(e.a, e.dtype)}, {self.vec(e.b, e.dtype)})"
        raise NoVector(f"vector {e.op} on {e.dtype}")

    def select(self, e: Select) -> str:
        p = self.p
        vt = self.vt(e.dtype)
        for branch in (e.t, e.f):
            for x in walk(branch):
                if isinstance(x, Load) and not self._in_bounds(x):
                    raise NoVector("a load in a select branch may be out of bounds")
                int_div = (
                    isinstance(x, Binary) and x.op in ("/", "//", "%") and not x.dtype.startswith("float")
                )
                if int_div and not (isinstance(x.b, Const) and x.b.value != 0):  # type: ignore[union-attr]
                    raise NoVector("integer division in a select branch")
        t, f = self.vec(e.t, e.dtype), self.vec(e.f, e.dtype)
        if self.x(e.cond)[1] == "s":
            return f"({p.top(e.cond)} ? {t} : {f})"
        return f"kiln_sel_{vt}({self.mask(e.cond)}, {t}, {f})"

    def _in_bounds(self, x: Load) -> bool:
        r = simp.bound(self.p.flat_index(x.buffer, x.indices), self.p.ranges)
        return r is not None and r[0] >= 0 and r[1] < x.buffer.numel

    def cast(self, e: Cast) -> tuple[str, str]:
        src = e.value.dtype
        if src == "bool":
            m = self.mask(e.value)
            if e.dtype == "float32":
                one, zero = f"kiln_splat_f32x{self.w}(1.0f)", f"kiln_splat_f32x{self.w}(0.0f)"
                return f"kiln_sel_f32x{self.w}({m}, {one}, {zero})", "v"
            if e.dtype == "int32":
                return f"({m} & 1)", "v"
            raise NoVector("cast of a mask")
        if e.dtype == "bool":
            zero = "0.0f" if src == "float32" else "0"
            return f"({self.vec(e.value, src)} != {zero})", "m"
        self.vt(src)
        return f"__builtin_convertvector({self.vec(e.value, src)}, kiln_{self.vt(e.dtype)})", "v"

    def call(self, e: Call) -> str:
        vt = self.vt(e.dtype)
        a = self.vec(e.args[0], e.dtype) if e.args else ""
        if e.dtype == "float32":
            if e.name in ("exp", "log", "tanh", "erf", "sigmoid"):
                return f"{self.p.prelude.use_math(e.name, self.w)}({a})"
            simple = {
                "sqrt": f"kiln_sqrt_{vt}({a})",
                "rsqrt": f"(1.0f / kiln_sqrt_{vt}({a}))",
                "abs": f"kiln_abs_{vt}({a})",
                "neg": f"(-{a})",
                "recip": f"(1.0f / {a})",
            }
        else:
            simple = {"abs": f"kiln_abs_{vt}({a})", "neg": f"(-{a})"}
        if e.name not in simple:
            raise NoVector(f"vector {e.name}")
        return simple[e.name]
