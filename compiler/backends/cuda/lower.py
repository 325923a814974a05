"""CUDA-specific lowering: thread axes, cross-thread reductions, store guards, barriers, launch shape.

:func:`lower_gpu_func` (the CUDA backend's ``lower``) runs :func:`prepare` on the block-structured
function when it has loops bound to GPU thread axes, then the target-independent
``compiler.loopir.lower_func``, then :func:`finish` on the plain result.

Conventions of a GPU-scheduled function (what the CUDA codegen and the SIMT interpreter rely on):

* Each top-level statement of the body is one kernel (usually the only one). Loops bound to
  ``blockIdx.*`` enclose everything else of their kernel; the code inside them is run by every thread of
  the block. A loop bound to ``threadIdx.*`` runs its body on the threads whose index on that axis is
  below its extent, with the loop variable equal to that index. Sibling loops may bind the same axis:
  :func:`prepare` gives every loop of one axis the same variable (``tx``, ``ty``, ``bx`` ...), so a
  per-thread (``local``) buffer indexed by a thread variable is compacted to one element per thread.
* The block shape is the largest extent bound to each ``threadIdx`` axis, the grid the ``blockIdx``
  extents (recorded by :func:`finish` in ``func.attrs["launch"]``).

Cross-thread reduction (TVM's LowerCrossThreadReduction): a reduction block whose reduce iteration
variable is bound to ``threadIdx.x`` (``bind(loop, "threadIdx.x", allow_reduce=True)``, usually on the
write-back block of an ``rfactor``) combines one value per thread. :func:`prepare` rewrites it into
per-thread code every thread of the block runs:

    t = pred ? value : identity                        (a local scalar)
    t = warp_reduce_<op>(t, min(E, 32))                 (xor-butterfly over groups of lanes)
    if E > 32:                                          (several warps: through shared memory)
        if (tx % 32 == 0) red[.., tx / 32] = t
        __syncthreads()
        t = warp_reduce_<op>(tx % W < E/32 ? red[.., tx % W] : identity, W)
        __syncthreads()
    buf[...] = t   (or combine(buf, t) when the init was decomposed; only tx == 0 stores non-local buffers)

so every participating thread ends with the full result (an all-reduce): a local result buffer needs
no broadcast. The extent ``E`` must be the block's x size, a power of two up to 32 or a multiple of 32;
other thread axes (rows of a block on ``threadIdx.y``) index the shared buffer.

:func:`finish` double-buffers annotated loops or turns them into cp.async rings
(``compiler.backends.cuda.pipeline``), guards stores to
shared/global memory made outside a loop of a used thread axis (they run on thread 0 of that axis, as an
extent-1 thread loop), inserts ``__syncthreads()`` between statements that communicate through shared memory
(``compiler.backends.cuda.sync``: only at points all threads reach), and records the launch shape.
"""

from __future__ import annotations

import copy

from compiler.backends.cuda.pipeline import cp_async_pipeline, double_buffer
from compiler.backends.cuda.sync import insert_barriers, is_thread_axis
from compiler.errors import CompileError
from compiler.loopir import analysis as A
from compiler.loopir.expr import (
    Binary,
    Call,
    Compare,
    Const,
    Expr,
    IterVar,
    Load,
    Var,
    combine,
    conjuncts,
    const,
    free_vars,
    lanes_of,
    loads,
    logical_and,
    reduce_identity,
    select,
    substitute,
)
from compiler.loopir.lower import THREAD_LOOPS_PREPARED, lower_func
from compiler.loopir.simplify import affine_bound, simplify, to_affine
from compiler.loopir.stmt import (
    Allocate,
    Barrier,
    Block,
    Buffer,
    BufferStore,
    For,
    IfThenElse,
    PrimFunc,
    SeqStmt,
    Stmt,
    seq,
    stmt_children,
    stmt_exprs,
    walk_stmts,
)
from compiler.loopir.visitor import (
    StmtExprVisitor,
    StmtMutator,
    StmtVisitor,
    map_stores,
    rewrite_exprs,
)

__all__ = [
    "finish",
    "lower_gpu_func",
    "is_thread_axis",
    "kernel_parts",
    "launch_info",
    "prepare",
    "stmt_exprs",
    "thread_dims",
    "unify_thread_vars",
]

