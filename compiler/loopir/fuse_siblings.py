"""Fusion of sibling loops: a loop that reads, iteration by iteration, only what the loop before it wrote in
the same iteration joins that loop, so the data is used while it is still in registers or L1.

The case it is for is softmax's kept row: ``for j: e[j] = exp(x[j] - max)`` followed by
``for j: sum_rf[..] += e[j]``; fused, the sum is accumulated in the exp loop and the row is read once less.
The CPU reduction sketch asks for it with ``PrimFunc.attrs[FUSE_SIBLINGS]``; the CPU backend runs
:func:`fuse_sibling_loops` on such a kernel after lowering.

Two serial loops ``A`` and ``B`` of a statement sequence, with the same extent and only statements ``S``
between them, become ``S; for v: A.body; B.body[v]`` when all of this holds (else they are left alone):

* ``B`` writes nothing ``A`` reads or writes;
* ``S`` reads nothing ``A`` writes and writes nothing ``A`` reads or writes (so it can run before ``A``);
* every load in ``B`` of a buffer ``A`` writes is an element that ``A`` writes, unguarded, in the same
  iteration: the load's index equals a store's index once the enclosing inner loops of both are paired
  (same extents, in order) and ``B``'s loop variable is ``A``'s;
* ``A``'s stores to such a buffer touch disjoint index ranges in different iterations (the flat index is
  ``c * v + r`` with the spread of ``r`` over the inner loops below ``c``), so no later iteration of ``A``
  overwrites what ``B`` read.
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler.loopir import simplify as S
from compiler.loopir.expr import Expr, Load, Var, substitute, walk
from compiler.loopir.stmt import (
    Allocate,
    BufferStore,
    For,
    IfThenElse,
    SeqStmt,
    Stmt,
    stmt_children,
    stmt_exprs,
)
from compiler.loopir.visitor import post_order, substitute_stmt

FUSE_SIBLINGS = "fuse_siblings"


@dataclass
class _Access:
    buffer: object
    indices: tuple[Expr, ...]
    loops: tuple[For, ...]  # the enclosing loops inside the sibling loop, outermost first
    guarded: bool  # under an IfThenElse inside the sibling loop


def _accesses(s: Stmt) -> tuple[list[_Access], list[_Access]]:
    """(stores, loads) under ``s`` with their enclosing loops below ``s``."""
    stores: list[_Access] = []
    loads: list[_Access] = []

    def visit(x: Stmt, loops: tuple[For, ...], guarded: bool) -> None:
        for e in stmt_exprs(x):
            for sub in walk(e):
                if isinstance(sub, Load):
                    loads.append(_Access(sub.buffer, sub.indices, loops, guarded))
        if isinstance(x, BufferStore):
            stores.append(_Access(x.buffer, tuple(x.indices), loops, guarded))
        inner = (*loops, x) if isinstance(x, For) else loops
        for kid in stmt_children(x):
            visit(kid, inner, guarded or isinstance(x, IfThenElse))

    visit(s, (), False)
    return stores, loads


def _ids(accesses: list[_Access]) -> set[int]:
    return {id(a.buffer) for a in accesses}


def _same_element(load: _Access, store: _Access, outer: dict[Var, Expr]) -> bool:
    if store.guarded or len(load.loops) != len(store.loops) or len(load.indices) != len(store.indices):
        return False
    if any(a.extent != b.extent for a, b in zip(load.loops, store.loops)):
        return False
    mapping = {**outer, **{a.var: b.var for a, b in zip(load.loops, store.loops)}}
    ranges = {lp.var: (0, lp.extent - 1) for lp in store.loops}
    for li, si in zip(load.indices, store.indices):
        renamed = S.simplify(substitute(li, mapping), ranges)
        if S.key(renamed) != S.key(S.simplify(si, ranges)):
            return False
    return True


def _disjoint_per_iteration(stores: list[_Access], var: Var, extent: int) -> bool:
    """Whether the stores write disjoint flat index ranges in different iterations of ``var``."""
    coeff: int | None = None
    lo, hi = None, None
    for st in stores:
        ranges = {lp.var: (0, lp.extent - 1) for lp in st.loops}
        flat = S.flat_index(st.buffer, st.indices, {**ranges, var: (0, extent - 1)})  # type: ignore[arg-type]
        c = S.linear_coeff(flat, var, ranges)
        if c is None or c <= 0 or (coeff is not None and c != coeff):
            return False
        coeff = c
        rest = S.bound(S.simplify(flat - var * c, ranges), ranges)
        if rest is None:
            return False
        lo = rest[0] if lo is None else min(lo, rest[0])
        hi = rest[1] if hi is None else max(hi, rest[1])
    return coeff is None or (lo is not None and hi is not None and hi - lo < coeff)


def _can_fuse(a: For, mids: list[Stmt], b: For) -> bool:
    if a.kind != "serial" or b.kind != "serial" or a.extent != b.extent or a.thread or b.thread:
        return False
    if any(isinstance(x, Allocate) for x in (a.body, b.body)):
        return False
    a_st, a_ld = _accesses(a.body)
    b_st, b_ld = _accesses(b.body)
    w1, r1, w2 = _ids(a_st), _ids(a_ld), _ids(b_st)
    if w2 & (r1 | w1):
        return False
    for m in mids:
        m_st, m_ld = _accesses(m)
        if _ids(m_st) & (r1 | w1) or _ids(m_ld) & w1:
            return False
    outer = {b.var: a.var}
    for ld in b_ld:
        if id(ld.buffer) not in w1:
            continue
        mine = [st for st in a_st if st.buffer is ld.buffer]
        if not any(_same_element(ld, st, outer) for st in mine):
            return False
        if not _disjoint_per_iteration(mine, a.var, a.extent):
            return False
    return True


def _fuse_in_seq(seq: SeqStmt) -> Stmt | None:
    xs = list(seq.stmts)
    changed = False
    i = 0
    while i < len(xs):
        a = xs[i]
        fused_at = None
        if isinstance(a, For):
            for j in range(i + 1, len(xs)):
                b = xs[j]
                if isinstance(b, For) and _can_fuse(a, xs[i + 1 : j], b):
                    body = SeqStmt([a.body, substitute_stmt(b.body, {b.var: a.var})])
                    fused = For(a.var, a.extent, body, a.kind, a.thread, dict(a.annotations))
                    xs = [*xs[:i], *xs[i + 1 : j], fused, *xs[j + 1 :]]
                    fused_at = j - 1
                    break
        if fused_at is not None:
            changed = True
            i = fused_at  # the fused loop may take the next sibling too
        else:
            i += 1
    return SeqStmt(xs) if changed else None


def fuse_sibling_loops(body: Stmt) -> Stmt:
    """``body`` with every fusable pair of sibling loops fused (see the module docstring)."""
    return post_order(body, lambda s: _fuse_in_seq(s) if isinstance(s, SeqStmt) else None)
