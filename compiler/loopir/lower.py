"""Lowering of a scheduled, block-structured function to plain loops for codegen and the interpreter.

1. Buffer compaction (TVM's CompactBufferAllocation): each intermediate buffer is allocated at the
   innermost loop that encloses all its accesses, shrunk to the region accessed under that loop, with
   indices rebased. This is what turns a cache_write'd accumulator into a small register tile.
2. Blocks disappear: iteration variables are replaced by their bindings; a reduction's init becomes
   ``if (all reduce vars == 0) init``; a block predicate becomes an ``if``.
3. Simplification with loop ranges; loops of extent 1 vanish; small "unrolled" loops are unrolled
   explicitly so that register tiles have constant indices.
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler.loopir import analysis as A
from compiler.loopir.expr import (
    Binary,
    Const,
    Expr,
    Load,
    Var,
    combine,
    const,
    free_vars,
    logical_and,
    replace_buffer_loads,
    structural_equal,
    substitute,
    transform,
    walk,
)
from compiler.loopir.simplify import simplify
from compiler.loopir.stmt import (
    Allocate,
    Barrier,
    Block,
    Buffer,
    BufferStore,
    Evaluate,
    For,
    IfThenElse,
    PrimFunc,
    SeqStmt,
    Stmt,
    seq,
    walk_stmts,
)

UNROLL_MAX_EXTENT = 32
# a loop annotation: unroll this reduction loop into a balanced tree of its terms (see _tree_reduction)
REDUCE_TREE = "reduce_tree"
TREE_MAX_TERMS = 256
_TREE_COMBINERS = {"+": "sum", "max": "max", "min": "min"}
UNROLL_MAX_STMTS = 256


@dataclass
class _Compact:
    site: For | None  # None: allocate at function level
    buffer: Buffer  # the compacted buffer
    starts: list[Expr]


def lower_func(func: PrimFunc, unroll: bool = True) -> PrimFunc:
    """A new, block-free function equivalent to ``func`` (which is left untouched)."""
    root = func.body
    if not isinstance(root, Block):
        return func
    gpu = any(isinstance(s, For) and s.kind == "thread" for s in walk_stmts(root))
    if gpu:  # thread axes, cross-thread reductions (compiler.backends.cuda.lower)
        from compiler.backends.cuda import lower as lower_cuda

        func = lower_cuda.prepare(func)
        root = func.body
        assert isinstance(root, Block)
    plans = {id(b): _plan(root, b) for b in root.alloc_buffers}
    by_site: dict[int, list[_Compact]] = {}
    for p in plans.values():
        by_site.setdefault(id(p.site) if p.site is not None else 0, []).append(p)
    body = _convert(root.body, plans, by_site)
    for p in by_site.get(0, []):
        body = Allocate(p.buffer, body)
    body = _hoist_ifs(_clean(body, {}))
    if unroll:
        body = _unroll(body)
    out = PrimFunc(func.name, func.params, body, func.num_inputs, dict(func.attrs))
    return lower_cuda.finish(out) if gpu else out


def _plan(root: Block, buf: Buffer) -> _Compact:
    blocks = [b for b in A.blocks_under(root) if buf in A.writes(b) or buf in A.reads(b)]
    if not blocks:
        return _Compact(None, buf, [const(0)] * len(buf.shape))
    chains = [[s for s in A.ancestors(root, b) if isinstance(s, For)] for b in blocks]
    prefix: list[For] = []
    for level in zip(*chains):
        if all(x is level[0] for x in level):
            prefix.append(level[0])
        else:
            break
    if buf.scope == "shared":  # shared memory lives outside the thread loops
        while prefix and any(
            lp.kind == "thread" and (lp.thread or "").startswith("threadIdx") for lp in prefix
        ):
            prefix.pop()
    if buf.scope == "global" and any(lp.kind == "thread" for lp in prefix):
        prefix = []
    # a local buffer is per thread: loops bound to thread axes are fixed points of its region
    fixed = [lp for ch in chains for lp in ch if lp.kind == "thread"] if buf.scope == "local" else []
    outer = A.loop_ranges([*prefix, *fixed])
    accesses, inner = [], {}
    for b, chain in zip(blocks, chains):
        inner.update(A.loop_ranges(lp for lp in chain if lp not in prefix and lp not in fixed))
        accesses += A.accesses_in_loop_vars(b, buf, "r") + A.accesses_in_loop_vars(b, buf, "w")
    reg = A.region(accesses, buf.shape, inner, outer, clip=True)
    shape = tuple(ext for _, ext in reg)
    new = Buffer(buf.name, shape, buf.dtype, buf.scope) if shape != buf.shape else buf
    return _Compact(prefix[-1] if prefix else None, new, [s for s, _ in reg])


def _convert(s: Stmt, plans: dict[int, _Compact], by_site: dict[int, list[_Compact]]) -> Stmt:
    if isinstance(s, SeqStmt):
        return seq(*(_convert(x, plans, by_site) for x in s.stmts)) if s.stmts else SeqStmt([])
    if isinstance(s, For):
        body = _convert(s.body, plans, by_site)
        for p in by_site.get(id(s), []):
            body = Allocate(p.buffer, body)
        return For(s.var, s.extent, body, s.kind, s.thread, dict(s.annotations))
    if isinstance(s, Block):
        return _convert_block(s, plans)
    if isinstance(s, (Evaluate, Barrier, BufferStore, IfThenElse, Allocate)):
        return s
    raise TypeError(f"cannot lower {type(s).__name__}")


def _convert_block(b: Block, plans: dict[int, _Compact]) -> Stmt:
    bind = dict(zip((iv.var for iv in b.iter_vars), b.bindings))

    def fix(e: Expr) -> Expr:
        e = substitute(e, bind)
        return replace_buffer_loads(e, lambda ld: _rebase_load(ld, plans))

    def fix_store(st: Stmt) -> Stmt:
        if isinstance(st, SeqStmt):
            return seq(*(fix_store(x) for x in st.stmts))
        if isinstance(st, IfThenElse):
            return IfThenElse(fix(st.cond), fix_store(st.then), fix_store(st.else_) if st.else_ else None)
        if isinstance(st, Evaluate):
            return Evaluate(fix(st.expr))
        if isinstance(st, Barrier):
            return st
        assert isinstance(st, BufferStore), type(st)
        idx = tuple(fix(i) for i in st.indices)
        p = plans.get(id(st.buffer))
        buf = st.buffer
        if p is not None:
            buf, idx = p.buffer, tuple(i - s0 for i, s0 in zip(idx, p.starts))
        return BufferStore(buf, idx, fix(st.value))

    body = fix_store(b.body)
    if b.init is not None:
        reduce_vals = [bind[iv.var] for iv in b.iter_vars if iv.kind == "R"]
        first = logical_and(*(v.eq(0) for v in reduce_vals)) if reduce_vals else const(True)
        body = seq(IfThenElse(first, fix_store(b.init)), body)
    if b.predicate is not None:
        body = IfThenElse(fix(b.predicate), body)
    return body


def _rebase_load(ld: Load, plans: dict[int, _Compact]) -> Expr | None:
    p = plans.get(id(ld.buffer))
    if p is None or (
        p.buffer is ld.buffer and all(isinstance(s0, Const) and s0.value == 0 for s0 in p.starts)
    ):
        return None
    return Load(p.buffer, tuple(i - s0 for i, s0 in zip(ld.indices, p.starts)))


# ------------------------------------------------------------- simplification
def _clean(s: Stmt, ranges: dict[Var, tuple[int, int]]) -> Stmt:
    """Simplify expressions with loop ranges, drop unit loops and decided ifs."""
    if isinstance(s, SeqStmt):
        return seq(*(x for x in (_clean(y, ranges) for y in s.stmts) if not _empty(x))) if s.stmts else s
    if isinstance(s, For):
        if s.extent == 1 and s.kind != "thread":
            return _clean(_subst(s.body, {s.var: const(0)}), ranges)
        inner = {**ranges, s.var: (0, s.extent - 1)}
        body = _clean(s.body, inner)
        if _empty(body):
            return SeqStmt([])
        return For(s.var, s.extent, body, s.kind, s.thread, s.annotations)
    if isinstance(s, IfThenElse):
        cond = simplify(s.cond, ranges)
        if isinstance(cond, Const):
            branch = s.then if cond.value else s.else_
            return _clean(branch, ranges) if branch is not None else SeqStmt([])
        then = _clean(s.then, ranges)
        other = _clean(s.else_, ranges) if s.else_ is not None else None
        return IfThenElse(cond, then, other)
    if isinstance(s, BufferStore):
        return BufferStore(s.buffer, tuple(simplify(i, ranges) for i in s.indices), simplify(s.value, ranges))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, _clean(s.body, ranges))
    if isinstance(s, Evaluate):
        return Evaluate(simplify(s.expr, ranges))
    return s


def _conjuncts(e: Expr) -> list[Expr]:
    from compiler.loopir.expr import Logical

    if isinstance(e, Logical) and e.op == "and":
        return _conjuncts(e.a) + _conjuncts(e.b)  # type: ignore[arg-type]
    return [e]


def _hoist_ifs(s: Stmt) -> Stmt:
    """Move guard conjuncts that do not depend on a loop's variable out of that loop:
    ``for i { if (a && b(i)) S }`` -> ``if (a) for i { if (b(i)) S }`` (innermost loops first)."""
    if isinstance(s, SeqStmt):
        return seq(*(_hoist_ifs(x) for x in s.stmts))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, _hoist_ifs(s.body))
    if isinstance(s, IfThenElse):
        return IfThenElse(s.cond, _hoist_ifs(s.then), _hoist_ifs(s.else_) if s.else_ else None)
    if not isinstance(s, For):
        return s
    body = _hoist_ifs(s.body)
    if isinstance(body, IfThenElse) and body.else_ is None and s.kind != "thread":
        parts = _conjuncts(body.cond)
        outside = [c for c in parts if s.var not in free_vars(c)]
        if outside:
            inside = [c for c in parts if s.var in free_vars(c)]
            inner = IfThenElse(logical_and(*inside), body.then) if inside else body.then
            return IfThenElse(
                logical_and(*outside), For(s.var, s.extent, inner, s.kind, s.thread, s.annotations)
            )
    return For(s.var, s.extent, body, s.kind, s.thread, s.annotations)


def _empty(s: Stmt) -> bool:
    return isinstance(s, SeqStmt) and not s.stmts


def _subst(s: Stmt, mapping: dict[Var, Expr]) -> Stmt:
    def f(e: Expr) -> Expr:
        return substitute(e, mapping)

    if isinstance(s, SeqStmt):
        return SeqStmt([_subst(x, mapping) for x in s.stmts])
    if isinstance(s, For):
        return For(s.var, s.extent, _subst(s.body, mapping), s.kind, s.thread, s.annotations)
    if isinstance(s, IfThenElse):
        return IfThenElse(f(s.cond), _subst(s.then, mapping), _subst(s.else_, mapping) if s.else_ else None)
    if isinstance(s, BufferStore):
        return BufferStore(s.buffer, tuple(f(i) for i in s.indices), f(s.value))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, _subst(s.body, mapping))
    if isinstance(s, Evaluate):
        return Evaluate(f(s.expr))
    return s


def _tree_reduction(loop: For, body: Stmt) -> Stmt | None:
    """An unrolled ``acc = acc (+|max|min) e(i)`` loop (annotated ``REDUCE_TREE``) as one store of a balanced
    tree of its terms: the chain of ``n`` dependent operations becomes ``log2(n)`` levels (a horizontal
    reduction of 4 vector accumulators x 16 lanes: 6 instead of 64). None when the loop is not of that form.
    Floating-point sums are reassociated, as any parallel or vectorized reduction is."""
    if not isinstance(body, BufferStore) or loop.extent > TREE_MAX_TERMS:
        return None
    v = body.value
    if not (isinstance(v, Binary) and v.op in _TREE_COMBINERS and isinstance(v.a, Load)):
        return None
    same = len(v.a.indices) == len(body.indices) and all(
        structural_equal(x, y) for x, y in zip(v.a.indices, body.indices)
    )
    if v.a.buffer is not body.buffer or not same:
        return None
    if any(loop.var in free_vars(i) for i in body.indices):
        return None
    if any(isinstance(x, Load) and x.buffer is body.buffer for x in walk(v.b)):
        return None
    combiner = _TREE_COMBINERS[v.op]
    terms = [simplify(substitute(v.b, {loop.var: const(k)})) for k in range(loop.extent)]
    while len(terms) > 1:  # term k with term k + n/2: whole accumulators first, then halves of lanes,
        half = len(terms) // 2  # the order in which a vector reduction combines them
        terms = [combine(combiner, terms[k], terms[k + half]) for k in range(half)] + terms[2 * half :]
    return BufferStore(body.buffer, body.indices, combine(combiner, v.a, terms[0]))


def _size(s: Stmt) -> int:
    return sum(1 for _ in walk_stmts(s))


def _unroll(s: Stmt) -> Stmt:
    """Unroll small 'unrolled' loops explicitly (innermost first) so indices become constants."""
    if isinstance(s, SeqStmt):
        return seq(*(_unroll(x) for x in s.stmts))
    if isinstance(s, For):
        body = _unroll(s.body)
        if s.kind == "unrolled" and s.annotations.get(REDUCE_TREE):
            tree = _tree_reduction(s, body)
            if tree is not None:
                return tree
        if (
            s.kind == "unrolled"
            and s.extent <= UNROLL_MAX_EXTENT
            and s.extent * _size(body) <= UNROLL_MAX_STMTS
        ):
            copies = [_clean(_subst(body, {s.var: const(k)}), {}) for k in range(s.extent)]
            return seq(*copies)
        return For(s.var, s.extent, body, s.kind, s.thread, s.annotations)
    if isinstance(s, IfThenElse):
        return IfThenElse(s.cond, _unroll(s.then), _unroll(s.else_) if s.else_ else None)
    if isinstance(s, Allocate):
        return Allocate(s.buffer, _unroll(s.body))
    return s


def rewrite_exprs(s: Stmt, fn) -> Stmt:
    """Apply ``transform(expr, fn)`` to every expression of a lowered statement tree."""
    return _map_exprs(s, lambda e: transform(e, fn))


def _map_exprs(s: Stmt, f) -> Stmt:
    if isinstance(s, SeqStmt):
        return SeqStmt([_map_exprs(x, f) for x in s.stmts])
    if isinstance(s, For):
        return For(s.var, s.extent, _map_exprs(s.body, f), s.kind, s.thread, s.annotations)
    if isinstance(s, IfThenElse):
        return IfThenElse(f(s.cond), _map_exprs(s.then, f), _map_exprs(s.else_, f) if s.else_ else None)
    if isinstance(s, BufferStore):
        return BufferStore(s.buffer, tuple(f(i) for i in s.indices), f(s.value))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, _map_exprs(s.body, f))
    if isinstance(s, Evaluate):
        return Evaluate(f(s.expr))
    return s
