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

from compiler.errors import CompileError
from compiler.loopir import analysis as A
from compiler.loopir.expr import (
    Binary,
    Const,
    Expr,
    Load,
    Var,
    combine,
    conjuncts,
    const,
    free_vars,
    logical_and,
    replace_buffer_loads,
    structural_equal,
    substitute,
    walk,
)
from compiler.loopir.simplify import simplify
from compiler.loopir.stmt import (
    Allocate,
    Block,
    Buffer,
    BufferStore,
    For,
    IfThenElse,
    PrimFunc,
    SeqStmt,
    Stmt,
    rebuild_stmt,
    seq,
    walk_stmts,
)
from compiler.loopir.visitor import StmtMutator, substitute_stmt, with_body

# ``PrimFunc.attrs`` key a backend sets once it has rewritten a function's GPU thread axes for lowering
THREAD_LOOPS_PREPARED = "thread_loops_prepared"
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
    """A new, block-free function equivalent to ``func`` (which is left untouched). Target-independent:
    a function with loops bound to GPU thread axes must first be prepared by its backend (the CUDA
    backend's ``lower`` runs ``prepare``, this function and ``finish``); otherwise a CompileError is raised.
    ``unroll=False`` keeps "unrolled" loops as loops (what the cost model's features read)."""
    root = func.body
    if not isinstance(root, Block):
        return func
    if THREAD_LOOPS_PREPARED not in func.attrs and any(
        isinstance(s, For) and s.kind == "thread" for s in walk_stmts(root)
    ):
        raise CompileError(
            f"function {func.name} has loops bound to GPU thread axes: lower it with its backend "
            "(get_backend(target).lower(func)), which rewrites thread axes and cross-thread reductions first"
        )
    sites = _Sites(root)
    plans = {id(b): _plan(root, b, sites) for b in root.alloc_buffers}
    by_site: dict[int, list[_Compact]] = {}
    for p in plans.values():
        by_site.setdefault(id(p.site) if p.site is not None else 0, []).append(p)
    body = _Convert(plans, by_site).visit_stmt(root.body)
    for p in by_site.get(0, []):
        body = Allocate(p.buffer, body)
    body = _HoistIfs().visit_stmt(_clean(body))
    if unroll:
        body = _Unroll().visit_stmt(body)
    return PrimFunc(func.name, func.params, body, func.num_inputs, dict(func.attrs))


class _Sites:
    """What every buffer's plan asks of the (unchanged) root: its blocks with the buffers each touches,
    and each block's enclosing loops, computed once for all of them."""

    def __init__(self, root: Block) -> None:
        parents = A.parent_map(root)
        self.blocks = [(b, {id(x) for x in (*A.writes(b), *A.reads(b))}) for b in A.blocks_under(root)]
        self.loops = {
            id(b): [s for s in A.ancestors(root, b, parents) if isinstance(s, For)] for b, _ in self.blocks
        }

    def touching(self, buf: Buffer) -> list[Block]:
        return [b for b, bufs in self.blocks if id(buf) in bufs]


def _plan(root: Block, buf: Buffer, sites: _Sites) -> _Compact:
    blocks = sites.touching(buf)
    if not blocks:
        return _Compact(None, buf, [const(0)] * len(buf.shape))
    chains = [sites.loops[id(b)] for b in blocks]
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


class _Convert(StmtMutator):
    """Blocks -> plain statements; compacted buffers allocated at their loops."""

    def __init__(self, plans: dict[int, _Compact], by_site: dict[int, list[_Compact]]) -> None:
        self.plans, self.by_site = plans, by_site

    def visit_For(self, s: For) -> Stmt:
        body = self.visit_stmt(s.body)
        for p in self.by_site.get(id(s), []):
            body = Allocate(p.buffer, body)
        return with_body(s, body)

    def visit_Block(self, b: Block) -> Stmt:
        return _convert_block(b, self.plans)


class _BlockBody(StmtMutator):
    """A block body with iteration variables bound and compacted buffers' accesses rebased."""

    def __init__(self, bind: dict[Var, Expr], plans: dict[int, _Compact]) -> None:
        self.bind, self.plans = bind, plans

    def visit_expr(self, e: Expr) -> Expr:
        e = substitute(e, self.bind)
        return replace_buffer_loads(e, lambda ld: _rebase_load(ld, self.plans))

    def visit_BufferStore(self, st: BufferStore) -> Stmt:
        idx = tuple(self.visit_expr(i) for i in st.indices)
        p = self.plans.get(id(st.buffer))
        buf = st.buffer
        if p is not None:
            buf, idx = p.buffer, tuple(i - s0 for i, s0 in zip(idx, p.starts))
        return BufferStore(buf, idx, self.visit_expr(st.value))


