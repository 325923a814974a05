"""The width of a kernel's index arithmetic: 32-bit unless some index can leave the int32 range.

Loop variables and index expressions are ``int32`` in the loop IR (``expr.INDEX``) and print as
``int32_t`` by default. :func:`index_overflow` looks at a lowered kernel once, before printing, and names
the first thing that needs more: a buffer (parameter or allocation) of more than 2^31 - 1 elements (its
flat offsets do not fit), a loop extent over 2^31 - 1, or an integer sub-expression of an access's flat
index (raw ``sum(index * stride)`` or simplified, as the printer writes it), of a stored value, a
condition or a let, whose bounds under the enclosing loops' ranges leave the int32 range (an
intermediate product that overflows even when the final offset is small). :func:`mark_index_width`
records the decision as ``attrs["index_dtype"] = "int64"`` (nothing is recorded for a 32-bit kernel, so
its text is unchanged); the C-style printer then declares loop and thread variables ``int64_t`` and uses
the 64-bit integer helpers, so every index computation involving a loop variable is done in 64 bits.

Cost: the check runs twice per kernel on every tuning candidate (:func:`compiler.backends.cpu.codegen.
prepare`), so each expression is bounded in one bottom-up pass (:func:`_overflows`: every node's bounds
from its children's, the same interval rules as :func:`compiler.loopir.simplify.bound`) instead of bounding
every sub-expression from scratch (quadratic in the depth of an index); only an expression that overflows
is walked again, top-down, to name the sub-expression in the message.
"""

from __future__ import annotations

from compiler import dtypes
from compiler.loopir import simplify as simp
from compiler.loopir.expr import Binary, Cast, Const, Expr, Load, Select, Var, children, lanes_of, walk
from compiler.loopir.stmt import (
    Allocate,
    Block,
    Buffer,
    BufferStore,
    For,
    LetStmt,
    PrimFunc,
    Stmt,
    stmt_children,
    stmt_exprs,
)

INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
INDEX_DTYPE_ATTR = "index_dtype"


def index_overflow(func: PrimFunc) -> str | None:
    """Why ``func`` needs 64-bit index arithmetic (one line naming the kernel and what is too large), or
    None when every index fits in int32."""
    for b in func.params:
        if b.numel > INT32_MAX:
            return f"kernel '{func.name}': buffer '{b.name}' has {b.numel} elements (over 2^31 - 1)"
    return _Scan(func.name).stmt(func.body, {})


def index_dtype(func: PrimFunc) -> str:
    """``"int64"`` when some index of ``func`` can exceed the int32 range, else ``"int32"``."""
    return "int64" if index_overflow(func) is not None else "int32"


def mark_index_width(func: PrimFunc, wide: bool | None = None) -> PrimFunc:
    """``func`` with ``attrs["index_dtype"] = "int64"`` when it needs 64-bit indices (``wide``, or
    :func:`index_overflow` when ``wide`` is None); ``func`` itself, untouched, when 32 bits suffice or the
    attribute is already there."""
    if wide is None:
        wide = index_overflow(func) is not None
    if not wide or func.attrs.get(INDEX_DTYPE_ATTR) == "int64":
        return func
    attrs = {**func.attrs, INDEX_DTYPE_ATTR: "int64"}
    return PrimFunc(func.name, func.params, func.body, func.num_inputs, attrs)


def is_wide(func: PrimFunc | None) -> bool:
    """Whether ``func`` was marked for 64-bit index arithmetic."""
    return func is not None and func.attrs.get(INDEX_DTYPE_ATTR) == "int64"


def _is_int(dtype: str) -> bool:
    """A scalar integer type (vector expressions are bounded through their scalar parts)."""
    return lanes_of(dtype) == 1 and dtypes.is_int(dtype)


def _fits(r: tuple[int, int] | None) -> bool:
    return r is None or (r[0] >= INT32_MIN and r[1] <= INT32_MAX)