AXES = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z")
VAR_NAMES = {"blockIdx.x": "bx", "blockIdx.y": "by", "blockIdx.z": "bz"} | {
    "threadIdx.x": "tx",
    "threadIdx.y": "ty",
    "threadIdx.z": "tz",
}
WARP = 32
SMEM_PAD = "smem_pad"  # func.attrs key: shared buffer name -> floats of padding per row (pad_shared)
SMEM_SWIZZLE = "smem_swizzle"  # func.attrs key: shared buffer name -> (k group, step) (swizzle_shared)
SWIZZLE_CHUNK = 4  # floats moved together by swizzle_shared (a float4 read of the tile stays one)
_COMBINER_OF = {"+": "sum", "max": "max", "min": "min"}


def _nests(root: Block) -> list[Stmt]:
    return list(root.body.stmts) if isinstance(root.body, SeqStmt) else [root.body]


def lower_gpu_func(func: PrimFunc, unroll: bool = True) -> PrimFunc:
    """A new, block-free CUDA function equivalent to the scheduled ``func`` (left untouched): thread axes
    unified and cross-thread reductions rewritten (:func:`prepare`), the shared lowering
    (``compiler.loopir.lower_func``; ``unroll=False`` keeps unrolled loops as loops), then store guards,
    double buffering, barriers and the launch shape (:func:`finish`). A function without thread-bound
    loops is lowered as on any target."""
    if not isinstance(func.body, Block):
        return func
    if not any(isinstance(s, For) and s.kind == "thread" for s in walk_stmts(func.body)):
        return lower_func(func, unroll)
    prepared = prepare(func)
    dropped = drop_all_register_guards(prepared.body)
    low = lower_func(prepared, unroll)
    if dropped and not register_accesses_in_bounds(low.body):
        # a tile compacted to its whole extent: the dropped guards kept its reads in bounds
        low = lower_func(prepare(func), unroll)
    return finish(low)


# ======================================================================= prepare
def prepare(func: PrimFunc) -> PrimFunc:
    """A copy of the block-level ``func`` with unified thread variables and cross-thread reductions
    rewritten into warp/block all-reduce code (marked as prepared for ``lower_func``)."""
    func = copy.deepcopy(func)
    func.attrs[THREAD_LOOPS_PREPARED] = True
    root = func.body
    assert isinstance(root, Block)
    for nest in _nests(root):
        dims, canon = unify_thread_vars(nest, func.name)
        for b in [*([nest] if isinstance(nest, Block) else []), *A.blocks_under(nest)]:
            if b.is_reduction:
                _lower_cross_thread(root, b, dims, canon, func.name)
    return func


def drop_all_register_guards(root: Block) -> int:
    """:func:`drop_register_guards` on every block under ``root`` (in place); how many conjuncts went."""
    parents = A.parent_map(root)  # dropping conjuncts edits predicates only, never the tree
    return sum(drop_register_guards(root, b, parents) for b in A.blocks_under(root))


def register_accesses_in_bounds(body: Stmt) -> bool:
    """Every read of a shared or local buffer and every store to a local one in ``body`` (lowered, buffers
    compacted) stays inside the buffer for all values of the enclosing loops, whatever the guards say."""

    def inside(buf: Buffer, idx: tuple[Expr, ...], lanes: int, ranges: dict) -> bool:
        for d, (i, size) in enumerate(zip(idx, buf.shape)):
            try:
                r = affine_bound(to_affine(simplify(i, ranges), ranges), ranges)
            except CompileError:
                return False
            last = lanes - 1 if d == len(buf.shape) - 1 else 0
            if r is None or r[0] < 0 or r[1] + last >= size:
                return False
        return True

    def visit(s: Stmt, ranges: dict) -> bool:
        reads = [ld for e in stmt_exprs(s) for ld in loads(e) if ld.buffer.scope in ("shared", "local")]
        if not all(inside(ld.buffer, ld.indices, ld.lanes, ranges) for ld in reads):
            return False
        if (
            isinstance(s, BufferStore)
            and s.buffer.scope == "local"
            and not inside(s.buffer, s.indices, lanes_of(s.value.dtype), ranges)
        ):
            return False
        if isinstance(s, For):
            ranges = {**ranges, s.var: (0, s.extent - 1)}
        return all(visit(c, ranges) for c in stmt_children(s))

    return visit(body, {})


