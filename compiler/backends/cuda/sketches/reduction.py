"""The CUDA reduction sketch: one kernel per group, one thread block per ``rows_per_block``
rows (softmax, layer_norm, rms_norm, row sums and means ...), the design's "softmax on the GPU" example.

Row form (reduced axes trailing), knobs ``threads_per_row`` (T), ``rows_per_block`` (R), ``vector`` (V),
``keep_row``, ``unroll`` (U)::

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
otherwise the row is re-read (from L1/L2) by each pass. Reductions that are not over trailing axes run one
output element per thread with serial reductions.
"""

from __future__ import annotations

import math

from compiler.backends import group_analysis as G
from compiler.backends.cuda.sketches.common import (
    is_param,
    localize,
    share_cache,
    thread_per_element,
)
from compiler.backends.sketch import Config, Knob, Sketch, fuse_loops, output_blocks, prepare
from compiler.errors import ScheduleError
from compiler.fusion import Group, category
from compiler.loopir import analysis as A
from compiler.loopir.schedule import Schedule
from compiler.loopir.stmt import Block, For
from compiler.target import Target

MAX_ROW_REGISTERS = 64  # floats of the row one thread may keep in registers
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
    version = 1
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
            Knob("vector", (1, 2, 4), "vector width of row loads (float2/float4)"),
            Knob("keep_row", ("registers", "reread"), "keep the row in registers or re-read it"),
            Knob("unroll", (1, 4, 8), "unroll of the per-thread loop"),
        ]

    def check_combination(self, group: Group, config: Config, target: Target) -> None:
        if config["threads_per_row"] * config["rows_per_block"] > target.max_threads_per_block:
            raise ScheduleError("reduction: threads_per_row * rows_per_block exceeds the block size limit")
        n = G.row_length(group)
        if n % config["vector"]:
            raise ScheduleError(f"reduction: vector {config['vector']} does not divide the row {n}")

    def default(self, group: Group, target: Target) -> Config:
        n = G.row_length(group)
        return {
            "threads_per_row": 32 if n <= 256 else 128 if n <= 2048 else 256,
            "rows_per_block": 1,
            "vector": 4 if n % 4 == 0 else 1,
            "keep_row": "registers",
            "unroll": 1,
        }

    def build(self, group: Group, config: Config, target: Target) -> Schedule:
        self.check(group, config, target)
        sch, _ = prepare(group)
        outs = output_blocks(sch)
        main = outs[-1]
        for b in outs[:-1]:
            if not G.reaches(sch, b, main):
                raise ScheduleError(
                    f"reduction (cuda): output {A.writes(b)[0].name} does not feed the last output"
                )
        shape, axes = G.reduce_info(group)
        spatial = sch.get_loops(main)[: G.n_spatial(main)]
        if not G.row_form(group):
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
        t, rpb, v, u = config["threads_per_row"], config["rows_per_block"], config["vector"], config["unroll"]
        steps = -(-G.row_length(group) // (t * v))
        registers = config["keep_row"] == "registers" and steps * v <= MAX_ROW_REGISTERS and steps <= 32
        rb, ry = sch.split(row, [None, rpb])
        sch.bind(rb, "blockIdx.x")
        if rpb > 1:
            sch.bind(ry, "threadIdx.y")
        if registers:
            _keep_row(sch, ry, tuple(shape), t, v)
        for b in [b for b in sch.blocks() if b.is_reduction]:
            _cross_thread(sch, b, ry, t, v, u, registers)
        if col is not None:
            _, step, lane = _map_cols(sch, col, t, v)
            if v > 1:
                sch.vectorize(lane)
            _steps(sch, step, u, registers)
        localize(sch)
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


def _keep_row(sch: Schedule, row: For, shape: tuple[int, ...], t: int, v: int) -> None:
    """Load the row input once into registers: one local copy laid out [.., T, C, V] (a [C, V] tile per
    thread after compaction), read by every reduction and the epilogue."""
    readers: dict[int, list[Block]] = {}
    for b in sch.blocks():
        for r in A.reads(b):
            if is_param(sch, r) and r.shape == shape:
                readers.setdefault(r.uid, []).append(b)
    if not readers:
        return
    users = max(readers.values(), key=len)
    src = next(r for r in A.reads(users[0]) if r.uid in readers and readers[r.uid] is users)
    copy = sch.cache_read(users[0], src, "local")
    share_cache(sch, copy, src, users[1:])
    sch.compute_at(copy, row)
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
