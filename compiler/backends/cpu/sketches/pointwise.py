"""The CPU pointwise sketch: elementwise/broadcast/injective chains (and pooling windows) in one loop nest.

Knobs: ``flatten`` (fuse every axis into one loop, or keep the last axis apart so broadcast loads stay
contiguous), ``vector`` (SIMD lanes of the innermost loop), ``unroll`` (copies of the vector loop body),
``parallel`` (pool over the outer loop or not), ``store`` (ordinary or non-temporal vector stores of the
outputs: streaming stores skip reading the output's lines before writing them and leave the inputs in the
cache, which pays once the inputs and outputs together overflow the last-level cache, as in the reduction
sketch).
"""

from __future__ import annotations

import math

from compiler.backends import group_analysis as G
from compiler.backends.cpu.codegen import STREAM_STORES
from compiler.backends.cpu.sketches.common import PARALLEL_MIN_WORK, streams_pay
from compiler.backends.sketch import Config, Knob, Sketch, fuse_loops, output_blocks, place_windows, prepare
from compiler.errors import ScheduleError
from compiler.fusion import Group
from compiler.loopir import analysis as A
from compiler.loopir.expr import free_vars
from compiler.loopir.schedule import Schedule
from compiler.loopir.stmt import Block, For
from compiler.target import Target

VECTORS = (1, 4, 8, 16)
UNROLLS = (1, 2, 4)


class CpuPointwiseSketch(Sketch):
    """Pointwise groups on the CPU: one (optionally flattened) loop nest, vectorized, unrolled, parallel."""

    name = "pointwise"
    version = 3  # 2: the store knob; 3: pooling windows vectorized along the output row
    kinds = ("pointwise",)

    def space(self, group: Group, target: Target) -> list[Knob]:
        lanes = target.vector_lanes_f32
        window = G.has_window(group)
        return [
            Knob("flatten", (0, 1), "fuse all axes into one loop before splitting"),
            Knob("vector", tuple(v for v in VECTORS if v <= lanes), "SIMD lanes"),
            Knob("unroll", UNROLLS if not window else (1,), "unrolled copies of the vector loop"),
            Knob("parallel", ("outer", "none"), "thread pool over the outer loop"),
            Knob(
                "store",
                ("cached", "stream") if not window else ("cached",),
                "ordinary stores of the outputs, or non-temporal (streaming) vector stores",
            ),
        ]

    def check_combination(self, group: Group, config: Config, target: Target) -> None:
        inner = _inner_extent(group, config)
        step = config["vector"] * config["unroll"]
        if inner % step:
            raise ScheduleError(
                f"pointwise: vector*unroll = {step} does not divide the innermost extent {inner}"
            )

    def default(self, group: Group, target: Target) -> Config:
        shape = G.out_shape(group)
        numel = math.prod(shape)
        window = G.has_window(group)
        flatten = int(len(shape) <= 1 or not G.broadcasts(group) or shape[-1] < 16)
        config = {
            "flatten": flatten,
            "vector": 1,
            "unroll": 1,
            "parallel": "outer" if numel >= PARALLEL_MIN_WORK else "none",
            "store": "stream" if not window and streams_pay(group, target) else "cached",
        }
        inner = _inner_extent(group, config)
        for v in (16, 8, 4):
            if v <= target.vector_lanes_f32 and inner % v == 0:
                config["vector"] = v
                break
        if not window and inner % (config["vector"] * 2) == 0 and numel >= 1 << 16:
            config["unroll"] = 2
        return config

    def build(self, group: Group, config: Config, target: Target) -> Schedule:
        self.check(group, config, target)
        sch, _ = prepare(group)
        outs = output_blocks(sch)
        for out in outs:
            _schedule_output(sch, out, config)
        if config["store"] == "stream":
            sch.func.attrs[STREAM_STORES] = tuple(A.writes(b)[0].name for b in outs)
        return sch


def _inner_extent(group: Group, config: Config) -> int:
    shape = G.out_shape(group)
    if not shape:
        return 1
    if G.has_window(group):  # windows are vectorized along the output row, whatever ``flatten`` says
        return shape[-1]
    return math.prod(shape) if config["flatten"] or len(shape) == 1 else shape[-1]


def _schedule_output(sch: Schedule, out: Block, config: Config) -> None:
    if config["vector"] > 1 and any(b.is_reduction for b in sch.blocks()):
        _schedule_window_rows(sch, out, config)
        return
    spatial = place_windows(sch, out)
    if not spatial:
        return
    outer: For | None
    if config["flatten"] or len(spatial) == 1:
        inner = fuse_loops(sch, spatial)
        outer = None
    else:
        outer = fuse_loops(sch, spatial[:-1])
        inner = spatial[-1]
    assert inner is not None
    v, u = config["vector"], config["unroll"]
    io, iu, iv = sch.split(inner, [None, u, v])
    if v > 1:
        sch.vectorize(iv)
    if u > 1:
        sch.unroll(iu)
    if config["parallel"] == "outer":
        sch.parallel(outer if outer is not None else io)


def _schedule_window_rows(sch: Schedule, out: Block, config: Config) -> None:
    """A pooling group with ``vector`` lanes: the output row is split into vectors of outputs, and each
    window (its own stage, or the output block itself) is computed per vector with its window loops outside
    the vector loop, so every window tap is one vector load (a stride-2 tap: a gather that the C printer
    writes as two contiguous loads deinterleaved) and one lane-wise max/add."""
    loops = sch.get_loops(out)
    n_sp = G.n_spatial(out)
    spatial = loops[:n_sp]
    outer = fuse_loops(sch, spatial[:-1]) if len(spatial) > 1 else None
    io, iv = sch.split(spatial[-1], [None, config["vector"]])
    windows = [b for b in sch.blocks() if b is not out and b.is_reduction and G.feeds(b, out)]
    for b in windows:
        sch.compute_at(b, io)
    for b in (*windows, out) if out.is_reduction else windows:
        bl = sch.get_loops(b)
        r_vars = set().union(*(free_vars(e) for v, e in zip(b.iter_vars, b.bindings) if v.kind == "R"))
        red = [lp for lp in bl if lp.var in r_vars]
        if b.init is None:
            continue
        row = [lp for lp in bl if lp.var not in r_vars][-1]
        if red:
            sch.reorder(*red, row)
        init = sch.decompose_reduction(b, red[0] if red else row)
        sch.vectorize(sch.get_loops(init)[-1])
        sch.vectorize(sch.get_loops(b)[-1])
    if not out.is_reduction:
        sch.vectorize(iv)
    if config["parallel"] == "outer":
        sch.parallel(outer if outer is not None else io)
