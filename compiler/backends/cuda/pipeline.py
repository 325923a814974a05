"""Software pipelining of shared-memory tiles: double buffering with register staging, and a ``cp.async``
ring of several stages (sm_80+).

**Double buffering.**

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

**cp.async ring** (:func:`cp_async_pipeline`). A serial loop annotated ``cp_async_stages`` = S (S >= 2; the
contraction sketch's ``stages`` knob) with the same body shape becomes (as the tensor-core sketch's
pipeline)::

    for p < S-1: (if p < K) cp.async tile p into stage p ; commit          (prologue: S-1 groups)
    for ko:
        cp.async.wait_group(S-2) ; __syncthreads()        # tile ko landed and visible; stage (ko-1)%S free
        if (ko + S-1 < K): cp.async tile ko+S-1 into stage (ko+S-1) % S
        commit                                             # (an empty group near the end)
        consumers(ko) reading stage ko % S

At iteration ko, S-1+ko groups were committed before the wait, which lets S-2 stay in flight, so groups
0..ko (tiles 0..ko) have landed; the barrier makes them visible to every thread and orders the previous
iteration's reads of stage (ko-1) % S = (ko+S-1) % S before the new copies into it. The groups left in
flight at the end are the empty ones.

Each producer store ``S[i] = G[j]`` (a plain copy of a float32 global element; anything else is a
CompileError) becomes a ``cp_async`` intrinsic. A ``vectorized`` loop of V lanes whose destination and
source flat indices are consecutive in the lane and provably multiples of V (``vector_access.aligned``)
becomes one copy of 4V bytes (8 or 16); a guard that depends on the lane gets a vector path (when every
lane passes: the first and last for a guard linear in the lane) and a per-lane path. Anything else (a
transposed tile: the lanes land in different rows) is copied element by element with 4-byte copies.
Guards stay ``if``s around the copies (an element not copied is never read: the consumers are guarded
the same way). A K loop of one tile is gone by then (lowering drops extent-1 loops): its copies stay
plain stores.
"""

from __future__ import annotations

