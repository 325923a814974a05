"""The CUDA reduction sketch: one kernel per group, one thread block per ``rows_per_block``
rows (softmax, layer_norm, rms_norm, row sums and means ...), the design's "softmax on the GPU" example.

Row form (reduced axes trailing), knobs ``threads_per_row`` (T), ``rows_per_block`` (R), ``vector`` (V),
``keep_row``, ``unroll`` (U), ``fast_math``::

    blockIdx.x rb                                   rows rb*R .. rb*R+R-1
      threadIdx.y ry                                one row per y (when R > 1)
        threadIdx.x tx: [keep_row=registers] x_local[c][v] = x[row, (c*T + tx)*V + v]   (float4 loads)
        for each reduction:                         rfactor over tx
          threadIdx.x tx: part = identity; for c, v: part = op(part, f(x[row, (c*T + tx)*V + v]))
          threadIdx.x tx (cross-thread): red = all-reduce(part)     (warp shuffles + shared memory)
        threadIdx.x tx: for c, v: out[row, (c*T + tx)*V + v] = epilogue(x, red...)

Every thread ends a reduction with the row's value in a register (an all-reduce), so the epilogue and
later reductions read it without another barrier. ``keep_row=registers`` reads the row from global
memory once into C*V registers per thread (C = ceil(N / (T*V))); it is used when C*V <= 64 and C <= 32,
otherwise the row is re-read (from L1/L2) by each pass. ``keep_row=shared`` stages the block's rows in
shared memory (R*N*4 bytes, up to the opt-in limit) with the same thread mapping, so long rows are read
from global memory once. The default widens T (up to 1024) until a thread keeps at most 32 floats of the
row in registers, and uses shared memory past that; a float32 softmax row too long for both takes
``keep_row=online`` (``online_softmax.py``: a single pass keeps a running max and a rescaled sum, then
one pass normalizes: two reads of the row instead of three). 16-bit float groups may take ``vector=8``
(16-byte row loads). Reductions that are not over trailing axes run one
output element per thread with serial reductions.

Memory-bound details (every config):

* exp once: with the row in registers, an intermediate that calls a transcendental (softmax's
  ``exp(x - max)``) and is read both by a reduction and by a later stage is kept (not inlined) as a second
  ``[C][V]`` register tile, so ``exp`` runs once per element instead of once per reader;
* multiply by the reciprocal: a division whose divisor is row-constant (computed from reduction results
  only: softmax's ``/ sum``, layer_norm's ``/ sqrt(var + eps)``) becomes ``* recip(divisor)``; the
  reciprocal is one expression per row that nvcc hoists (``x * (1/s)`` differs from ``x / s`` by at most
  one rounding, 2^-23 relative);
* ``fast_math=1`` turns float32 ``exp``/``log`` into the ``fast_exp``/``fast_log`` intrinsics (printed
  ``__expf``/``__logf``); the SIMT interpreter evaluates them with the hardware's error model, so the
  property tests check the accuracy of such schedules against the numpy reference (docs/cuda.md).
"""

from __future__ import annotations

import math

from compiler import dtypes
from compiler.backends import group_analysis as G
from compiler.backends.cuda.sketches.common import (
    is_param,
    localize,
    narrow_memory,
    share_cache,
    thread_per_element,
    use_fast_math,
    vector_widths,
)
from compiler.backends.cuda.sketches.online_softmax import is_softmax, online_softmax
from compiler.backends.sketch import Config, Knob, Sketch, fuse_loops, output_blocks, prepare
from compiler.errors import ScheduleError
from compiler.fusion import Group, category
from compiler.loopir import analysis as A
from compiler.loopir.expr import Binary, Call, Expr, Load, call, transform, walk
from compiler.loopir.schedule import Schedule
from compiler.loopir.stmt import Block, BufferStore, For, walk_stmts
from compiler.target import Target

MAX_ROW_REGISTERS = 64  # floats of the row one thread may keep in registers
TRANSCENDENTAL = ("exp", "log", "tanh", "erf", "sigmoid")
NO_ROWS = "reduction (cuda): a reduction of every axis (no rows)"


def _exports_reduced_value(group: Group) -> bool:
    """Whether a group output is computed before (and read by) one of the group's reductions."""
    inside = {id(n): n for n in group.nodes}
    feeding: set[int] = set()
    stack = [v.producer for n in group.nodes if category(n) == "reduce" for v in n.inputs]
    while stack:
        p = stack.pop()
        if p is None or id(p) not in inside or id(p) in feeding:
            continue
        feeding.add(id(p))
        stack += [v.producer for v in p.inputs]
    return any(v.producer is not None and id(v.producer) in feeding for v in group.outputs)


