"""Helpers shared by the CUDA sketches (pointwise, reduction, contraction): thread mappings of a loop,
cooperative copies, per-thread scopes.

Every helper is written with the schedule primitives; none emits code."""

from __future__ import annotations

from compiler import dtypes
from compiler.errors import ScheduleError
from compiler.fusion import Group
from compiler.loopir import analysis as A
from compiler.loopir.expr import Call, Expr, Load, replace_buffer_loads, transform
from compiler.loopir.schedule import Schedule
from compiler.loopir.stmt import Block, Buffer, BufferStore, For, walk_stmts

FAST_MATH = {"exp": "fast_exp", "log": "fast_log"}  # float32 intrinsic -> its fast-math form


def narrow_memory(group: Group) -> bool:
    """Whether every tensor ``group`` reads or writes is a 16-bit float (float16 / bfloat16)."""
    values = [*group.inputs, *group.outputs]
    return bool(values) and all(v.dtype in dtypes.NARROW_FLOATS for v in values)


def vector_widths(group: Group) -> tuple[int, ...]:
    """The ``vector`` knob's values: up to 4 lanes (float4 = 16 bytes), up to 8 for 16-bit float groups
    (8 halves = 16 bytes: one ``uint4`` access)."""
    return (1, 2, 4, 8) if narrow_memory(group) else (1, 2, 4)


def block_threads(cap: int, extent: int) -> int:
    """Threads per block for a loop of ``extent`` elements: ``cap``, but no more than the next power of
    two of the extent, and at least one warp."""
    return min(cap, max(32, 1 << (extent - 1).bit_length()))


def thread_per_element(sch: Schedule, spatial: list[For], cap: int, what: str) -> For:
    """One output element per thread: fuse the ``spatial`` loops and split them over a grid of blocks of
    at most ``cap`` threads (blockIdx.x, threadIdx.x). Returns the threadIdx.x loop. With no loop to
    spread, raises ScheduleError "<what> has no CUDA schedule"."""
    if not spatial:
        raise ScheduleError(f"{what} has no CUDA schedule")
    f = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    bx, tx = sch.split(f, [None, block_threads(cap, f.extent)])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    return tx


def cooperative(sch: Schedule, block: Block, at: For, threads_y: int, threads_x: int, vector: int) -> None:
    """Spread the loops of a copy block inside ``at`` over all ``threads_y x threads_x`` threads of the
    block (fuse them, then [ty, tx, steps, lane]); ``vector`` consecutive elements per thread and step."""
    loops = sch.get_loops(block)
    own = loops[loops.index(at) + 1 :]
    if not own:
        return
    f = sch.fuse(*own) if len(own) > 1 else own[0]
    v = vector if f.extent % vector == 0 else 1
    outer, lane = sch.split(f, [None, v])
    steps, ty, tx = sch.split(outer, [None, threads_y, threads_x])
    sch.reorder(ty, tx, steps)
    if threads_y > 1:
        sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    if v > 1:
        sch.vectorize(lane)
    if 1 < steps.extent <= 8:
        sch.unroll(steps)


def share_cache(sch: Schedule, cache_block: Block, src: Buffer, consumers: list[Block]) -> None:
    """Make ``consumers`` read the cache that ``cache_read`` made for another consumer of ``src``
    (cache_read for several consumers: one copy, read by all of them). The copy block runs before
    every consumer (program order), so the values are the same."""
    cache = A.writes(cache_block)[0]
    order = {id(b): k for k, b in enumerate(sch.blocks())}
    for b in consumers:
        if order[id(b)] < order[id(cache_block)]:
            raise ScheduleError(f"share_cache: block {b.name} runs before the copy of {src.name}")
        for s in walk_stmts(b):
            if isinstance(s, BufferStore):
                s.value = replace_buffer_loads(
                    s.value, lambda ld: Load(cache, ld.indices) if ld.buffer is src else None
                )
    sch._log(f"share_cache({cache.name}, {', '.join(b.name for b in consumers)})")


def localize(sch: Schedule, keep_global: set[int] | None = None) -> None:
    """Every intermediate buffer not placed in shared memory lives in registers/local memory."""
    keep = keep_global or set()
    for buf in sch.root.alloc_buffers:
        if buf.scope == "global" and buf.uid not in keep:
            sch.set_scope(buf, "local")


def is_param(sch: Schedule, buf: Buffer) -> bool:
    return any(p is buf for p in sch.func.params)


def use_fast_math(sch: Schedule) -> None:
    """Every float32 ``exp``/``log`` of the scheduled function becomes ``fast_exp``/``fast_log`` (printed
    ``__expf``/``__logf``; the SIMT interpreter evaluates them with the hardware's error model)."""

    def fast(e: Expr) -> Expr | None:
        if isinstance(e, Call) and e.dtype == "float32" and e.name in FAST_MATH:
            return Call(FAST_MATH[e.name], e.args, e.dtype)
        return None

    for b in sch.blocks():
        for s in walk_stmts(b):
            if isinstance(s, BufferStore):
                s.value = transform(s.value, fast)
    sch._log("use_fast_math()")
