"""Double buffering of shared-memory tiles (software pipelining with register staging).

A serial loop annotated ``double_buffer`` (the contraction sketch sets it on the K-tile loop) whose body
is ``[allocate shared S...] { producers: S[...] = global[...]; consumers: ... read S ... }`` becomes::

    regs = producers(0); S'[0] = regs; __syncthreads()
    for ko:
        if (ko + 1 < K): regs = producers(ko + 1)       # global loads issued before the math ...
        consumers(ko) reading S'[ko % 2]
        if (ko + 1 < K): S'[(ko + 1) % 2] = regs        # ... and stored to the other stage after it
        __syncthreads()

One barrier per iteration instead of two, and the global-load latency of the next tile overlaps the
current tile's math. Writing stage (ko+1)%2 during iteration ko is safe: it was last read in iteration
ko-1, which every thread finished at that iteration's barrier. Producer stores are staged in a per-thread
``local`` buffer, one slot per store after expanding the (small) loops around them. Loops that do not
have this shape are left as they are.
"""

from __future__ import annotations

from compiler.loopir.expr import Expr, Load, const
from compiler.loopir.stmt import (
    Allocate,
    Barrier,
    Buffer,
    BufferStore,
    For,
    IfThenElse,
    SeqStmt,
    Stmt,
    seq,
    walk_stmts,
)
from compiler.loopir.visitor import (
    StmtExprVisitor,
    StmtMutator,
    StmtVisitor,
    map_stores,
    post_order,
    replace_loads,
    substitute_stmt,
    with_body,
)

MAX_SLOTS = 64  # staged values per thread


def double_buffer(s: Stmt) -> Stmt:
    """Double-buffer every annotated loop under ``s`` (innermost first)."""
    return post_order(s, _pipeline_loop)


def _pipeline_loop(s: Stmt) -> Stmt | None:
    if isinstance(s, For) and s.annotations.get("double_buffer") and s.kind != "thread" and s.extent > 1:
        return _pipeline(s)
    return None


def _pipeline(loop: For) -> Stmt | None:
    body, shared = loop.body, []
    while isinstance(body, Allocate) and body.buffer.scope == "shared":
        shared.append(body.buffer)
        body = body.body
    if not shared:
        return None
    stmts = body.stmts if isinstance(body, SeqStmt) else [body]
    ids = {b.uid for b in shared}
    k = 0
    while k < len(stmts) and _writes(stmts[k]) and _writes(stmts[k]) <= ids and not (_reads(stmts[k]) & ids):
        k += 1
    producers, consumers = stmts[:k], stmts[k:]
    if not producers or not consumers or any(_writes(c) & ids for c in consumers):
        return None
    if any(isinstance(x, Barrier) for p in producers for x in walk_stmts(p)):
        return None
    producers = [_expand(p) for p in producers]
    slots = sum(1 for p in producers for x in walk_stmts(p) if isinstance(x, BufferStore))
    if slots > MAX_SLOTS or any(_in_loop(p) for p in producers):
        return None
    staged = {b.uid: Buffer(f"{b.name}_db", (2, *b.shape), b.dtype, "shared") for b in shared}
    regs = Buffer(f"{loop.var.name}_prefetch", (slots,), shared[0].dtype, "local")
    if any(b.dtype != regs.dtype for b in shared):
        return None
    ko = loop.var

    def shift(st: Stmt, delta: int) -> Stmt:
        return substitute_stmt(st, {ko: ko + delta}) if delta else st

    def stage_of(e: Expr) -> Expr:
        return e % 2

    loads, stores, counter = [], [], [0]
    for p in producers:
        loads.append(map_stores(p, lambda st: BufferStore(regs, (const(_take(counter)),), st.value)))
    counter[0] = 0
    for p in producers:
        stores.append(
            map_stores(
                p,
                lambda st: BufferStore(
                    staged[st.buffer.uid], (stage_of(ko), *st.indices), Load(regs, (const(_take(counter)),))
                ),
            )
        )

    # consumers read the current stage
    def read_stage(st: Stmt) -> Stmt:
        return replace_loads(
            st,
            lambda ld: (
                Load(staged[ld.buffer.uid], (stage_of(ko), *ld.indices)) if ld.buffer.uid in staged else None
            ),
        )

    consumer = seq(*(read_stage(c) for c in consumers))
    zero = {ko: const(0)}
    prologue = [substitute_stmt(x, zero) for x in loads] + [substitute_stmt(x, zero) for x in stores]
    more = (ko + 1).lt(loop.extent)
    next_loads = IfThenElse(more, seq(*(shift(x, 1) for x in loads)))
    next_stores = IfThenElse(more, seq(*(shift(x, 1) for x in stores)))
    new_loop = For(
        ko,
        loop.extent,
        seq(next_loads, consumer, next_stores, Barrier()),
        loop.kind,
        loop.thread,
        {**loop.annotations, "kiln_synced": 1},
    )
    out: Stmt = seq(*prologue, Barrier(), new_loop)
    out = Allocate(regs, out)
    for b in shared:
        out = Allocate(staged[b.uid], out)
    return out


def _take(counter: list[int]) -> int:
    counter[0] += 1
    return counter[0] - 1


def _writes(s: Stmt) -> set[int]:
    return {x.buffer.uid for x in walk_stmts(s) if isinstance(x, BufferStore)}


def _reads(s: Stmt) -> set[int]:
    out: set[int] = set()

    class Reads(StmtExprVisitor):
        def visit_Load(self, e: Load) -> None:
            out.add(e.buffer.uid)
            self.generic_visit_expr(e)

    Reads().visit_stmt(s)
    return out


class _InLoop(StmtVisitor):
    """Whether a store sits inside a non-thread loop (it would need a slot per iteration)."""

    def __init__(self) -> None:
        self.depth = 0
        self.found = False

    def visit_For(self, s: For) -> None:
        serial = s.kind != "thread"
        self.depth += serial
        self.generic_visit_stmt(s)
        self.depth -= serial

    def visit_BufferStore(self, s: BufferStore) -> None:
        self.found = self.found or self.depth > 0


def _in_loop(s: Stmt) -> bool:
    v = _InLoop()
    v.visit_stmt(s)
    return v.found


class _Expand(StmtMutator):
    """Fully expand the small non-thread loops around stores (each store instance gets a slot)."""

    def visit_For(self, s: For) -> Stmt:
        body = self.visit_stmt(s.body)
        if s.kind != "thread" and s.extent <= MAX_SLOTS:
            return seq(*(substitute_stmt(body, {s.var: const(k, s.var.dtype)}) for k in range(s.extent)))
        return with_body(s, body)


def _expand(s: Stmt) -> Stmt:
    return _Expand().visit_stmt(s)