class CudaReductionSketch(Sketch):
    """Reduction groups on the GPU: ``rows_per_block`` rows per thread block, a row's reductions spread
    over ``threads_per_row`` threads and all-reduced."""

    name = "reduction"
    version = 2
    kinds = ("reduction",)

    def applies(self, group: Group) -> bool:
        """Not for a group that also outputs a value its reductions read (a prologue value used outside the
        group, which only some fusion plans make): the row's threads would read each other's global writes
        with no barrier in between (the SIMT interpreter reports the race)."""
        return super().applies(group) and not _exports_reduced_value(group)

    def space(self, group: Group, target: Target) -> list[Knob]:
        return [
            Knob("threads_per_row", (32, 64, 128, 256, 512, 1024), "threads cooperating on one row"),
            Knob("rows_per_block", (1, 2, 4, 8), "rows handled by one thread block"),
            Knob(
                "vector",
                vector_widths(group),
                "vector width of row loads (float2/float4; 16-bit floats: 4, 8 or 16 bytes)",
            ),
            Knob(
                "keep_row",
                ("registers", "shared", "reread", "online"),
                "keep the row in registers, stage it in shared memory, re-read it, or (softmax) re-read it "
                "once after a single-pass running max and rescaled sum",
            ),
            Knob("unroll", (1, 4, 8), "unroll of the per-thread loop"),
            Knob("fast_math", (0, 1), "__expf/__logf intrinsics (1) or the exact expf/logf (0)"),
        ]

    def check_combination(self, group: Group, config: Config, target: Target) -> None:
        if config["threads_per_row"] * config["rows_per_block"] > target.max_threads_per_block:
            raise ScheduleError("reduction: threads_per_row * rows_per_block exceeds the block size limit")
        n = G.row_length(group)
        if n % config["vector"]:
            raise ScheduleError(f"reduction: vector {config['vector']} does not divide the row {n}")
        if config["keep_row"] == "online" and not (G.row_form(group) and is_softmax(group)):
            raise ScheduleError("reduction: keep_row=online is for float32 softmax rows only")
        if config["keep_row"] == "shared" and G.row_form(group):
            need = config["rows_per_block"] * n * 4
            if need > target.max_shared_bytes_optin:
                raise ScheduleError(
                    f"reduction: keep_row=shared needs {need} bytes of shared memory per block "
                    f"({config['rows_per_block']} rows of {n}), over {target.max_shared_bytes_optin}"
                )

    def default(self, group: Group, target: Target) -> Config:
        n = G.row_length(group)
        v = 4 if n % 4 == 0 else 1
        if narrow_memory(group) and n % 8 == 0 and n >= 256:
            v = 8  # 16-bit floats: 16-byte row loads
        t = 32 if n <= 256 else 128 if n <= 2048 else 256
        while t < target.max_threads_per_block and -(-n // (t * v)) * v > MAX_ROW_REGISTERS // 2:
            t *= 2  # long rows: more threads per row until each keeps at most 32 floats of it
        fits = -(-n // (t * v)) * v <= MAX_ROW_REGISTERS
        keep = "registers" if fits or n * 4 > target.max_shared_bytes_optin else "shared"
        if not fits and keep == "registers" and G.row_form(group) and is_softmax(group):
            keep = "online"  # a softmax row too long for registers and shared memory: read twice, not thrice
        return {
            "threads_per_row": t,
            "rows_per_block": 1,
            "vector": v,
            "keep_row": keep,
            "unroll": 1,
            "fast_math": 0,
        }

    def build(self, group: Group, config: Config, target: Target) -> Schedule:
        self.check(group, config, target)
        t, rpb, v, u = config["threads_per_row"], config["rows_per_block"], config["vector"], config["unroll"]
        row_form = G.row_form(group)
        steps = -(-G.row_length(group) // (t * v)) if row_form else 0
        registers = (
            row_form and config["keep_row"] == "registers" and steps * v <= MAX_ROW_REGISTERS and steps <= 32
        )
        sch, _ = prepare(group, keep=_shared_transcendental if registers else None)
        _reciprocal_of_row_constants(sch)
        if config["fast_math"]:
            use_fast_math(sch)
        outs = output_blocks(sch)
        main = outs[-1]
        for b in outs[:-1]:
            if not G.reaches(sch, b, main):
                raise ScheduleError(
                    f"reduction (cuda): output {A.writes(b)[0].name} does not feed the last output"
                )
        shape, axes = G.reduce_info(group)
        spatial = sch.get_loops(main)[: G.n_spatial(main)]
        if not row_form:
            return _per_element(sch, main, spatial, config)
        n_row = len(shape) - len(axes)
        full = (
            A.writes(main)[0].shape == tuple(shape) and len(spatial) == len(shape) and not main.is_reduction
        )
        row = fuse_loops(sch, spatial[:n_row] if full else spatial)
        if row is None:
            raise ScheduleError(f"{NO_ROWS} has no CUDA schedule")
        for b in reversed([b for b in sch.blocks() if b is not main]):
            if G.reaches(sch, b, main):
                sch.compute_at(b, row)
        col = fuse_loops(sch, spatial[n_row:] if full else [])
        rb, ry = sch.split(row, [None, rpb])
        sch.bind(rb, "blockIdx.x")
        if rpb > 1:
            sch.bind(ry, "threadIdx.y")
        shared = row_form and config["keep_row"] == "shared"
        kept = [
            b
            for b in sch.blocks()
            if b is not main and not b.is_reduction and not any(is_param(sch, w) for w in A.writes(b))
        ]
        if registers:
            _keep_row(sch, ry, tuple(shape), t, v)
            for b in kept:
                _thread_tile(sch, b, ry, t, v)
        elif shared:
            _keep_row(sch, ry, tuple(shape), t, v, "shared")
        reductions = [b for b in sch.blocks() if b.is_reduction]
        for b in reductions:
            _cross_thread(sch, b, ry, t, v, u, registers)
        if col is not None:
            _, step, lane = _map_cols(sch, col, t, v)
            if v > 1:
                sch.vectorize(lane)
            _steps(sch, step, u, registers)
        localize(sch)
        if config["keep_row"] == "online":
            online_softmax(sch, reductions[0].name, reductions[1].name)
        return sch


def _per_element(sch: Schedule, main: Block, spatial: list[For], config: Config) -> Schedule:
    """One output element per thread; the reductions run serially inside (non-trailing axes)."""
    cap = max(32, min(1024, config["threads_per_row"] * config["rows_per_block"]))
    tx = thread_per_element(sch, spatial, cap, NO_ROWS)
    for b in reversed([b for b in sch.blocks() if b is not main]):
        if G.reaches(sch, b, main):
            sch.compute_at(b, tx)
    if main.is_reduction and main.init is not None:
        rl = [lp for lp in sch.get_loops(main) if G.drives_reduce(main, lp)]
        if rl:
            sch.decompose_reduction(main, rl[0])
    localize(sch)
    return sch


def _steps(sch: Schedule, step: For, u: int, full: bool) -> None:
    """Unroll the per-thread step loop fully (registers: constant indices) or by ``u``."""
    if full:
        if step.extent > 1:
            sch.unroll(step)
        return
    if u > 1 and step.extent > 1:
        _, inner = sch.split(step, [None, u])
        sch.unroll(inner)


def _map_cols(sch: Schedule, loop: For, t: int, v: int) -> tuple[For, For, For]:
    """col = (step * T + tx) * V + lane; returns (tx, step, lane), tx outermost and bound to threadIdx.x
    (consecutive threads read consecutive vectors)."""
    chunk, lane = sch.split(loop, [None, v])
    step, tx = sch.split(chunk, [None, t])
    sch.reorder(tx, step)
    if not _drives_any_reduce(sch, tx):
        sch.bind(tx, "threadIdx.x")
    return tx, step, lane


def _drives_any_reduce(sch: Schedule, loop: For) -> bool:
    return any(G.drives_reduce(b, loop) for b in A.blocks_under(loop))


def _cross_thread(sch: Schedule, b: Block, row: For, t: int, v: int, u: int, registers: bool) -> None:
    """rfactor the row reduction of ``b`` over T threads, then all-reduce the partial results."""
    rloops = [lp for lp in sch.get_loops(b) if G.drives_reduce(b, lp)]
    k = sch.fuse(*rloops) if len(rloops) > 1 else rloops[0]
    tx, step, lane = _map_cols(sch, k, t, v)
    rf = sch.rfactor(tx)
    sch.bind(tx, "threadIdx.x")
    if v > 1:
        sch.unroll(lane)
    wb = sch.get_block(b.name)
    if sch.consumers(A.writes(wb)[0]):
        sch.compute_at(wb, row)
    else:
        sch.reverse_compute_at(wb, row)
    wb_loop = next(lp for lp in sch.get_loops(wb) if G.drives_reduce(wb, lp))
    sch.bind(wb_loop, "threadIdx.x", allow_reduce=True)
    step_loop = next(lp for lp in sch.get_loops(rf) if lp.var is step.var)
    sch.decompose_reduction(rf, step_loop)
    _steps(sch, step_loop, u, registers)
    sch.set_scope(A.writes(rf)[0], "local")


def _keep_row(sch: Schedule, row: For, shape: tuple[int, ...], t: int, v: int, scope: str = "local") -> None:
    """Load the row input once into registers: one local copy laid out [.., T, C, V] (a [C, V] tile per
    thread after compaction), read by every reduction and the epilogue. ``scope="shared"``: one shared
    copy of the block's rows in their own layout, written and read by the same thread mapping (each
    thread reads back what it stored), so global memory is read once however long the row."""
    readers: dict[int, list[Block]] = {}
    for b in sch.blocks():
        for r in A.reads(b):
            if is_param(sch, r) and r.shape == shape:
                readers.setdefault(r.uid, []).append(b)
    if not readers:
        return
    users = max(readers.values(), key=len)
    src = next(r for r in A.reads(users[0]) if r.uid in readers and readers[r.uid] is users)
    copy = sch.cache_read(users[0], src, scope)
    share_cache(sch, copy, src, users[1:])
    sch.compute_at(copy, row)
    if scope == "local":
        _thread_tile(sch, copy, row, t, v)
        return
    loops = sch.get_loops(copy)
    own = loops[loops.index(row) + 1 :]
    if own:
        _, step, lane = _map_cols(sch, sch.fuse(*own) if len(own) > 1 else own[0], t, v)
        if v > 1:
            sch.vectorize(lane)
        _steps(sch, step, 4, False)


def _thread_tile(sch: Schedule, copy: Block, row: For, t: int, v: int) -> None:
    """Spread the column loops of ``copy`` (already inside ``row``) over the row's threads like every other
    stage (``col = (step*T + tx)*V + lane``) and lay its buffer out [.., T, C, V], so that each thread's
    part is a [C][V] tile with constant indices (registers after compaction)."""
    loops = sch.get_loops(copy)
    own = loops[loops.index(row) + 1 :]
    if not own:
        return
    col = sch.fuse(*own) if len(own) > 1 else own[0]
    n = col.extent
    _, step, lane = _map_cols(sch, col, t, v)
    if v > 1:
        sch.vectorize(lane)
    if step.extent > 1:
        sch.unroll(step)
    cache = A.writes(copy)[0]
    ncol = len(own)
    lead = cache.shape[: len(cache.shape) - ncol]
    if math.prod(cache.shape[len(lead) :]) != n:
        return
    steps = -(-n // (t * v))

    def index_map(*idx):
        flat = idx[len(lead)]
        for d in range(len(lead) + 1, len(idx)):
            flat = flat * cache.shape[d] + idx[d]
        return [*idx[: len(lead)], (flat // v) % t, flat // (t * v), flat % v]

    sch.transform_layout(cache, index_map, [*lead, t, steps, v])


def _shared_transcendental(sch: Schedule, b: Block) -> bool:
    """Keep (do not inline) an elementwise stage that calls a transcendental and is read by a reduction
    and by another stage: inlined, its ``exp`` would be computed once per reader."""
    calls = [x for s in A.block_stores(b) for x in walk(s.value) if isinstance(x, Call)]
    if not any(c.name in TRANSCENDENTAL for c in calls):
        return False
    readers = [c for w in A.writes(b) for c in sch.consumers(w)]
    return len(readers) >= 2 and any(c.is_reduction for c in readers)


def _reciprocal_of_row_constants(sch: Schedule) -> None:
    """``a / d`` -> ``a * recip(d)`` in every non-reduction stage where ``d`` reads only reduction results
    (a row constant): one reciprocal per row instead of one division per element."""
    reduced = {w.uid for b in sch.blocks() if b.is_reduction for w in A.writes(b)}

    def row_constant(d: Expr) -> bool:
        lds = [x for x in walk(d) if isinstance(x, Load)]
        return bool(lds) and all(ld.buffer.uid in reduced for ld in lds)

    def rewrite(e: Expr) -> Expr | None:
        if isinstance(e, Binary) and e.op == "/" and dtypes.is_float(e.dtype) and row_constant(e.b):
            return Binary("*", e.a, call("recip", e.b, dtype=e.dtype), e.dtype)
        return None

    for b in sch.blocks():
        if b.is_reduction:
            continue
        for s in walk_stmts(b):
            if isinstance(s, BufferStore):
                s.value = transform(s.value, rewrite)
