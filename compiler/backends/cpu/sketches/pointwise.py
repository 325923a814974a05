"""The pointwise sketch: elementwise/broadcast/injective chains (and pooling windows) in one loop nest.

CPU knobs: ``flatten`` (fuse every axis into one loop, or keep the last axis apart so broadcast loads
stay contiguous), ``vector`` (SIMD lanes of the innermost loop), ``unroll`` (copies of the vector loop
body), ``parallel`` (OpenMP over the outer loop or not).
CUDA knobs: ``threads`` per block, ``elems`` per thread, ``vector`` width of loads/stores.
"""

from __future__ import annotations

import math

from compiler.backends.sketch import PARALLEL_MIN_WORK, Config, Knob, Sketch, output_blocks, prepare
from compiler.errors import ScheduleError
from compiler.fusion import Group
from compiler.loopir.schedule import Schedule
from compiler.loopir.stmt import Block, For
from compiler.target import Target

VECTORS = (1, 4, 8, 16)
UNROLLS = (1, 2, 4)


def _out_shape(group: Group) -> tuple[int, ...]:
    return group.outputs[0].shape


def _has_window(group: Group) -> bool:
    return any(n.op in ("max_pool2d", "avg_pool2d") for n in group.nodes)


def _broadcasts(group: Group) -> bool:
    out = _out_shape(group)
    return any(
        v.type.numel not in (1, math.prod(out)) or (v.shape != out and v.type.numel > 1) for v in group.inputs
    )


class PointwiseSketch(Sketch):
    name = "pointwise"
    version = 1
    kinds = ("pointwise",)

    def space(self, group: Group, target: Target) -> list[Knob]:
        if target.kind == "cuda":
            return [
                Knob("threads", (64, 128, 256, 512, 1024), "threads per block"),
                Knob("elems", (1, 2, 4, 8), "elements per thread"),
                Knob("vector", (1, 2, 4), "vector width of loads and stores (float2/float4)"),
            ]
        lanes = target.vector_lanes_f32
        window = _has_window(group)
        return [
            Knob("flatten", (0, 1), "fuse all axes into one loop before splitting"),
            Knob("vector", tuple(v for v in VECTORS if v <= lanes and (v == 1 or not window)), "SIMD lanes"),
            Knob("unroll", UNROLLS if not window else (1,), "unrolled copies of the vector loop"),
            Knob("parallel", ("outer", "none"), "OpenMP over the outer loop"),
        ]

    def check_combination(self, group: Group, config: Config, target: Target) -> None:
        if target.kind == "cuda":
            if config["elems"] % config["vector"]:
                raise ScheduleError("pointwise: elems must be a multiple of vector")
            return
        inner = self._inner_extent(group, config)
        step = config["vector"] * config["unroll"]
        if inner % step:
            raise ScheduleError(
                f"pointwise: vector*unroll = {step} does not divide the innermost extent {inner}"
            )

    def _inner_extent(self, group: Group, config: Config) -> int:
        shape = _out_shape(group)
        if not shape:
            return 1
        return math.prod(shape) if config["flatten"] or len(shape) == 1 else shape[-1]

    def default(self, group: Group, target: Target) -> Config:
        if target.kind == "cuda":
            return {
                "threads": 256,
                "elems": 4,
                "vector": 4 if _out_shape(group)[-1:] and _out_shape(group)[-1] % 4 == 0 else 1,
            }
        shape = _out_shape(group)
        numel = math.prod(shape)
        flatten = int(len(shape) <= 1 or not _broadcasts(group) or shape[-1] < 16)
        config = {
            "flatten": flatten,
            "vector": 1,
            "unroll": 1,
            "parallel": "outer" if numel >= PARALLEL_MIN_WORK else "none",
        }
        inner = self._inner_extent(group, config)
        for v in (16, 8, 4):
            if v <= target.vector_lanes_f32 and inner % v == 0 and not _has_window(group):
                config["vector"] = v
                break
        if not _has_window(group) and inner % (config["vector"] * 2) == 0 and numel >= 1 << 16:
            config["unroll"] = 2
        return config

    def build(self, group: Group, config: Config, target: Target) -> Schedule:
        self.check(group, config, target)
        if target.kind == "cuda":
            from compiler.backends.cuda.sketches.pointwise import build_pointwise_cuda

            return build_pointwise_cuda(self, group, config, target)
        sch, _ = prepare(group)
        for out in output_blocks(sch):
            self._schedule_output(sch, out, config)
        return sch

    def _schedule_output(self, sch: Schedule, out: Block, config: Config) -> None:
        loops = [lp for lp in sch.get_loops(out)]
        n_spatial = sum(1 for iv in out.iter_vars if iv.kind == "S")
        spatial = loops[:n_spatial]
        # window reductions (pooling) and reduction stages feeding this output go innermost
        for b in sch.blocks():
            if b is not out and b.is_reduction and spatial and self._feeds(sch, b, out):
                sch.compute_at(b, spatial[-1])
        if out.is_reduction and out.init is not None and len(loops) > n_spatial:
            sch.decompose_reduction(out, loops[n_spatial])
        if not spatial:
            return
        if config["flatten"] or len(spatial) == 1:
            inner = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
            outer: For | None = None
        else:
            outer = sch.fuse(*spatial[:-1]) if len(spatial) > 2 else spatial[0]
            inner = spatial[-1]
        v, u = config["vector"], config["unroll"]
        io, iu, iv = sch.split(inner, [None, u, v])
        if v > 1:
            sch.vectorize(iv)
        if u > 1:
            sch.unroll(iu)
        if config["parallel"] == "outer":
            sch.parallel(outer if outer is not None else io)

    @staticmethod
    def _feeds(sch: Schedule, producer: Block, consumer: Block) -> bool:
        from compiler.loopir import analysis as A

        return any(w in A.reads(consumer) for w in A.writes(producer))
