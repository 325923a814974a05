"""Tree helpers and access analysis used by schedule primitives and lowering."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from compiler.loopir.expr import Expr, Load, Var, free_vars, loads, substitute
from compiler.loopir.simplify import Affine, affine_bound, from_affine, simplify, to_affine
from compiler.loopir.stmt import (
    Allocate,
    Block,
    Buffer,
    BufferStore,
    For,
    IfThenElse,
    SeqStmt,
    Stmt,
    stmt_children,
    walk_stmts,
)


def parent_map(root: Stmt) -> dict[int, Stmt]:
    out: dict[int, Stmt] = {}
    for s in walk_stmts(root):
        for c in stmt_children(s):
            out[id(c)] = s
    return out


def ancestors(root: Stmt, node: Stmt, parents: dict[int, Stmt] | None = None) -> list[Stmt]:
    """Statements enclosing ``node``, outermost first (``root`` included, ``node`` excluded). ``parents``:
    ``parent_map(root)`` when the caller asks for several nodes of an unchanged tree."""
    if parents is None:
        parents = parent_map(root)
    chain = []
    cur = parents.get(id(node))
    while cur is not None:
        chain.append(cur)
        cur = parents.get(id(cur))
    return list(reversed(chain))


def replace_child(parent: Stmt, old: Stmt, new: Stmt | None) -> None:
    """Put ``new`` where ``old`` was under ``parent`` (None removes it from a SeqStmt)."""
    if isinstance(parent, SeqStmt):
        i = next(k for k, s in enumerate(parent.stmts) if s is old)
        if new is None:
            del parent.stmts[i]
        elif isinstance(new, SeqStmt):
            parent.stmts[i : i + 1] = new.stmts
        else:
            parent.stmts[i] = new
        return
    if new is None:
        raise ValueError("cannot remove the only child of a statement")
    if isinstance(parent, (For, Allocate)):
        parent.body = new
    elif isinstance(parent, Block):
        if parent.body is old:
            parent.body = new
        else:
            parent.init = new
    elif isinstance(parent, IfThenElse):
        if parent.then is old:
            parent.then = new
        else:
            parent.else_ = new
    else:
        raise ValueError(f"cannot replace a child of {type(parent).__name__}")


def blocks_under(s: Stmt) -> list[Block]:
    return [x for x in walk_stmts(s) if isinstance(x, Block) and x is not s]


def block_stores(b: Block) -> list[BufferStore]:
    return [x for x in walk_stmts(b.body) if isinstance(x, BufferStore)]


def block_loads(b: Block) -> list[Load]:
    out: list[Load] = []
    for st in walk_stmts(b.body):
        if isinstance(st, BufferStore):
            out.extend(loads(st.value))
            for i in st.indices:
                out.extend(loads(i))
    return out


def writes(b: Block) -> list[Buffer]:
    seen: list[Buffer] = []
    for st in block_stores(b):
        if st.buffer not in seen:
            seen.append(st.buffer)
    return seen


def reads(b: Block) -> list[Buffer]:
    own = set(writes(b))
    seen: list[Buffer] = []
    for ld in block_loads(b):
        if ld.buffer not in own and ld.buffer not in seen:
            seen.append(ld.buffer)
    return seen


def binding_map(b: Block) -> dict[Var, Expr]:
    return {iv.var: e for iv, e in zip(b.iter_vars, b.bindings)}


def loop_ranges(loops: Iterable[For]) -> dict[Var, tuple[int, int]]:
    return {lp.var: (0, lp.extent - 1) for lp in loops}


def accesses_in_loop_vars(b: Block, buffer: Buffer, kind: str) -> list[tuple[Expr, ...]]:
    """Indices of ``buffer`` read ('r') or written ('w') by ``b``, iteration vars replaced by bindings."""
    bind = binding_map(b)
    out = []
    if kind == "w":
        for st in block_stores(b):
            if st.buffer is buffer:
                out.append(tuple(substitute(i, bind) for i in st.indices))
    else:
        for ld in block_loads(b):
            if ld.buffer is buffer:
                out.append(tuple(substitute(i, bind) for i in ld.indices))
    return out


def region(
    accesses: Sequence[tuple[Expr, ...]],
    shape: Sequence[int],
    inner: dict[Var, tuple[int, int]],
    outer: dict[Var, tuple[int, int]],
    clip: bool = False,
) -> list[tuple[Expr, int]]:
    """Per dimension, (start, extent) of the indices touched when ``inner`` variables range fully and
    ``outer`` ones are fixed. A dimension that cannot be analyzed exactly is the whole dimension; with
    ``clip`` (for sizing allocations) so is one whose region is at least as large as the dimension."""
    ranges = {**outer, **inner}
    result: list[tuple[Expr, int]] = []
    for d, size in enumerate(shape):
        spans: list[tuple[Affine, int, int]] = []
        ok = True
        for acc in accesses:
            a = to_affine(simplify(acc[d], ranges), ranges)
            base = Affine({}, a.const, a.dtype)
            part = Affine({}, 0, a.dtype)
            for k, (atom, c) in a.terms.items():
                vs = free_vars(atom)
                if vs and vs <= inner.keys():
                    part.terms[k] = (atom, c)
                elif vs & inner.keys():
                    ok = False
                else:
                    base.terms[k] = (atom, c)
            b = affine_bound(part, ranges)
            if not ok or b is None:
                ok = False
                break
            spans.append((base, b[0], b[1]))
        if not ok or not spans:
            result.append((_zero(), size))
            continue
        ref = spans[0][0]
        lo, hi = None, None
        for base, blo, bhi in spans:
            diff = base.plus(ref, -1)
            if not diff.is_const():
                ok = False
                break
            lo = blo + diff.const if lo is None else min(lo, blo + diff.const)
            hi = bhi + diff.const if hi is None else max(hi, bhi + diff.const)
        if not ok or lo is None or hi is None or (clip and hi - lo + 1 >= size):
            result.append((_zero(), size))
            continue
        start = from_affine(ref.plus(Affine({}, lo, ref.dtype)))
        result.append((start, hi - lo + 1))
    return result


def _zero() -> Expr:
    from compiler.loopir.expr import const

    return const(0)

