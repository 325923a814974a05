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

from compiler.loopir.expr import Expr, Load, Var, const
from compiler.loopir.lower import rewrite_exprs
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

MAX_SLOTS = 64  # staged values per thread


def apply(s: Stmt) -> Stmt:
    """Double-buffer every annotated loop under ``s``."""
    if isinstance(s, SeqStmt):
        return seq(*(apply(x) for x in s.stmts)) if s.stmts else s
    if isinstance(s, Allocate):
        return Allocate(s.buffer, apply(s.body))
    if isinstance(s, IfThenElse):
        return IfThenElse(s.cond, apply(s.then), apply(s.else_) if s.else_ is not None else None)
    if not isinstance(s, For):
        return s
    loop = For(s.var, s.extent, apply(s.body), s.kind, s.thread, s.annotations)
    if loop.annotations.get("double_buffer") and loop.kind != "thread" and loop.extent > 1:
        out = _pipeline(loop)
        if out is not None:
            return out
    return loop


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
        return rewrite_exprs(st, lambda x: ko + delta if x is ko else None) if delta else st

    def stage_of(e: Expr) -> Expr:
        return e % 2

    loads, stores, counter = [], [], [0]
    for p in producers:
        loads.append(_map_stores(p, lambda st: BufferStore(regs, (const(_take(counter)),), st.value)))
    counter[0] = 0
    for p in producers:
        stores.append(
            _map_stores(
                p,
                lambda st: BufferStore(
                    staged[st.buffer.uid], (stage_of(ko), *st.indices), Load(regs, (const(_take(counter)),))
                ),
            )
        )

    # consumers read the current stage
    def read_stage(st: Stmt) -> Stmt:
        return _map_loads(
            st,
            lambda ld: (
                Load(staged[ld.buffer.uid], (stage_of(ko), *ld.indices)) if ld.buffer.uid in staged else None
            ),
        )

    consumer = seq(*(read_stage(c) for c in consumers))
    zero = {ko: const(0)}
    prologue = [_subst(x, zero) for x in loads] + [_subst(x, zero) for x in stores]
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


def _subst(s: Stmt, mapping: dict[Var, Expr]) -> Stmt:
    return rewrite_exprs(s, lambda x: mapping.get(x) if isinstance(x, Var) else None)


def _writes(s: Stmt) -> set[int]:
    return {x.buffer.uid for x in walk_stmts(s) if isinstance(x, BufferStore)}


def _reads(s: Stmt) -> set[int]:
    from compiler.backends.cuda.lower import stmt_exprs
    from compiler.loopir.expr import walk

    return {
        ld.buffer.uid for x in walk_stmts(s) for e in stmt_exprs(x) for ld in walk(e) if isinstance(ld, Load)
    }


def _in_loop(s: Stmt, inside: bool = False) -> bool:
    """Whether a store sits inside a non-thread loop (it would need a slot per iteration)."""
    if isinstance(s, BufferStore):
        return inside
    if isinstance(s, For):
        return _in_loop(s.body, inside or s.kind != "thread")
    if isinstance(s, SeqStmt):
        return any(_in_loop(x, inside) for x in s.stmts)
    if isinstance(s, IfThenElse):
        return _in_loop(s.then, inside) or (s.else_ is not None and _in_loop(s.else_, inside))
    if isinstance(s, Allocate):
        return _in_loop(s.body, inside)
    return False


def _expand(s: Stmt) -> Stmt:
    """Fully expand the small non-thread loops around stores (each store instance gets a slot)."""
    if isinstance(s, For):
        body = _expand(s.body)
        if s.kind != "thread" and s.extent <= MAX_SLOTS:
            return seq(*(_subst(body, {s.var: const(k, s.var.dtype)}) for k in range(s.extent)))
        return For(s.var, s.extent, body, s.kind, s.thread, s.annotations)
    if isinstance(s, SeqStmt):
        return seq(*(_expand(x) for x in s.stmts))
    if isinstance(s, IfThenElse):
        return IfThenElse(s.cond, _expand(s.then), _expand(s.else_) if s.else_ is not None else None)
    if isinstance(s, Allocate):
        return Allocate(s.buffer, _expand(s.body))
    return s


def _map_stores(s: Stmt, fn) -> Stmt:
    if isinstance(s, BufferStore):
        return fn(s)
    if isinstance(s, For):
        return For(s.var, s.extent, _map_stores(s.body, fn), s.kind, s.thread, s.annotations)
    if isinstance(s, SeqStmt):
        return SeqStmt([_map_stores(x, fn) for x in s.stmts])
    if isinstance(s, IfThenElse):
        return IfThenElse(
            s.cond, _map_stores(s.then, fn), _map_stores(s.else_, fn) if s.else_ is not None else None
        )
    if isinstance(s, Allocate):
        return Allocate(s.buffer, _map_stores(s.body, fn))
    return s


def _map_loads(s: Stmt, fn) -> Stmt:
    return rewrite_exprs(s, lambda x: fn(x) if isinstance(x, Load) else None)