def drop_register_guards(root: Block, b: Block, parents: dict[int, Stmt] | None = None) -> int:
    """Drop the conjuncts of ``b``'s predicate that only bound its spatial iteration (a partial tile's
    rows and columns past the output) when ``b`` only computes in registers: its stores go to ``local``
    buffers and its loads read ``local`` or ``shared`` buffers (the tiles, sized for the whole tile), so an
    out-of-range point computes a value no one stores (the block that writes the output keeps its guard).
    A conjunct that involves a reduction variable stays (a K tail must not accumulate), and so does one
    whose tile is wider than the whole extent it bounds (``e < B`` where ``e`` spans more than ``B`` values
    within one thread block: the tiles are then compacted to the extent, and the unguarded reads would
    leave them). Returns how many conjuncts were dropped.

    Why: a guarded register tile puts ``tm`` branches, each reloading its operands from shared memory,
    into the inner loop of every block, not only the edge ones; on the H200 such GEMMs ran 3-10x slower
    than with whole tiles (docs/cuda.md)."""
    if b.predicate is None or b.alloc_buffers:
        return 0
    stmts = [x for part in (b.body, b.init) if part is not None for x in walk_stmts(part)]
    if not all(isinstance(x, (BufferStore, SeqStmt)) for x in stmts):
        return 0
    stores = [x for x in stmts if isinstance(x, BufferStore)]
    if not stores or any(st.buffer.scope != "local" for st in stores):
        return 0
    reads = [ld for st in stores for e in (st.value, *st.indices) for ld in loads(e)]
    if any(ld.buffer.scope not in ("local", "shared") for ld in reads):
        return 0
    spatial: set[Var] = set()
    reduce_: set[Var] = set()
    for iv, e in zip(b.iter_vars, b.bindings):
        (reduce_ if iv.kind == "R" else spatial).update(free_vars(e))
    bind = dict(zip((iv.var for iv in b.iter_vars), b.bindings))
    loops = [s for s in A.ancestors(root, b, parents) if isinstance(s, For)]
    # one thread block's ranges: its blockIdx loops fixed at 0, every other loop over its extent
    ranges = {
        lp.var: (0, 0 if (lp.thread or "").startswith("blockIdx") else lp.extent - 1) for lp in loops
    }
    keep = []
    for c in conjuncts(b.predicate):
        c_bound = substitute(c, bind)
        used = free_vars(c_bound)
        if used & reduce_ or not used <= spatial or not _tile_within(c_bound, ranges):
            keep.append(c)
    dropped = len(conjuncts(b.predicate)) - len(keep)
    b.predicate = logical_and(*keep) if keep else None
    return dropped


def _tile_within(c: Expr, ranges: dict[Var, tuple[int, int]]) -> bool:
    """``c`` is ``e < B`` (a constant B) and ``e`` takes at most ``B`` values within one thread block."""
    if not (isinstance(c, Compare) and c.op == "<" and isinstance(c.b, Const)):
        return False
    try:
        r = affine_bound(to_affine(c.a, ranges), ranges)
    except CompileError:
        return False
    return r is not None and r[1] - r[0] + 1 <= int(c.b.value)


def unify_thread_vars(nest: Stmt, fname: str = "?") -> tuple[dict[str, int], dict[str, Var]]:
    """Give every loop bound to one axis the same variable; returns (axis -> largest extent, axis -> var).
    Raises CompileError for a loop nested in a loop bound to the same axis."""
    canon: dict[str, Var] = {}
    dims: dict[str, int] = {}
    mapping: dict[Var, Expr] = {}

    class Unify(StmtVisitor):
        active: frozenset[str] = frozenset()

        def visit_For(self, s: For) -> None:
            if s.kind != "thread":
                self.generic_visit_stmt(s)
                return
            tag = s.thread or ""
            if tag not in AXES:
                raise CompileError(f"kernel {fname}: loop {s.var.name} is bound to unknown axis {tag!r}")
            if tag in self.active:
                raise CompileError(
                    f"kernel {fname}: loop {s.var.name} is bound to {tag} inside another loop bound to {tag}"
                )
            var = canon.setdefault(tag, Var(VAR_NAMES[tag]))
            if s.var is not var:
                mapping[s.var] = var
                s.var = var  # in place: ``prepare`` works on its own copy of the function
            dims[tag] = max(dims.get(tag, 1), s.extent)
            outer, self.active = self.active, self.active | {tag}
            self.generic_visit_stmt(s)
            self.active = outer

    Unify().visit_stmt(nest)
    for b in [*([nest] if isinstance(nest, Block) else []), *A.blocks_under(nest)]:
        b.bindings = [substitute(e, mapping) for e in b.bindings]
        if b.predicate is not None:
            b.predicate = substitute(b.predicate, mapping)
    return dims, canon


