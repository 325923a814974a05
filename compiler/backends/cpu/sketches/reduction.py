"""The CPU reduction sketch: one or more reductions over the same rows with their prologue and epilogue
in one loop nest (softmax, layer_norm, rms_norm, pooling by mean ...).

Schedule ("row" form, reductions over trailing axes): fuse the row axes into one loop, compute every
reduction (and any kept intermediate) at that loop, vectorize each reduction with ``rfactor`` into
``accum`` x ``vector`` register accumulators, vectorize and unroll the elementwise epilogue, run rows in
parallel. Knobs: ``vector``, ``accum``, ``unroll``, ``keep`` (recompute an expensive shared intermediate
such as softmax's exp, or keep the row in a buffer), ``parallel``, ``div``, ``store`` (ordinary or
non-temporal stores of a full-size output: streaming stores skip reading the output's lines and leave the
input in the cache, which pays once input and output no longer fit in the last-level cache together).
Softmax's exps (every exp of the group takes x minus its own max) are computed as ``exp_le0``, the prelude's
cheaper exp for arguments that are never positive.
"""

from __future__ import annotations

import math

from compiler.backends import group_analysis as G
from compiler.backends.cpu.codegen import STREAM_FROM, STREAM_STORES
from compiler.backends.cpu.sketches.common import (
    EXPENSIVE,
    PARALLEL_MIN_WORK,
    nonpositive_exps,
    streams_pay,
    use_exp_le0,
)
from compiler.backends.sketch import Config, Knob, Sketch, fuse_loops, output_blocks, prepare
from compiler.dtypes import to_numpy
from compiler.errors import ScheduleError
from compiler.fusion import Group
from compiler.loopir import analysis as A
from compiler.loopir.expr import Binary, Call, Expr, free_vars, transform, walk
from compiler.loopir.fuse_siblings import FUSE_SIBLINGS
from compiler.loopir.lower import REDUCE_TREE
from compiler.loopir.schedule import Schedule
from compiler.loopir.stmt import Block, For
from compiler.target import Target


def _expensive(b: Block) -> bool:
    return any(
        isinstance(e, Call) and e.name in EXPENSIVE for st in A.block_stores(b) for e in walk(st.value)
    )