class _Scan:
    def __init__(self, name: str) -> None:
        self.name = name

    def stmt(self, s: Stmt, ranges: dict[Var, tuple[int, int]]) -> str | None:
        if isinstance(s, For):
            if s.extent > INT32_MAX:
                return f"kernel '{self.name}': loop '{s.var.name}' has {s.extent} iterations (over 2^31 - 1)"
            ranges = {**ranges, s.var: (0, max(s.extent - 1, 0))}
        elif isinstance(s, Allocate) and s.buffer.numel > INT32_MAX:
            n = s.buffer.numel
            return f"kernel '{self.name}': buffer '{s.buffer.name}' has {n} elements (over 2^31 - 1)"
        elif isinstance(s, Block):
            return None  # not lowered: the printer refuses it
        if isinstance(s, BufferStore):
            why = self.access(s.buffer, s.indices, ranges)
            if why:
                return why
        for e in stmt_exprs(s):
            why = self.expr(e, ranges)
            if why:
                return why
        if isinstance(s, LetStmt) and _is_int(s.var.dtype):
            r = simp.bound(s.value, ranges)
            if r is not None:
                ranges = {**ranges, s.var: r}
        for kid in stmt_children(s):
            why = self.stmt(kid, ranges)
            if why:
                return why
        return None

    def expr(self, e: Expr, ranges: dict[Var, tuple[int, int]]) -> str | None:
        loads: list[Load] = []
        if not _overflows(e, ranges, loads):
            for load in loads:
                why = self.access(load.buffer, load.indices, ranges)
                if why:
                    return why
            return None
        for x in walk(e):  # something overflows: the first access or sub-expression, top-down, names it
            if isinstance(x, Load):
                why = self.access(x.buffer, x.indices, ranges)
                if why:
                    return why
            elif _is_int(x.dtype) and not _fits(simp.bound(x, ranges)):
                return f"kernel '{self.name}': the index expression {x} can reach {simp.bound(x, ranges)}"
        return None

    def access(
        self, buf: Buffer, indices: tuple[Expr, ...], ranges: dict[Var, tuple[int, int]]
    ) -> str | None:
        if buf.numel > INT32_MAX:
            return f"kernel '{self.name}': buffer '{buf.name}' has {buf.numel} elements (over 2^31 - 1)"
        if len(indices) != len(buf.shape):
            return None  # the printer reports the rank mismatch
        raw = simp.flat_expr(buf, indices)
        for flat in (raw, simp.simplify(raw, ranges)):
            if not _overflows(flat, ranges, None):
                continue
            for x in walk(flat):
                if isinstance(x, Load):
                    continue  # a gather's ids: checked as their own access
                if _is_int(x.dtype) and not _fits(simp.bound(x, ranges)):
                    return (
                        f"kernel '{self.name}': an index of buffer '{buf.name}' ({x}) can reach "
                        f"{simp.bound(x, ranges)}"
                    )
        return None


def _overflows(e: Expr, ranges: dict[Var, tuple[int, int]], loads: list[Load] | None) -> bool:
    """Whether some scalar integer sub-expression of ``e`` (any node :func:`walk` yields) has bounds that
    leave the int32 range; each node is bounded once, from its children's bounds. ``loads``: the loads met
    are appended to it (their own accesses are checked by the caller); None: loads are not collected."""
    return _bound_and_check(e, ranges, loads)[1]


def _bound_and_check(
    e: Expr, ranges: dict[Var, tuple[int, int]], loads: list[Load] | None
) -> tuple[tuple[int, int] | None, bool]:
    """``e``'s bounds (what ``simplify.bound`` gives) and whether some sub-expression overflows
    (:func:`_overflows`), in one bottom-up pass."""
    bad = False

    def visit(x: Expr) -> tuple[int, int] | None:
        # the interval rules of simplify.bound, applied bottom-up: bounds of x from its children's
        nonlocal bad
        if isinstance(x, Const):
            r = (int(x.value), int(x.value)) if _is_int(x.dtype) or x.dtype == "bool" else None
        elif isinstance(x, Var):
            r = ranges.get(x)
        elif isinstance(x, Binary):
            a, b = visit(x.a), visit(x.b)
            r = None if a is None or b is None else simp.interval(x.op, a, b)
        elif isinstance(x, Select):
            visit(x.cond)
            t, f = visit(x.t), visit(x.f)
            r = None if t is None or f is None else (min(t[0], f[0]), max(t[1], f[1]))
        elif isinstance(x, Cast):
            v = visit(x.value)
            r = v if _is_int(x.dtype) and _is_int(x.value.dtype) else None
        else:
            if loads is not None and isinstance(x, Load):
                loads.append(x)
            for kid in children(x):
                visit(kid)
            return None  # what simplify.bound does not bound (loads, calls, comparisons, vectors)
        if r is not None and (r[0] < INT32_MIN or r[1] > INT32_MAX) and _is_int(x.dtype):
            bad = True
        return r

    r = visit(e)
    return r, bad