def _lower_cross_thread(
    root: Block, b: Block, dims: dict[str, int], canon: dict[str, Var], fname: str
) -> None:
    thread_vars = {v: tag for tag, v in canon.items() if is_thread_axis(tag)}
    r_ivs = [(iv, e) for iv, e in zip(b.iter_vars, b.bindings) if iv.kind == "R"]
    crossing = [(iv, e) for iv, e in r_ivs if free_vars(e) & thread_vars.keys()]
    if not crossing:
        return
    where = f"kernel {fname}, block {b.name}"
    if len(crossing) != len(r_ivs) or any(free_vars(e) - thread_vars.keys() for _, e in crossing):
        raise CompileError(
            f"{where}: a reduction over thread-bound and serial loops at once is not supported; "
            "rfactor the thread-bound loop first"
        )
    if len(crossing) != 1 or crossing[0][1] is not canon.get("threadIdx.x"):
        raise CompileError(
            f"{where}: a cross-thread reduction must reduce over exactly one loop bound to threadIdx.x"
        )
    tx = canon["threadIdx.x"]
    loops = [s for s in A.ancestors(root, b) if isinstance(s, For)]
    own = next(lp for lp in loops if lp.var is tx)
    ext, dx = own.extent, dims["threadIdx.x"]
    if ext != dx:
        raise CompileError(
            f"{where}: the cross-thread reduction runs over {ext} threads but the block has {dx} threads on "
            "threadIdx.x; every threadIdx.x loop of this kernel must have the same extent"
        )
    if not (ext <= WARP and ext & (ext - 1) == 0) and ext % WARP:
        raise CompileError(
            f"{where}: {ext} threads: a cross-thread reduction needs a power of two up to 32 "
            "or a multiple of 32"
        )
    others = []
    for tag in ("threadIdx.z", "threadIdx.y"):
        if dims.get(tag, 1) > 1:
            lp = next((x for x in loops if x.thread == tag), None)
            if lp is None or lp.extent != dims[tag]:
                raise CompileError(f"{where}: the reduction must lie inside a full loop bound to {tag}")
            others.append((lp.var, dims[tag]))
    if any(lp.kind == "thread" and lp.extent != dims.get(lp.thread or "", lp.extent) for lp in loops):
        raise CompileError(f"{where}: a cross-thread reduction cannot run inside a partial thread loop")
    st = b.body
    if not (
        isinstance(st, BufferStore)
        and isinstance(st.value, Binary)
        and st.value.op in _COMBINER_OF
        and isinstance(st.value.a, Load)
        and st.value.a.buffer is st.buffer
    ):
        raise CompileError(f"{where}: a cross-thread reduction must be a plain sum/max/min")
    comb, src, buf, idx = _COMBINER_OF[st.value.op], st.value.b, st.buffer, st.indices
    dtype = buf.dtype
    if dtype not in ("float32", "float64", "int32", "float16", "bfloat16"):
        raise CompileError(
            f"{where}: cross-thread reductions support float32/float64/int32/float16/bfloat16, not {dtype}"
        )
    ident = reduce_identity(comb, dtype)
    t = Buffer(f"{buf.name}_red", (1,), dtype, "local")
    zero = (const(0),)
    cur = Load(t, zero)
    conj = conjuncts(b.predicate) if b.predicate is not None else []
    value = select(logical_and(*conj), src, ident) if conj else src
    stmts: list[Stmt] = [
        BufferStore(t, zero, value),
        BufferStore(t, zero, _warp(comb, cur, min(ext, WARP))),
    ]
    new_allocs = [t]
    if ext > WARP:
        nw = ext // WARP
        width = 1 << (nw - 1).bit_length()
        shared = Buffer(f"{buf.name}_warps", (*(n for _, n in others), nw), dtype, "shared")
        lead = tuple(v for v, _ in others)
        lane = tx % WARP
        stmts.append(IfThenElse(lane.eq(0), BufferStore(shared, (*lead, tx // WARP), cur)))
        stmts.append(Barrier())
        slot = tx % width
        part: Expr = Load(shared, (*lead, slot))
        if width != nw:
            part = select(slot.lt(nw), part, ident)
        stmts.append(BufferStore(t, zero, _warp(comb, part, width)))
        stmts.append(Barrier())
        new_allocs.append(shared)
    final = cur if b.init is not None else combine(comb, Load(buf, idx), cur)
    guard = [c for c in conj if tx not in free_vars(c)]
    if buf.scope != "local":
        guard.append(tx.eq(0))
    store: Stmt = BufferStore(buf, idx, final)
    stmts.append(IfThenElse(logical_and(*guard), store) if guard else store)
    new = Block(
        b.name,
        [IterVar(iv.var, iv.extent, "S") for iv in b.iter_vars],
        list(b.bindings),
        seq(*stmts),
        None,
        None,
        list(b.alloc_buffers),
        {**b.annotations, "cross_thread": comb},
    )
    A.replace_child(A.parent_map(root)[id(b)], b, new)
    root.alloc_buffers.extend(new_allocs)


def _warp(comb: str, value: Expr, width: int) -> Expr:
    return Call(f"warp_reduce_{comb}", (value, const(width)), value.dtype)


# ======================================================================== finish
def kernel_parts(body: Stmt) -> list[Stmt]:
    """The kernels of a lowered GPU function body: each top-level statement, wrapped in the
    function-level allocations it uses."""
    allocs: list[Buffer] = []
    s = body
    while isinstance(s, Allocate):
        allocs.append(s.buffer)
        s = s.body
    stmts = s.stmts if isinstance(s, SeqStmt) else [s]
    parts = []
    for x in stmts:
        used = _buffers_used(x)
        for buf in reversed(allocs):
            if buf.uid in used:
                x = Allocate(buf, x)
        parts.append(x)
    return parts


def _buffers_used(s: Stmt) -> set[int]:
    """Uids of the buffers loaded or stored under ``s``."""
    out: set[int] = set()

    class Used(StmtExprVisitor):
        def visit_Load(self, e: Load) -> None:
            out.add(e.buffer.uid)
            self.generic_visit_expr(e)

        def visit_BufferStore(self, x: BufferStore) -> None:
            out.add(x.buffer.uid)
            self.generic_visit_stmt(x)

    Used().visit_stmt(s)
    return out


def finish(func: PrimFunc) -> PrimFunc:
    """Pad the shared tiles ``func.attrs[SMEM_PAD]`` names (:func:`pad_shared`), double-buffer or build the
    cp.async rings, guard
    single-thread stores, insert barriers and record the launch shape of every kernel."""
    parts = []
    for part in kernel_parts(func.body):
        dims = thread_dims(part)
        if not any(tag.startswith("blockIdx") for tag in dims):  # one block: a grid of extent 1
            part = For(Var("bx"), 1, part, "thread", "blockIdx.x")
        part = pad_shared(part, func.attrs.get(SMEM_PAD, {}))
        part = swizzle_shared(part, func.attrs.get(SMEM_SWIZZLE, {}))
        part = double_buffer(part)
        part = cp_async_pipeline(part)
        part = _GuardStores(dims).visit_stmt(part)
        part = insert_barriers(part, dims)
        parts.append(part)
    body = seq(*parts) if len(parts) > 1 else parts[0]
    attrs = {k: v for k, v in func.attrs.items() if k != THREAD_LOOPS_PREPARED}
    out = PrimFunc(func.name, func.params, body, func.num_inputs, attrs)
    launches = [launch_info(p) for p in parts]
    out.attrs["launches"] = launches
    out.attrs["launch"] = launches[0]
    return out


def pad_shared(part: Stmt, pads: dict[str, int]) -> Stmt:
    """Widen the last axis of each shared allocation named in ``pads`` (``func.attrs[SMEM_PAD]``: name ->
    floats) by that many unused elements: the rows of a transposed tile then start in other banks. The
    compacted buffer is changed in place (the lowered function owns it); accesses keep their indices."""
    if not pads:
        return part
    for s in walk_stmts(part):
        if isinstance(s, Allocate) and s.buffer.scope == "shared" and s.buffer.name in pads:
            *lead, last = s.buffer.shape
            s.buffer.shape = (*lead, last + int(pads[s.buffer.name]))
    return part


def swizzle_shared(part: Stmt, swizzles: dict[str, tuple[int, int]]) -> Stmt:
    """Rotate the 4-float chunks of each row of the shared tiles named in ``swizzles`` (name -> (g, s)):
    element ``[.., k, m]`` is stored at ``[.., k, m']`` with chunk ``m' // 4 = (m // 4 + (k // g) * s)
    % (M / 4)`` and ``m' % 4 = m % 4``, in every load and store, so a warp storing one column of a
    transposed tile (several k, the same few m) spreads over the banks; a row stays a permutation of
    whole chunks (float4 reads of the register tile stay aligned). The loop IR has no XOR: this rotation
    is the XOR swizzle's conflict-free counterpart for these store patterns."""
    if not swizzles:
        return part
    tiles = {  # a row that is not whole chunks (a compacted edge tile) keeps its layout
        s.buffer
        for s in walk_stmts(part)
        if isinstance(s, Allocate)
        and s.buffer.scope == "shared"
        and s.buffer.name in swizzles
        and len(s.buffer.shape) >= 2
        and s.buffer.shape[-1] % SWIZZLE_CHUNK == 0
    }
    if not tiles:
        return part

    def moved(buf: Buffer, indices: tuple[Expr, ...]) -> tuple[Expr, ...]:
        g, step = swizzles[buf.name]
        chunks = buf.shape[-1] // SWIZZLE_CHUNK
        *lead, k, m = indices
        chunk = (m // SWIZZLE_CHUNK + (k // g) * step) % chunks
        return (*lead, k, chunk * SWIZZLE_CHUNK + m % SWIZZLE_CHUNK)

    def load(e: Expr) -> Expr | None:
        if isinstance(e, Load) and e.buffer in tiles:
            return Load(e.buffer, moved(e.buffer, e.indices), e.lanes)
        return None

    def store(s: BufferStore) -> Stmt:
        return BufferStore(s.buffer, moved(s.buffer, s.indices), s.value) if s.buffer in tiles else s

    return map_stores(rewrite_exprs(part, load), store)


def thread_dims(s: Stmt) -> dict[str, int]:
    """Axis -> largest extent of the loops bound to it under ``s``."""
    dims: dict[str, int] = {}
    for x in walk_stmts(s):
        if isinstance(x, For) and x.kind == "thread" and x.thread:
            dims[x.thread] = max(dims.get(x.thread, 1), x.extent)
    return dims


def launch_info(part: Stmt) -> dict:
    """Grid, block and static shared-memory bytes of one kernel."""
    dims = thread_dims(part)
    grid = [dims.get(f"blockIdx.{a}", 1) for a in "xyz"]
    block = [dims.get(f"threadIdx.{a}", 1) for a in "xyz"]
    shared = sum(
        _align(x.buffer.nbytes, 16)
        for x in walk_stmts(part)
        if isinstance(x, Allocate) and x.buffer.scope == "shared"
    )
    return {"grid": grid, "block": block, "shared_bytes": shared}


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


class _GuardStores(StmtMutator):
    """Stores to shared/global memory outside a loop of a used thread axis run on thread 0 of it."""

    def __init__(self, dims: dict[str, int]) -> None:
        self.dims = dims
        self.inside: frozenset[str] = frozenset()

    def visit_BufferStore(self, s: BufferStore) -> Stmt:
        if s.buffer.scope == "local":
            return s
        out: Stmt = s
        for tag in ("threadIdx.x", "threadIdx.y", "threadIdx.z"):
            if self.dims.get(tag, 1) > 1 and tag not in self.inside:
                out = For(Var(f"{VAR_NAMES[tag]}0"), 1, out, "thread", tag)
        return out

    def visit_For(self, s: For) -> Stmt:
        outer = self.inside
        if s.kind == "thread" and s.thread:
            self.inside = outer | {s.thread}
        try:
            return self.generic_visit_stmt(s)
        finally:
            self.inside = outer