from compiler import dtypes
from compiler.backends.cuda.vector_access import aligned, copy_expr, lane_split, linear_guard
from compiler.errors import CompileError
from compiler.loopir import simplify as simp
from compiler.loopir.expr import Expr, Load, Logical, Var, const
from compiler.loopir.stmt import (
    Allocate,
    Barrier,
    Buffer,
    BufferStore,
    For,
    IfThenElse,
    Intrinsic,
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
CP_ASYNC_STAGES = "cp_async_stages"  # loop annotation: shared stages of the cp.async ring
CP_ASYNC_SIZES = (4, 8, 16)  # cp.async copy sizes (bytes)


def double_buffer(s: Stmt) -> Stmt:
    """Double-buffer every annotated loop under ``s`` (innermost first)."""
    return post_order(s, _pipeline_loop)


def _pipeline_loop(s: Stmt) -> Stmt | None:
    if isinstance(s, For) and s.annotations.get("double_buffer") and s.kind != "thread" and s.extent > 1:
        return _pipeline(s)
    return None


def _split(loop: For) -> tuple[list[Buffer], list[Stmt], list[Stmt]] | None:
    """(shared tiles, producers, consumers) of a loop body ``[allocate shared S...] {producers; consumers}``
    whose producers only write the tiles (reading none of them) and whose consumers do not write them."""
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
    return shared, producers, consumers


def _pipeline(loop: For) -> Stmt | None:
    split = _split(loop)
    if split is None:
        return None
    shared, producers, consumers = split
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


# --------------------------------------------------------------------------- cp.async ring
def cp_async_pipeline(part: Stmt) -> Stmt:
    """Turn every loop of ``part`` (one kernel) annotated ``cp_async_stages`` into a cp.async ring (see
    the module docstring). A CompileError when an annotated loop does not have the shape."""
    return _Ring().visit_stmt(part)


def _commit() -> Stmt:
    return Intrinsic("cp_async_commit", (), ())


class _Ranges(StmtMutator):
    """Tracks the range of every loop variable in scope (for the alignment proofs)."""

    def __init__(self, ranges: dict | None = None) -> None:
        self.ranges: dict[Var, tuple[int, int]] = dict(ranges or {})

    def visit_For(self, s: For) -> Stmt:
        old = self.ranges.get(s.var)
        self.ranges[s.var] = (0, max(s.extent - 1, 0))
        try:
            return self.visit_loop(s)
        finally:
            if old is None:
                self.ranges.pop(s.var, None)
            else:
                self.ranges[s.var] = old

    def visit_loop(self, s: For) -> Stmt:
        return self.generic_visit_stmt(s)


class _Ring(_Ranges):
    def visit_loop(self, s: For) -> Stmt:
        out = self.generic_visit_stmt(s)
        stages = int(s.annotations.get(CP_ASYNC_STAGES, 0))
        if stages < 2 or s.kind == "thread" or not isinstance(out, For):
            return out
        return _ring(out, stages, dict(self.ranges))


def _ring(loop: For, stages: int, ranges: dict) -> Stmt:
    split = _split(loop)
    if split is None:
        raise CompileError(
            f"cp.async pipeline of loop {loop.var.name}: its body is not [shared tile copies; math on them]"
        )
    shared, producers, consumers = split
    ring = {b.uid: Buffer(f"{b.name}_ring", (stages, *b.shape), b.dtype, "shared") for b in shared}
    ko, stage = loop.var, Var("stage")
    copies = _CpAsync(ring, stage, {**ranges, stage: (0, stages - 1)})
    issue = [copies.visit_stmt(p) for p in producers]

    def tile(t: Expr, at: Expr) -> Stmt:
        return seq(*(substitute_stmt(x, {ko: t, stage: at}) for x in issue))

    def read_stage(st: Stmt) -> Stmt:
        def at_stage(ld: Load) -> Expr | None:
            return Load(ring[ld.buffer.uid], (ko % stages, *ld.indices)) if ld.buffer.uid in ring else None

        return replace_loads(st, at_stage)

    prologue = [
        seq(tile(const(p), const(p)) if p < loop.extent else None, _commit()) for p in range(stages - 1)
    ]
    nxt = ko + (stages - 1)
    body = seq(
        Intrinsic("cp_async_wait", (), (), (const(stages - 2),)),
        Barrier(),
        IfThenElse(nxt.lt(loop.extent), tile(nxt, nxt % stages)),
        _commit(),
        *(read_stage(c) for c in consumers),
    )
    annotations = {k: v for k, v in loop.annotations.items() if k != CP_ASYNC_STAGES}
    new_loop = For(ko, loop.extent, body, loop.kind, loop.thread, {**annotations, "kiln_synced": 1})
    out: Stmt = seq(*prologue, new_loop)
    for b in shared:
        out = Allocate(ring[b.uid], out)
    return out


class _CpAsync(_Ranges):
    """Producer stores into the ring's ``stage`` as cp.async copies (4, 8 or 16 bytes)."""

    def __init__(self, ring: dict[int, Buffer], stage: Var, ranges: dict) -> None:
        super().__init__(ranges)
        self.ring, self.stage = ring, stage

    def visit_loop(self, s: For) -> Stmt:
        if s.kind == "vectorized":
            return self.vector(s)
        return self.generic_visit_stmt(s)

    def visit_BufferStore(self, s: BufferStore) -> Stmt:
        return self.copy(s)

    def copy(self, st: BufferStore, lanes: int = 1) -> Intrinsic:
        """The cp.async of ``lanes`` elements from ``st``'s source into its element of the stage."""
        src = st.value
        if st.buffer.uid not in self.ring or not isinstance(src, Load) or src.buffer.scope != "global":
            raise CompileError(
                f"cp.async pipeline: the store to {st.buffer.name} is not a plain copy of a global element"
            )
        size = dtypes.info(st.buffer.dtype).itemsize * lanes
        if src.buffer.dtype != st.buffer.dtype or src.lanes != 1 or size not in CP_ASYNC_SIZES:
            raise CompileError(
                f"cp.async pipeline: {st.buffer.name} <- {src.buffer.name} ({src.buffer.dtype}) is not a "
                f"copy of 4, 8 or 16 bytes of one element type"
            )
        dst = self.ring[st.buffer.uid]
        return Intrinsic(
            "cp_async",
            (dst, src.buffer),
            (
                simp.flat_index(dst, (self.stage, *st.indices), self.ranges),
                simp.flat_index(src.buffer, src.indices, self.ranges),
            ),
            (const(True, "bool"), const(size)),
        )

    def vector(self, loop: For) -> Stmt:
        """One copy of the loop's lanes when they are consecutive and aligned in both buffers, else one per
        lane; a guard linear in the lane gets both (vector when its first and last lane pass)."""
        body, guard = loop.body, None
        if isinstance(body, IfThenElse) and body.else_ is None:
            guard, body = body.cond, body.then
        if not isinstance(body, BufferStore):
            raise CompileError(f"cp.async pipeline: vectorized loop {loop.var.name} is not one copy")
        lanes = loop.extent
        per_lane = []
        for k in range(lanes):
            one: Stmt = self.copy(substitute_stmt(body, {loop.var: const(k, loop.var.dtype)}))  # type: ignore[arg-type]
            if guard is not None:
                one = IfThenElse(copy_expr(guard, loop.var, k), one)
            per_lane.append(one)
        slow = seq(*per_lane)
        first = self.copy(substitute_stmt(body, {loop.var: const(0, loop.var.dtype)}))  # type: ignore[arg-type]
        size = dtypes.info(body.buffer.dtype).itemsize * lanes
        if lanes == 1 or size not in CP_ASYNC_SIZES or not self.consecutive(loop, body, lanes):
            return slow
        fast = Intrinsic(first.name, first.buffers, first.offsets, (const(True, "bool"), const(size)))
        if guard is None:
            return fast
        # the vector copy when every lane passes: the first and the last for a guard linear in the lane,
        # else each of them (its lane offset moved out of the modulos, so the conditions mostly coincide)
        at = (0, lanes - 1) if linear_guard(guard, loop.var) else range(lanes)
        conds = [lane_split(copy_expr(guard, loop.var, k), self.ranges, lanes) for k in at]
        every = conds[0]
        for c in conds[1:]:
            every = Logical("and", every, c)
        return IfThenElse(simp.simplify(every, self.ranges), fast, slow)

    def consecutive(self, loop: For, st: BufferStore, lanes: int) -> bool:
        """Whether lane k of the copy reads and writes flat element base + k (both bases multiples of the
        lane count)."""
        assert isinstance(st.value, Load)
        dst = (self.ring[st.buffer.uid], (self.stage, *st.indices))
        for buf, idx in (dst, (st.value.buffer, st.value.indices)):
            flats = [
                lane_split(
                    simp.flat_index(buf, [copy_expr(i, loop.var, k) for i in idx], self.ranges),
                    self.ranges,
                    lanes,
                )
                for k in range(lanes)
            ]
            try:
                affs = [simp.to_affine(f, self.ranges) for f in flats]
            except Exception:
                return False
            terms = [sorted((key, c) for key, (_, c) in a.terms.items()) for a in affs]
            steps = [a.const - affs[0].const for a in affs]
            if any(t != terms[0] for t in terms) or steps != list(range(lanes)):
                return False
            if not aligned(flats[0], lanes, self.ranges):
                return False
        return True