class CpuReductionSketch(Sketch):
    """Reduction groups on the CPU: rows in parallel, reductions in vector accumulators."""

    name = "reduction"
    version = 3  # 2: the store knob; 3: its split value
    kinds = ("reduction",)

    def space(self, group: Group, target: Target) -> list[Knob]:
        if not G.row_form(group):
            return [
                Knob("vector", (1,)),
                Knob("accum", (1,)),
                Knob("unroll", (1,)),
                Knob("keep", ("recompute",)),
                Knob("parallel", ("rows", "none")),
                Knob("div", ("exact",)),
                Knob("store", ("cached",)),
            ]
        lanes = target.vector_lanes_f32
        keep = ("recompute", "buffer") if _has_shared_expensive(group) else ("recompute",)
        return [
            Knob("vector", tuple(v for v in (1, 4, 8, 16) if v <= lanes), "SIMD lanes of row loops"),
            Knob("accum", (1, 2, 4), "independent vector accumulators per reduction"),
            Knob("unroll", (1, 2, 4), "unroll of the vectorized epilogue loop"),
            Knob("keep", keep, "recompute shared transcendental intermediates or keep the row in a buffer"),
            Knob("parallel", ("rows", "none"), "thread pool over rows"),
            Knob(
                "div",
                ("reciprocal", "exact") if _divides(group) else ("exact",),
                "divide by a per-row value, or multiply by its reciprocal computed once per row "
                "(<= 1 ulp apart; division is several times slower)",
            ),
            Knob(
                "store",
                ("cached", "stream", "split") if _full_output(group) else ("cached",),
                "ordinary stores of the output, non-temporal (streaming) vector stores, or split: ordinary "
                "for the rows that fit in the last-level cache beside the inputs, streaming beyond",
            ),
        ]

    def check_combination(self, group: Group, config: Config, target: Target) -> None:
        n = G.row_length(group)
        v = config["vector"]
        for knob in ("accum", "unroll"):
            if n % (v * config[knob]):
                raise ScheduleError(
                    f"reduction: vector*{knob} = {v * config[knob]} does not divide the row length {n}"
                )

    def default(self, group: Group, target: Target) -> Config:
        n = G.row_length(group)
        rows = math.prod(group.outputs[0].shape) // max(1, n if _full_output(group) else 1)
        config = {
            "vector": 1,
            "accum": 1,
            "unroll": 1,
            "keep": "buffer" if _has_shared_expensive(group) else "recompute",
            "parallel": "rows" if rows >= 2 and rows * max(1, n) >= PARALLEL_MIN_WORK else "none",
            "div": "reciprocal" if _divides(group) else "exact",
            "store": "stream" if G.row_form(group) and _streams(group, target) else "cached",
        }
        if not G.row_form(group):
            config["keep"] = "recompute"
            config["div"] = "exact"
            return config
        for v in (16, 8, 4):
            if v <= target.vector_lanes_f32 and n % v == 0:
                config["vector"] = v
                break
        v = config["vector"]
        # a transcendental per element (softmax) hides the add/max latency by itself, and every extra
        # accumulator adds v lanes to the per-row horizontal tree: measured, 2 beats 4 there (AVX-512
        # softmax [4096,1024], 1 thread: 1.19 vs 1.44 ms); the cheap norms want 4
        heavy = any(n_.op in EXPENSIVE for n_ in group.subgraph.nodes)
        if v > 1 and n % (4 * v) == 0 and n >= 16 * v and not heavy:
            config["accum"] = 4
        elif v > 1 and n % (2 * v) == 0:
            config["accum"] = 2
        return config

    # ------------------------------------------------------------------ build
    def build(self, group: Group, config: Config, target: Target) -> Schedule:
        self.check(group, config, target)

        def keep(sch: Schedule, b: Block) -> bool:
            return config["keep"] == "buffer" and _expensive(b) and len(sch.consumers(A.writes(b)[0])) >= 2

        sch, blocks = prepare(group, keep=keep)
        if nonpositive_exps(group):  # softmax: exp(x - max(x))
            use_exp_le0(sch)
        outs = output_blocks(sch)
        kept = [b for b in blocks if not b.is_reduction and all(b is not o for o in outs)]
        main = outs[-1]
        if config.get("div") == "reciprocal":
            _reciprocal_divisions(main)
        shape, axes = G.reduce_info(group)
        loops = sch.get_loops(main)
        spatial = loops[: G.n_spatial(main)]
        rf_ok = G.row_form(group)
        full = main.iter_vars and len(spatial) == len(shape) and not main.is_reduction and rf_ok
        if full:
            row_loops, col_loops = spatial[: len(shape) - len(axes)], spatial[len(shape) - len(axes) :]
        else:
            row_loops, col_loops = spatial, []
        row = fuse_loops(sch, row_loops)  # None for a single row (full reduction): no rows to parallelize
        col = fuse_loops(sch, col_loops)
        # bring every producer of the main output into the row loop (consumers first)
        deps = [b for b in sch.blocks() if b is not main]
        if row is not None:
            for b in reversed(deps):
                if G.reaches(sch, b, main):
                    sch.compute_at(b, row)
        v = config["vector"] if rf_ok else 1
        acc = config["accum"] if rf_ok else 1
        for b in [b for b in sch.blocks() if b.is_reduction and b is not main]:
            _schedule_reduce(sch, b, row, v, acc)
        if main.is_reduction:
            _schedule_reduce(sch, main, row, v, acc)
        for b in kept:
            # a kept row (softmax's exp) walked in steps of the reductions' accum x vector: after lowering,
            # the reduction that reads it joins its loop (one pass over the row instead of two, the sum
            # taken from registers); see compiler/loopir/fuse_siblings.py
            loop = sch.get_loops(b)[-1]
            step = v * acc if loop.extent % (v * acc) == 0 else v
            _vector_loop(sch, loop, config["vector"], step // max(1, config["vector"]))
            sch.func.attrs[FUSE_SIBLINGS] = True
        if col is not None:
            _vector_loop(sch, col, config["vector"], config["unroll"])
        if row is not None and config["parallel"] == "rows":
            sch.parallel(row)
        for buf in sch.root.alloc_buffers:
            buf.scope = "local"
        if config["store"] in ("stream", "split"):
            bufs = [A.writes(b)[0] for b in outs]
            sch.func.attrs[STREAM_STORES] = tuple(buf.name for buf in bufs)
            if config["store"] == "split":
                rows = cached_rows(group, target)
                sch.func.attrs[STREAM_FROM] = tuple(
                    (buf.name, rows * (buf.numel // _rows(group))) for buf in bufs
                )
        return sch


def _rows(group: Group) -> int:
    return max(1, math.prod(group.outputs[-1].shape) // max(1, G.row_length(group)))


def cached_rows(group: Group, target: Target) -> int:
    """``store=split``: how many leading rows of the output are stored through the cache, the ones that fit
    beside the inputs in 3/4 of the last-level cache (a quarter left to everything else); the rest stream.
    A kernel called again on the same arrays (or a consumer reading its output) then finds those rows and
    the inputs in the cache, and DRAM takes only the streamed part of the writes."""
    in_bytes = sum(math.prod(v.shape) * to_numpy(v.dtype).itemsize for v in group.inputs)
    out = group.outputs[-1]
    row_bytes = math.prod(out.shape) * to_numpy(out.dtype).itemsize // _rows(group)
    room = target.l3_bytes * 3 // 4 - in_bytes
    return min(_rows(group), max(0, room // max(1, row_bytes)))


def _streams(group: Group, target: Target) -> bool:
    return _full_output(group) and streams_pay(group, target)


def _divides(group: Group) -> bool:
    return any(n.op == "divide" for n in group.subgraph.nodes)


def _has_shared_expensive(group: Group) -> bool:
    users = group.subgraph.consumers()
    return any(n.op in EXPENSIVE and len(users.get(n.output, [])) >= 2 for n in group.subgraph.nodes)


def _full_output(group: Group) -> bool:
    shape, _ = G.reduce_info(group)
    return group.outputs[-1].shape == shape


def _vector_loop(sch: Schedule, loop: For, v: int, u: int) -> None:
    if v == 1 and u == 1:
        return
    _, lu, lv = sch.split(loop, [None, u, v])
    if v > 1:
        sch.vectorize(lv)
    if u > 1:
        sch.unroll(lu)


def _schedule_reduce(sch: Schedule, b: Block, row: For | None, v: int, acc: int) -> None:
    loops = sch.get_loops(b)
    k = fuse_loops(sch, [lp for lp in loops if G.drives_reduce(b, lp)])
    if k is None:
        return
    if v * acc == 1:
        sch.decompose_reduction(b, k)
        return
    ko, kf = sch.split(k, [None, acc * v])
    rf = sch.rfactor(kf)
    wb = sch.get_block(b.name)
    if row is not None:
        if sch.consumers(A.writes(wb)[0]):
            sch.compute_at(wb, row)
        else:  # the reduction is the group's output: place the write-back after its partials
            sch.reverse_compute_at(wb, row)
    rloops = sch.get_loops(rf)
    kf_loop = next(lp for lp in rloops if lp.var is kf.var)
    ko_loop = next(lp for lp in rloops if lp.var is ko.var)
    init = sch.decompose_reduction(rf, ko_loop)
    ka, kv = sch.split(kf_loop, [acc, v])
    sch.vectorize(kv)
    if acc > 1:
        sch.unroll(ka)
    init_loop = sch.get_loops(init)[-1]
    if init_loop.extent == acc * v:
        _ia, iv = sch.split(init_loop, [acc, v])
        sch.vectorize(iv)
    wb_loops = sch.get_loops(wb)
    if wb_loops and wb_loops[-1].extent == acc * v:
        sch.decompose_reduction(wb, wb_loops[-1])
        # a fully unrolled horizontal reduction leaves only constant indices into the partials,
        # so the codegen keeps the accumulators in vector registers; as a balanced tree, its
        # latency is log2(accum x vector) operations instead of accum x vector
        sch.unroll(wb_loops[-1])
        wb_loops[-1].annotations[REDUCE_TREE] = True


def _reciprocal_divisions(block: Block) -> None:
    """``a / b`` with ``b`` constant along the row (it reads no column iteration variable) becomes
    ``a * recip(b)``: the reciprocal is loop-invariant in the column loop, so it is computed once per row."""
    if G.n_spatial(block) == 0:
        return
    col = {iv.var for iv in block.iter_vars[-1:]}  # the innermost (column) iteration variable

    def swap(e: Expr) -> Expr | None:
        if (
            isinstance(e, Binary)
            and e.op == "/"
            and not (free_vars(e.b) & col)
            and e.dtype.startswith("float")
        ):
            return Binary("*", e.a, Call("recip", (e.b,), e.dtype), e.dtype)
        return None

    for st in A.block_stores(block):
        st.value = transform(st.value, swap)