def _convert_block(b: Block, plans: dict[int, _Compact]) -> Stmt:
    bind = dict(zip((iv.var for iv in b.iter_vars), b.bindings))
    fix = _BlockBody(bind, plans)
    body = fix.visit_stmt(b.body)
    if b.init is not None:
        reduce_vals = [bind[iv.var] for iv in b.iter_vars if iv.kind == "R"]
        first = logical_and(*(v.eq(0) for v in reduce_vals)) if reduce_vals else const(True)
        body = seq(IfThenElse(first, fix.visit_stmt(b.init)), body)
    if b.predicate is not None:
        body = IfThenElse(fix.visit_expr(b.predicate), body)
    return body


def _rebase_load(ld: Load, plans: dict[int, _Compact]) -> Expr | None:
    p = plans.get(id(ld.buffer))
    if p is None or (
        p.buffer is ld.buffer and all(isinstance(s0, Const) and s0.value == 0 for s0 in p.starts)
    ):
        return None
    return Load(p.buffer, tuple(i - s0 for i, s0 in zip(ld.indices, p.starts)))


# ------------------------------------------------------------- simplification
class _Clean(StmtMutator):
    """Simplify expressions with loop ranges, drop unit loops and decided ifs."""

    def __init__(self) -> None:
        self.ranges: dict[Var, tuple[int, int]] = {}

    def visit_expr(self, e: Expr) -> Expr:
        return simplify(e, self.ranges)

    def visit_For(self, s: For) -> Stmt:
        if s.extent == 1 and s.kind != "thread":
            return self.visit_stmt(substitute_stmt(s.body, {s.var: const(0)}))
        self.ranges[s.var] = (0, s.extent - 1)
        try:
            body = self.visit_stmt(s.body)
        finally:
            del self.ranges[s.var]
        return SeqStmt([]) if _empty(body) else with_body(s, body)

    def visit_SeqStmt(self, s: SeqStmt) -> Stmt:
        return seq(*(self.visit_stmt(x) for x in s.stmts)) if s.stmts else s

    def visit_IfThenElse(self, s: IfThenElse) -> Stmt:
        cond = self.visit_expr(s.cond)
        if isinstance(cond, Const):
            branch = s.then if cond.value else s.else_
            return self.visit_stmt(branch) if branch is not None else SeqStmt([])
        then = self.visit_stmt(s.then)
        other = self.visit_stmt(s.else_) if s.else_ is not None else None
        return rebuild_stmt(s, [then] if other is None else [then, other], [cond])


def _clean(s: Stmt) -> Stmt:
    return _Clean().visit_stmt(s)


class _HoistIfs(StmtMutator):
    """Move guard conjuncts that do not depend on a loop's variable out of that loop:
    ``for i { if (a && b(i)) S }`` -> ``if (a) for i { if (b(i)) S }`` (innermost loops first)."""

    def visit_For(self, s: For) -> Stmt:
        body = self.visit_stmt(s.body)
        if isinstance(body, IfThenElse) and body.else_ is None and s.kind != "thread":
            parts = conjuncts(body.cond)
            outside = [c for c in parts if s.var not in free_vars(c)]
            if outside:
                inside = [c for c in parts if s.var in free_vars(c)]
                inner = IfThenElse(logical_and(*inside), body.then) if inside else body.then
                return IfThenElse(logical_and(*outside), with_body(s, inner))
        return with_body(s, body)


def _empty(s: Stmt) -> bool:
    return isinstance(s, SeqStmt) and not s.stmts


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


class _Unroll(StmtMutator):
    """Unroll small 'unrolled' loops explicitly (innermost first) so indices become constants; a loop
    annotated ``REDUCE_TREE`` becomes a balanced tree of its terms."""

    def visit_For(self, s: For) -> Stmt:
        body = self.visit_stmt(s.body)
        if s.kind == "unrolled" and s.annotations.get(REDUCE_TREE):
            tree = _tree_reduction(s, body)
            if tree is not None:
                return tree
        if (
            s.kind == "unrolled"
            and s.extent <= UNROLL_MAX_EXTENT
            and s.extent * _size(body) <= UNROLL_MAX_STMTS
        ):
            return seq(*(_clean(substitute_stmt(body, {s.var: const(k)})) for k in range(s.extent)))
        return with_body(s, body)
