"""Vector accesses for the CUDA printer: expansion of vectorized loops, and the plan that turns aligned
consecutive float32 loads/stores of straight-line code into ``float4``/``float2`` accesses.

A group of loads of one global/shared buffer whose flat indices are ``base + 0 .. base + W-1`` (same
symbolic terms, constants 0..W-1 apart) becomes one vector load when ``base`` is provably a multiple of
W (``_aligned``: every term's coefficient or atom is divisible, including ``(W*c) % C`` with ``C % W == 0``
after ``_lane_split`` moved the lane offset out of a modulo). Loads are hoisted to their first use and only
from buffers the run does not store; stores are grouped when the buffer is neither read nor stored at
indices of another form in the run, and the vector store is issued at the last member.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from compiler import dtypes
from compiler.loopir import simplify as simp
from compiler.loopir.expr import (
    Binary,
    Compare,
    Const,
    Expr,
    Load,
    Logical,
    Select,
    Var,
    children,
    const,
    free_vars,
    rebuild,
    substitute,
    walk,
)
from compiler.loopir.stmt import (
    Buffer,
    BufferStore,
    For,
    IfThenElse,
    Stmt,
    seq,
    stmt_exprs,
    walk_stmts,
)
from compiler.loopir.visitor import post_order, substitute_stmt

if TYPE_CHECKING:
    from compiler.backends.cuda.codegen import CudaPrinter

EXPAND_LIMIT = 16  # vectorized loops up to this extent are expanded into straight-line code
LANES = "xyzw"


def expand_vector_loops(s: Stmt) -> Stmt:
    """Vectorized loops (extent <= EXPAND_LIMIT) become straight-line copies; a body guarded by a
    condition linear in the lane gets a vector path (first and last lane pass) and a scalar one."""
    return post_order(s, _expand_loop)


def _expand_loop(s: Stmt) -> Stmt | None:
    if not isinstance(s, For) or s.kind != "vectorized" or s.extent > EXPAND_LIMIT:
        return None
    body = s.body

    def copy(st: Stmt, k: int) -> Stmt:
        return substitute_stmt(st, {s.var: const(k, s.var.dtype)})

    if isinstance(body, IfThenElse) and body.else_ is None and _linear_guard(body.cond, s.var):
        first, last = copy_expr(body.cond, s.var, 0), copy_expr(body.cond, s.var, s.extent - 1)
        fast = seq(*(copy(body.then, k) for k in range(s.extent)))
        slow = seq(*(copy(IfThenElse(body.cond, body.then), k) for k in range(s.extent)))
        return IfThenElse(Logical("and", first, last), fast, slow)
    return seq(*(copy(body, k) for k in range(s.extent)))


def uses_var(s: Stmt, var: Var) -> bool:
    """Whether ``var`` occurs in an expression under ``s``."""
    return any(var in free_vars(e) for x in walk_stmts(s) for e in stmt_exprs(x))


def copy_expr(e: Expr, var: Var, k: int) -> Expr:
    return substitute(e, {var: const(k, var.dtype)})


def _linear_guard(e: Expr, var: Var) -> bool:
    """A conjunction of comparisons, each linear (hence monotone) in ``var``."""
    if isinstance(e, Logical) and e.op == "and":
        return _linear_guard(e.a, var) and _linear_guard(e.b, var)  # type: ignore[arg-type]
    if isinstance(e, Compare) and e.op in ("<", "<=", ">", ">="):
        return all(
            var not in free_vars(x) or simp.linear_coeff(x, var) is not None for x in (e.a, e.b)
        ) and not any(isinstance(x, Load) for x in walk(e))
    return False


def _divisible(e: Expr, d: int) -> bool:
    """Whether ``e`` (an integer index expression) is provably a multiple of ``d``."""
    if d == 1:
        return True
    if isinstance(e, Const):
        return int(e.value) % d == 0
    if isinstance(e, Binary):
        if e.op in ("+", "-"):
            return _divisible(e.a, d) and _divisible(e.b, d)
        if e.op == "*":
            for x, y in ((e.a, e.b), (e.b, e.a)):
                if isinstance(x, Const) and int(x.value) != 0:
                    g = math.gcd(int(x.value), d)
                    if _divisible(y, d // g):
                        return True
            return _divisible(e.a, d) or _divisible(e.b, d)
        if e.op == "%" and isinstance(e.b, Const) and int(e.b.value) % d == 0:
            return _divisible(e.a, d)
    return False


def lane_split(e: Expr, ranges: dict) -> Expr:
    """``(A + r) % D -> A % D + r`` and ``(A + r) // D -> A // D`` when A is a multiple of g = gcd(D, 4)
    and 0 <= r < g: the lane offset of a vector access leaves the modulo (broadcast reads)."""
    if not dtypes.is_int(e.dtype):
        return e
    e = rebuild(e, [lane_split(c, ranges) for c in children(e)])
    if isinstance(e, Binary) and e.op in ("%", "//") and isinstance(e.b, Const) and int(e.b.value) > 0:
        dd = int(e.b.value)
        g = math.gcd(dd, 4)
        if g > 1:
            aff = simp.to_affine(e.a, ranges)
            r = aff.const % g
            if r:
                rest = simp.Affine(dict(aff.terms), aff.const - r, aff.dtype)
                base = simp.from_affine(rest)
                if _divisible(base, g):
                    if e.op == "//":
                        return simp.simplify(Binary("//", base, e.b, e.dtype), ranges)
                    return simp.simplify(Binary("%", base, e.b, e.dtype) + const(r, e.dtype), ranges)
    return simp.simplify(e, ranges) if isinstance(e, Binary) else e


class _StoreGroup:
    def __init__(self, width: int, base: str, order: list[int]) -> None:
        self.width = width
        self.base = base
        self.order = order  # statement index of lane 0, 1, ...
        self.last = max(order)
        self.temps: dict[int, str] = {}


class VectorPlan:
    """Which loads of a straight-line run become vector loads (and where), which stores vector stores."""

    def __init__(self, p: CudaPrinter, run: list[BufferStore]) -> None:
        self.loads_at: dict[int, list[tuple[str, dict]]] = {}
        self.store_of: dict[int, _StoreGroup] = {}
        stored = {st.buffer.uid for st in run}
        loaded: set[int] = set()
        cands: dict[tuple, dict[int, tuple[int, Expr]]] = {}  # (buf uid, terms key) -> const -> (stmt, flat)
        bufs: dict[int, Buffer] = {}
        for r, st in enumerate(run):
            for ld in _unconditional_loads(st):
                loaded.add(ld.buffer.uid)
                buf = ld.buffer
                if buf.scope == "local" or buf.dtype != "float32" or buf.uid in stored:
                    continue
                if any(isinstance(x, Load) for i in ld.indices for x in walk(i)):
                    continue
                key, c, flat = _split_flat(p, buf, ld.indices)
                if key is None:
                    continue
                bufs[buf.uid] = buf
                cands.setdefault((buf.uid, key), {}).setdefault(c, (r, flat))
        for (uid, _), consts in cands.items():
            for width, _, lanes in _windows(consts):
                flat0 = lanes[0][1]
                if not _aligned(flat0, width, p.ranges):
                    continue
                name = p.names.fresh("v")
                vt = f"float{width}"
                src = f"&{p.buf_name(bufs[uid])}[{p.top(flat0)}]"
                text = f"const {vt} {name} = *reinterpret_cast<const {vt}*>({src});"
                entries = {(uid, simp.key(fl)): f"{name}.{LANES[k]}" for k, (_, fl) in enumerate(lanes)}
                first = min(r for r, _ in lanes)
                self.loads_at.setdefault(first, []).append((text, entries))
        # stores
        groups: dict[tuple, dict[int, tuple[int, Expr]]] = {}
        seen: set[tuple] = set()
        dup: set[int] = set()
        for r, st in enumerate(run):
            buf = st.buffer
            if buf.scope == "local" or buf.dtype != "float32" or buf.uid in loaded:
                continue
            key, c, flat = _split_flat(p, buf, st.indices)
            if key is None:
                dup.add(buf.uid)
                continue
            ident = (buf.uid, key, c)
            if ident in seen or any(u == buf.uid and k != key for u, k, _ in seen):
                dup.add(buf.uid)  # stored twice, or at indices of another form: keep program order
            seen.add(ident)
            groups.setdefault((buf.uid, key), {})[c] = (r, flat)
        for (uid, _), consts in groups.items():
            if uid in dup:
                continue
            for width, _, lanes in _windows(consts):
                flat0 = lanes[0][1]
                if not _aligned(flat0, width, p.ranges):
                    continue
                g = _StoreGroup(width, p.top(flat0), [r for r, _ in lanes])
                for r, _ in lanes:
                    self.store_of[r] = g


def _split_flat(p: CudaPrinter, buf: Buffer, indices: tuple[Expr, ...]) -> tuple[tuple | None, int, Expr]:
    flat = lane_split(p.flat_index(buf, indices), p.ranges)
    try:
        aff = simp.to_affine(flat, p.ranges)
    except Exception:
        return None, 0, flat
    terms = tuple(sorted((k, c) for k, (_, c) in aff.terms.items()))
    return terms, aff.const, flat


def _windows(consts: dict[int, tuple[int, Expr]]) -> list[tuple[int, int, list[tuple[int, Expr]]]]:
    """Aligned runs of 4 (else 2) consecutive constant offsets."""
    out = []
    used: set[int] = set()
    for width in (4, 2):
        for c in sorted(consts):
            if c % width or any(c + k in used or c + k not in consts for k in range(width)):
                continue
            out.append((width, c, [consts[c + k] for k in range(width)]))
            used.update(c + k for k in range(width))
    return out


def _aligned(flat: Expr, width: int, ranges: dict) -> bool:
    aff = simp.to_affine(flat, ranges)
    if aff.const % width:
        return False
    for atom, c in aff.terms.values():
        g = math.gcd(abs(c), width)
        if not _divisible(atom, width // g):
            return False
    return True


def _unconditional_loads(st: BufferStore) -> list[Load]:
    """Loads every thread executing ``st`` performs (not under a select branch or a short-circuit)."""
    out: list[Load] = []

    def visit(e: Expr) -> None:
        if isinstance(e, Select):
            visit(e.cond)
            return
        if isinstance(e, Logical):
            visit(e.a)
            return
        if isinstance(e, Load):
            out.append(e)
        for c in children(e):
            visit(c)

    visit(st.value)
    for i in st.indices:
        visit(i)
    return out
