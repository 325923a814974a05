"""The CPU convolution sketch: conv2d groups (NCHW input, OIHW weight, any groups) with their elementwise
epilogue (folded BatchNorm bias, ReLU / ReLU6, residual), scheduled one of two ways, chosen by rule per
convolution (:meth:`CpuConvSketch.method`; the ``method`` knob has that one value, and the space holds that
method's knobs only, so every config the tuner draws is a distinct schedule):

``direct`` — a direct convolution vectorized along the output row (x): first layers, depthwise
convolutions, deep windows whose rows fit the vectors, and 1x1 convolutions whose image
``passes/flatten_pointwise_conv`` viewed as one row of H*W pixels (see :meth:`CpuConvSketch.method`)::

    parallel for (n, o_o, y_o)
      for x_o                                    acc[oc_tile][ry][nr]: OC x RY x (NR/V) vector registers
        for c, kh, kw   (kh, kw unrolled)
          for o_i, y_i, x_v (unrolled), lanes (vector)
            acc[o_i][y_i][x] += pad[n][c(o)][y*s + kh][x*s + kw] * W[o/OC][c][kh][kw][o_i]
        epilogue on the tile: out[n][o][y][x:x+V] = f(acc, bias, residual ...)   (contiguous stores)

  The weights are re-laid out at compile time to [O/OC][C/g][KH][KW][OC] (:class:`TilePack`), so the OC
  weights of one tap are adjacent scalars (broadcast into FMAs); input and output keep the graph's NCHW
  layout, so the convolution chains with every other kernel without layout conversions. A row tail (the
  output width not a multiple of NR; ``row_tail``) runs whole vectors over the zero-padded input copy
  grown to cover them (``Schedule.pad``; only the epilogue's stores are guarded, a part vector lane by
  lane), or as overlapped tiles: tile t starts at t x step, the last one ending at the row's end, so every
  load and store is a whole vector and the overlapped pixels are written twice with the same value, or
  (``flat``, "same" stride-1 convolutions) as tiles of ry whole rows read as one run of ry x OW pixels,
  vectors crossing the rows' ends, the column padding a constant lane mask per vector (merge-masked FMAs
  reading the rows-padded copy; see :meth:`CpuConvSketch._direct_flat`): every lane used. The
  padded copy's two stages (rows, then columns: ``te_ops._conv_pad``) run in vectors of the target's
  lanes, once for the whole input or, for a depthwise convolution (``pad_at`` channel_tile), under the
  channel-tile loop into buffers of a few KiB (no per-call heap copy of the whole input).

``gemm`` — the contraction sketch's register-tiled GEMM view (M = output pixels, N = output channels,
K = C/g x KH x KW) with the weights pre-packed at compile time and the input read in place (no packing
copy, so a 1x1 convolution is a GEMM straight off the NCHW activation); its knobs are the contraction
sketch's, with register tiles that divide output rows of 7, 14 and 28 pixels.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Sequence

from compiler import dtypes
from compiler.backends import group_analysis as G
from compiler.backends.cpu.sketches.common import PARALLEL_MIN_WORK
from compiler.backends.cpu.sketches.contraction import CpuContractionSketch
from compiler.backends.sketch import Config, Knob, Sketch, contraction_stages, fuse_loops, prepare
from compiler.errors import ScheduleError
from compiler.fusion import Group
from compiler.graph import Node
from compiler.layouts import TilePack
from compiler.loopir.expr import conjuncts, const, free_vars, logical_and
from compiler.loopir.schedule import Schedule
from compiler.loopir.simplify import simplify
from compiler.loopir.stmt import Block, For
from compiler.target import Target
from compiler.te_ops import same_conv_rows, two_stage_conv_pad

NR_X = (4, 8, 16, 32, 48, 56, 64, 112)  # 56, 112: 7 vectors (rows of 28 x 28 = 784 pixels)
# the default's price of a row tail stored lane by lane: a tile whose stores are all scalar counts as
# 1 + SCALAR_TAIL_COST times its FMA work (MobileNetV2's depthwise 3x3, 28-pixel rows, AVX-512, 1 thread:
# 2 x 16 lanes with the last 12 stored lane by lane 55 us, 16-lane tiles overlapped by 4 pixels 36 us)
SCALAR_TAIL_COST = 1.0
# vector registers a flat tile (row_tail flat) leaves free of accumulators: its masked FMAs keep the
# input as the memory operand and the tile's channel weights in registers (ResNet 3x3 64->64 at 28x28,
# AVX-512, 1 thread: oc 4 x 7 vectors = 28 accumulators spilled, 456 us; oc 3 x 7 = 21, 210 us; the
# overlapped rows' default oc 4 x 4 rows x 16 px 244 us)
FLAT_FREE_REGISTERS = 8
# input bytes a direct tile may re-read from L2 per vector FMA at full speed (see CpuConvSketch._reread)
REREAD_BYTES_PER_FMA = 8.0
# elements of a padded-copy stage from which it runs on the thread pool with a parallel convolution (the
# convolution's loop wakes the workers anyway; PARALLEL_MIN_WORK is for a kernel's only loop): ResNet's
# rows stage, 64 x 32 x 28 = 57,344 elements, serial ~5 us of each 3x3 conv's 117 us at 2 threads, in
# parallel 112.5 us (AVX-512, in-process, min of 300 calls); conv_net's first conv (27,648) 30.4 -> 29.5 us
PAD_PARALLEL_MIN_WORK = PARALLEL_MIN_WORK // 8


def overlap_step(ow: int, nr: int) -> int | None:
    """The shift between row tiles of ``nr`` pixels that cover an output row of ``ow`` with the last tile
    ending at the row's end (``row_tail`` overlap: tile t starts at t x step): the fewest tiles whose
    shifts are equal (28 pixels in tiles of 16: 2 tiles, shift 12; in tiles of 8: 5 tiles, shift 5), or
    None when there is no tail (nr divides ow) or a single tile covers the row."""
    if ow % nr == 0 or nr >= ow:
        return None
    gaps = -(-ow // nr) - 1  # tiles - 1
    while (ow - nr) % gaps:
        gaps += 1
    return (ow - nr) // gaps


def overlap_tiles(ow: int, nr: int, step: int | None) -> int:
    """Row tiles of ``nr`` pixels covering a row of ``ow``: shifted by ``step`` (overlapped), or the last
    one running past the row's end (``step`` None)."""
    return (ow - nr) // step + 1 if step else -(-ow // nr)


def conv_geometry(group: Group) -> dict[str, int]:
    """The anchor convolution's sizes: batch, channels, output size, kernel, stride, groups."""
    node = group.anchor
    if node is None or node.op != "conv2d":
        raise ScheduleError(f"conv: group {group.name} is not anchored by a conv2d")
    n, c, h, w = node.inputs[0].shape
    o, cg, kh, kw = node.inputs[1].shape
    _n, _o, oh, ow = node.output.shape
    return {
        "n": n,
        "h": h,
        "w": w,
        "c": c,
        "o": o,
        "cg": cg,
        "kh": kh,
        "kw": kw,
        "oh": oh,
        "ow": ow,
        "sw": node.attrs["strides"][1],
        "groups": node.attrs["groups"],
        "padded": int(node.attrs["padding"] != (0, 0, 0, 0)),
        "sh": node.attrs["strides"][0],
        "dil": max(node.attrs["dilation"]),
        "two_stage": int(_two_stage_pad(node)),
    }


def _two_stage_pad(node: Node) -> bool:
    """Whether the convolution's zero-padded input copy has te_ops' rows stage (two-stage pad)."""
    if node.attrs["padding"] == (0, 0, 0, 0):
        return False
    x, groups, o = node.inputs[0], node.attrs["groups"], node.output.shape[1]
    depthwise = groups > 1 and groups == o == x.shape[1]
    same = same_conv_rows(x.shape, node.inputs[1].shape, node.attrs)
    return two_stage_conv_pad(x.shape, node.attrs["padding"], dtypes.info(x.dtype).itemsize, depthwise, same)


class _ConvGemm(CpuContractionSketch):
    """The contraction sketch's GEMM view of a convolution, with register tiles of 7 and 14 rows too
    (output rows of 7, 14, 28 pixels are common)."""

    def space(self, group: Group, target: Target) -> list[Knob]:
        knobs = super().space(group, target)
        m_ext, _n = G.anchor_extents(group)
        mr = tuple(v for v in (1, 2, 4, 6, 7, 8, 12, 14) if v <= max(1, m_ext))
        return [Knob("mr", mr, k.doc) if k.name == "mr" else k for k in knobs]


class CpuConvSketch(Sketch):
    """conv2d groups on the CPU: a direct convolution vectorized along the output row, or the GEMM view
    with pre-packed weights (see the module docstring)."""

    name = "conv"
    version = 3
    kinds = ("contraction",)

    def __init__(self) -> None:
        self._gemm = _ConvGemm()

    def applies(self, group: Group) -> bool:
        return group.kind in self.kinds and G.is_conv(group) and G.const_second_operand(group)

    # ------------------------------------------------------------------ space
    def method(self, group: Group, target: Target) -> str:
        """The method for this convolution, by rule (measured on the ONNX nets' convolutions):

        - 1x1: ``direct`` when its image was flattened into one row (passes/flatten_pointwise_conv) that
          whole vectors of the target's lanes tile, else ``gemm``;
        - a deep dense window (C x KH x KW > 64): ``direct`` when its rows run whole vectors (the output
          row a multiple of the lanes) or, with 32 vector registers, over the padded input copy; else
          ``gemm`` (with 16 registers the direct tile holds 8-12 accumulators and lost to the GEMM view
          on ResNet's 3x3 64->64 at 28x28, whose rows end in a part vector);
        - a shallow or grouped window (a first layer, a depthwise convolution): ``direct`` when some
          register tile runs its rows (whole tiles, tiles over the padded copy, or overlapped tiles:
          ``row_tail``), else ``gemm``."""
        geo = conv_geometry(group)
        depth = geo["cg"] * geo["kh"] * geo["kw"]
        whole = geo["ow"] % target.vector_lanes_f32 == 0
        rows_fit = geo["padded"] and geo["sw"] == 1
        if geo["kh"] * geo["kw"] == 1:
            return "direct" if geo["oh"] == 1 and whole and geo["sw"] == 1 else "gemm"
        if depth > 64 and geo["groups"] == 1:
            return "direct" if whole or (rows_fit and registers(target) >= 32) else "gemm"
        tiles_fit = any(geo["ow"] % nr == 0 or overlap_step(geo["ow"], nr) for nr in self._nr_values(geo))
        return "direct" if rows_fit or tiles_fit else "gemm"

    @staticmethod
    def _channel_local_pad(geo: dict[str, int]) -> bool:
        """A padded depthwise convolution (one input channel per output channel): a channel tile reads
        only its own channels, so it can pad them itself."""
        return bool(geo["padded"]) and geo["cg"] == 1 and geo["groups"] == geo["o"] == geo["c"]

    @classmethod
    def _nr_values(cls, geo: dict[str, int]) -> tuple[int, ...]:
        """Row tile widths: NR_X up to twice the row, and the flat tiles' runs of 1, 2, 4 whole rows."""
        flat = {ry * geo["ow"] for ry in (1, 2, 4) if ry <= geo["oh"]} if cls._flat_rows(geo) else set()
        return tuple(sorted({v for v in NR_X if v < 2 * max(4, geo["ow"])} | flat))

    def space(self, group: Group, target: Target) -> list[Knob]:
        method = self.method(group, target)
        head = Knob("method", (method,), "direct (vectors along the output row) or the GEMM view, by rule")
        if method == "gemm":
            return [head, *self._gemm.space(group, target)]
        geo = conv_geometry(group)
        vectors = tuple(v for v in (1, 4, 8, 16) if v <= target.vector_lanes_f32)
        return [
            head,
            Knob("oc_tile", tuple(v for v in (1, 2, 3, 4, 6, 8, 12) if v <= max(1, geo["o"])), "channels"),
            Knob("ry", tuple(v for v in (1, 2, 4) if v <= geo["oh"]), "output rows per register tile"),
            Knob("nr_x", self._nr_values(geo), "output pixels of one row per register tile"),
            Knob("vector_x", vectors, "SIMD lanes along the output row"),
            Knob("parallel_x", ("outer", "none"), "OpenMP over batch x channel tiles x row tiles"),
            Knob(
                "pad_at",
                ("channel_tile", "once") if self._channel_local_pad(geo) else ("once",),
                "the zero-padded input copy: once for the whole input, or per channel tile inside it (a "
                "depthwise convolution: each channel tile pads its own channels into a small buffer)",
            ),
            Knob(
                "row_tail",
                ("pad", "overlap", "flat") if self._flat_rows(geo) else ("pad", "overlap"),
                "a row that nr_x does not divide: whole tiles over the padded input copy, the tail stores "
                "guarded (pad), the last tile shifted back to end at the row's end (overlap), or (flat) "
                "tiles of ry whole rows read as one run of ry x OW pixels, vectors crossing the rows' ends "
                "(the column padding as zero-masked loads from the rows-padded copy)",
            ),
        ]

    @staticmethod
    def _flat_rows(geo: dict[str, int]) -> bool:
        """Whether tiles of whole rows can run as one run of pixels (``row_tail`` flat): stride 1, no
        dilation, the output row as wide as the input row (the column padding KW - 1 in all) and the rows
        padded by te_ops' rows stage (two-stage pad), whose rows are as wide as the output's."""
        return (
            bool(geo["two_stage"])
            and geo["sw"] == 1
            and geo["sh"] == 1
            and geo["dil"] == 1
            and (geo["ow"] == geo["w"] and geo["kw"] > 1)
        )

    def check_combination(self, group: Group, config: Config, target: Target) -> None:
        if config["method"] == "gemm":
            self._gemm.check_combination(group, self._gemm_config(config), target)
            return
        geo = conv_geometry(group)
        v, nr = config["vector_x"], config["nr_x"]
        if nr % v:
            raise ScheduleError(f"conv: vector_x {v} does not divide nr_x {nr}")
        flat = config["row_tail"] == "flat"
        regs = config["oc_tile"] * (1 if flat else config["ry"]) * (nr // v)
        if v > 1 and regs > registers(target) - 2:
            raise ScheduleError(f"conv: a direct tile of {regs} vector accumulators does not fit")
        if flat:
            if v == 1:
                # its column padding is a lane mask: scalar, every tap is a select (conv_net's 32->64 at
                # 16x16: 15-37 ms per call vs 0.29 ms in vectors; 8% of a 30-trial tuning run's conv trials)
                raise ScheduleError("conv: row_tail flat runs in vectors (vector_x > 1)")
            if nr != config["ry"] * geo["ow"] or geo["oh"] % config["ry"]:
                raise ScheduleError(
                    f"conv: row_tail flat runs tiles of ry whole rows: nr_x {nr} must be ry "
                    f"{config['ry']} x the output row {geo['ow']}, and ry must divide the {geo['oh']} rows"
                )
            if config["pad_at"] != "once":
                raise ScheduleError(
                    "conv: row_tail flat reads the rows-padded copy of the whole input (pad_at once)"
                )
        elif config["row_tail"] == "overlap":
            if overlap_step(geo["ow"], nr) is None:
                raise ScheduleError(
                    f"conv: row_tail overlap needs at least two row tiles of nr_x {nr} to cover the "
                    f"output row {geo['ow']} with a tail (nr_x smaller than the row, not dividing it)"
                )
        elif geo["ow"] % nr and not (geo["padded"] and geo["sw"] == 1):
            raise ScheduleError(
                f"conv: nr_x {nr} does not divide the output row {geo['ow']} and there is no padded "
                "input copy to run the row tail on"
            )

    @staticmethod
    def _gemm_config(config: Config) -> Config:
        return {k: v for k, v in config.items() if k != "method"}

    # ------------------------------------------------------------------ default
    def default(self, group: Group, target: Target) -> Config:
        method = self.method(group, target)
        if method == "direct":
            config = {"method": method, **self._direct_default(group, target, conv_geometry(group))}
        else:
            config = {"method": method, **self._gemm_default(group, target)}
        self.check(group, config, target)
        return config

    def _direct_default(self, group: Group, target: Target, geo: dict[str, int]) -> Config:
        """The register tile (lanes, row pixels, channels, rows) with the most useful FMA lanes per load:
        FMAs per load (:meth:`_fmas_per_load`) x vector lanes, less the lanes wasted on tail tiles and on
        the tail's scalar stores (:data:`SCALAR_TAIL_COST`); a row tail runs shifted back (``overlap``,
        vector stores) when the tiles allow it, else over the padded copy (``pad``)."""
        ow, budget = geo["ow"], registers(target) - 4
        tails_run = geo["padded"] and geo["sw"] == 1  # whole vectors over the padded copy
        # a depthwise tile padding its channels itself: at most 2 rows (MobileNetV2's depthwise 3x3,
        # 1 channel x 16 px, AVX-512: ry 1 29.8 us, ry 2 25.0 us, ry 4 34.7 us; AVX2 52.7 / 52.5 us)
        rows = (1, 2) if self._channel_local_pad(geo) else (1, 2, 4)
        best, best_key = None, (False, False, -1.0, -(10**9))
        for v in (x for x in (1, 4, 8, 16) if x <= target.vector_lanes_f32):
            for nr in (x for x in NR_X if x < 2 * max(4, ow)):
                if nr % v or nr // v > 7:
                    continue
                tail = "pad" if ow % nr == 0 or overlap_step(ow, nr) is None else "overlap"
                if tail == "pad" and ow % nr and not tails_run:
                    continue
                tiles = overlap_tiles(ow, nr, overlap_step(ow, nr) if tail == "overlap" else None)
                # the pad tail's last vector stores lane by lane (a part vector): its share of the stores
                scalar = (ow % nr) % v / ow if tail == "pad" and v > 1 else 0.0
                for oc, ry in itertools.product((1, 2, 4, 6, 8, 12), rows):
                    nv = nr // v
                    if oc * ry * nv > budget or oc > max(1, geo["o"]) or ry > geo["oh"]:
                        continue
                    used = ow / (tiles * nr) * geo["oh"] / (-(-geo["oh"] // ry) * ry)
                    used *= geo["o"] / (-(-geo["o"] // oc) * oc) / (1 + SCALAR_TAIL_COST * scalar)
                    # a channel tile that does not divide O guards its FMAs inside the reduction loop
                    whole = geo["o"] % oc == 0 or oc > geo["o"]
                    # ties: the larger tile; a depthwise tile padding its channels itself: the fewer
                    # channels (its FMAs per load do not depend on them, its padded buffer does)
                    size = -oc if self._channel_local_pad(geo) else oc * ry * nv
                    rate = self._fmas_per_load(geo, oc, ry, nv) * v * used * self._reread(geo, target, oc, v)
                    # a depthwise tile padding its channels itself avoids lane-by-lane tails whenever
                    # it can (AVX2, 28-pixel rows, 1 channel x 2 rows: 4 x 8 lanes, the last half
                    # stored lane by lane, 58.7 us; 2 x 8 lanes overlapped 52.8 us)
                    clean = not (self._channel_local_pad(geo) and tail == "pad" and ow % nr)
                    key = (whole, clean, rate, size)
                    if key > best_key:
                        best, best_key = (oc, ry, nr, v, tail), key
        lanes = target.vector_lanes_f32
        if self._flat_rows(geo) and ow % lanes and not self._channel_local_pad(geo) and lanes > 1:
            # rows ending in a part vector: tiles of whole rows as one run of pixels (every lane used),
            # at most FLAT_ACCUMULATORS_FREE registers short of the budget
            for ry, oc in itertools.product((1, 2, 4), (1, 2, 3, 4, 6, 8, 12)):
                nr, nv = ry * ow, ry * ow // lanes
                if nr % lanes or nv > 7 or geo["oh"] % ry or oc > max(1, geo["o"]):
                    continue
                if oc * nv > registers(target) - FLAT_FREE_REGISTERS:
                    continue
                used = geo["o"] / (-(-geo["o"] // oc) * oc) * self._reread(geo, target, oc, lanes)
                rate = self._fmas_per_load(geo, oc, 1, nv) * lanes * used
                key = (True, True, rate, oc * nv)
                if key > best_key:
                    best, best_key = (oc, ry, nr, lanes, "flat"), key
        oc, ry, nr, v, tail = best or (1, 1, min(self._nr_values(geo)), 1, "pad")
        if self._flat_whole_rows(geo, target, nr, v, tail):
            # the same tile as one run of ry whole rows: the same accumulators and loads, the taps at
            # the row ends masked FMAs instead of the padded copy's columns stage (conv_net's 32 -> 64 at
            # 16x16, AVX-512, 1 thread, oc 4 x 4 rows x 16 px: 283.6 us flat vs 288.5 over the columns
            # stage, in-process, 11 interleaved rounds)
            nr, tail = ry * ow, "flat"
        parallel = "outer" if group.flops >= 8 * PARALLEL_MIN_WORK else "none"
        pad_at = "channel_tile" if self._channel_local_pad(geo) else "once"
        return {
            "oc_tile": oc,
            "ry": ry,
            "nr_x": nr,
            "vector_x": v,
            "parallel_x": parallel,
            "pad_at": pad_at,
            "row_tail": tail,
        }

    def _flat_whole_rows(self, geo: dict[str, int], target: Target, nr: int, v: int, tail: str) -> bool:
        """Whether the default's tile (``nr`` pixels of a row, ``v`` lanes) covers whole output rows of
        whole vectors of a convolution that flat tiles can run, on a target whose masked FMAs are single
        instructions (16 float32 lanes: AVX-512; narrower targets blend, and their flat tiles lost to the
        GEMM view on ResNet's 3x3): the tile then runs flat (no padded copy's columns stage)."""
        return (
            self._flat_rows(geo)
            and not self._channel_local_pad(geo)
            and tail == "pad"
            and nr == geo["ow"]
            and v == target.vector_lanes_f32 == 16
            and geo["ow"] % v == 0
        )

    @staticmethod
    def _reread(geo: dict[str, int], target: Target, oc: int, v: int) -> float:
        """The share of full speed a dense convolution keeps while it re-reads its input from L2 once
        per channel tile (the input larger than L1): bytes re-read per vector FMA, 4 v H W / (oc KH KW
        OH OW), above ``REREAD_BYTES_PER_FMA`` slow it down in proportion. Only 1x1 convolutions reach
        that (MobileNetV2's 32->192 expansion on 784 pixels, AVX-512: oc 4 at 16 bytes per FMA 43 us,
        oc 6-8 at 8-11 bytes 36.5 us; a 3x3 re-reads 9 times less per FMA)."""
        if geo["groups"] > 1 or geo["n"] * geo["c"] * geo["h"] * geo["w"] * 4 <= target.l1_bytes:
            return 1.0
        reread = 4 * v * geo["h"] * geo["w"] / (oc * geo["kh"] * geo["kw"] * geo["oh"] * geo["ow"])
        return min(1.0, REREAD_BYTES_PER_FMA / reread)

    @staticmethod
    def _fmas_per_load(geo: dict[str, int], oc: int, ry: int, nv: int) -> float:
        """FMAs per load of a tile: a dense convolution loads ry x nv input vectors and oc weights per
        tap; a depthwise one reads a different channel per output channel, but the rows its kh taps share
        are loaded once (ry + kh - 1 rows)."""
        kh = geo["kh"]
        fmas = oc * ry * nv * kh
        if geo["cg"] == 1 and geo["groups"] > 1:
            return fmas / (oc * (ry + kh - 1) * nv + oc * kh)
        return fmas / ((ry * nv + oc) * kh)

    def _gemm_default(self, group: Group, target: Target) -> Config:
        config = dict(self._gemm.default(group, target))
        m_ext, _n_ext = G.anchor_extents(group)
        v, nr = config["vector"], config["nr"]
        fitting = [x for x in (1, 2, 4, 6, 7, 8, 12, 14) if x <= max(1, m_ext)]
        fitting = [x for x in fitting if x * (nr // v) <= registers(target) - 4]
        # the largest register tile that divides the output row (no row guards), else the largest
        config["mr"] = max(fitting, key=lambda x: (m_ext % x == 0, x))
        return config

    # ------------------------------------------------------------------ build
    def build(self, group: Group, config: Config, target: Target) -> Schedule:
        self.check(group, config, target)
        if config["method"] == "gemm":
            return self._gemm.build(group, self._gemm_config(config), target)
        return self._direct(group, config, target)

    def _direct(self, group: Group, config: Config, target: Target) -> Schedule:
        oc, ry, nr, v = config["oc_tile"], config["ry"], config["nr_x"], config["vector_x"]
        geo = conv_geometry(group)
        sch, blocks = prepare(group, keep=lambda _sch, b: b.name.endswith("_pad"))
        mm, epi = contraction_stages(sch, blocks)
        loops = sch.get_loops(mm)
        n, o, y, x = loops[:4]
        red = loops[4:]
        o_o, o_i = sch.split(o, [None, oc])
        y_o, y_i = sch.split(y, [None, ry])
        outer = [n, o_o, y_o]
        if config["row_tail"] == "flat":
            return self._direct_flat(sch, group, config, target, (mm, epi), (n, o_o, y_o, o_i, y_i, x), red)
        step = overlap_step(geo["ow"], nr) if config["row_tail"] == "overlap" else None
        x_o, x_i = sch.split(x, [overlap_tiles(geo["ow"], nr, step), nr])
        sch.reorder(n, o_o, y_o, x_o, *red, o_i, y_i, x_i)
        sch.reverse_compute_at(epi, x_o)
        init = decompose_and_unroll_taps(sch, mm, red)
        # whole tiles for the accumulation (the padded input copy grows to cover the row tail; an
        # overlapped row has none)
        for b in (mm, init):
            for lp in sch.get_loops(b)[-3:]:
                if step is not None and lp is sch.get_loops(b)[-1]:
                    continue
                if b.predicate is not None and lp.var in free_vars(b.predicate):
                    with contextlib.suppress(ScheduleError):  # an input read in place keeps its guard
                        sch.pad(b, lp)
        pack_weight(sch, group, oc)
        for b in (mm, init, epi):
            self._vector_tile(sch, b, v, x_o)
        if step is not None:
            self._overlap_row_tiles((mm, init, epi), x_o, nr, step)
        if config["pad_at"] == "channel_tile":
            self._pad_per_channel_tile(sch, o_o, target.vector_lanes_f32)
            outer = [n, o_o]
        else:
            self._schedule_pad(sch, config, target)
        parallel_outer(sch, config, outer)
        return sch

    def _direct_flat(
        self,
        sch: Schedule,
        group: Group,
        config: Config,
        target: Target,
        stages: tuple[Block, Block],
        loops: tuple[For, ...],
        red: list[For],
    ) -> Schedule:
        """``row_tail`` flat: the register tile is ry whole output rows read as one run of ry x OW
        pixels (y_i and x fused), so its vectors cross the rows' ends and every lane is used (28-pixel
        rows: 4 rows = 7 whole vectors of 16 instead of 2 vectors per row with 4 lanes idle). The
        columns stage of the padded copy is inlined: the convolution reads the rows-padded copy (as wide
        as the output row; its extra zero rows keep the reads one pixel before a row's start and after its
        end inside the buffer) under the column condition, which the vectorizer turns into a constant
        lane mask per vector (the tile starts at a row's start, so each vector's lanes sit at known
        columns) and the printer into merge-masked FMAs whose input stays a memory operand. The
        channel-major order of the unrolled tile (each weight broadcast once for its row of vectors)
        matters: vectors-major held every channel's weight in registers and spilled."""
        mm, epi = stages
        n, o_o, y_o, o_i, y_i, x = loops
        oc, v = config["oc_tile"], config["vector_x"]
        cols = next(b for b in sch.blocks() if b.name.endswith("_pad") and not b.name.endswith("_rows_pad"))
        sch.compute_inline(cols)
        sch.reorder(n, o_o, y_o, *red, o_i, y_i, x)
        sch.fuse(y_i, x)
        sch.reverse_compute_at(epi, y_o)
        if config["ry"] > 1:  # the epilogue's rows and columns under y_o (a single row has no row loop)
            sch.fuse(*sch.get_loops(epi)[-2:])
        init = decompose_and_unroll_taps(sch, mm, red)
        for b in (mm, init):  # a channel tile that does not divide O: whole tiles over a grown weight
            o_loop = sch.get_loops(b)[-2]
            if b.predicate is not None and o_loop.var in free_vars(b.predicate):
                with contextlib.suppress(ScheduleError):
                    sch.pad(b, o_loop)
        pack_weight(sch, group, oc)
        for b in (mm, init, epi):
            self._vector_tile(sch, b, v, y_o)
        self._schedule_pad(sch, config, target)
        parallel_outer(sch, config, [n, o_o, y_o])
        return sch

    @staticmethod
    def _vector_tile(sch: Schedule, block: Block, v: int, x_o: For) -> None:
        """The block's register-tile loops (o_i, y_i, x_i under the row-tile loop ``x_o``, reduction loops
        excepted): x split into vectors, the rest unrolled, so the accumulator stays in registers."""
        loops = sch.get_loops(block)
        below = loops[[lp.var for lp in loops].index(x_o.var) + 1 :]
        tile = [lp for lp in below if lp.kind == "serial" and not G.drives_reduce(block, lp)]
        if not tile:
            return
        x_loop = tile[-1]
        xv, lanes = sch.split(x_loop, [None, v])
        if v > 1:
            sch.vectorize(lanes)
        sch.unroll(xv)
        for lp in tile[:-1]:
            sch.unroll(lp)

    @staticmethod
    def _overlap_row_tiles(blocks: Sequence[Block], x_o: For, nr: int, step: int) -> None:
        """Row tile ``x_o`` starts at ``x_o * step`` instead of ``x_o * nr`` (``row_tail`` overlap): the
        last tile ends at the row's end, the tiles before it overlap by ``nr - step`` pixels, which are
        computed twice and stored twice with the same value (kernel parameters never alias). Every pixel a
        tile touches is inside the row, so the row guards (the predicate's conjuncts on ``x_o``) go."""
        shift = const(step - nr, x_o.var.dtype) * x_o.var
        for b in blocks:
            b.bindings = [simplify(e + shift) if x_o.var in free_vars(e) else e for e in b.bindings]
            if b.predicate is not None:
                kept = [c for c in conjuncts(b.predicate) if x_o.var not in free_vars(c)]
                b.predicate = logical_and(*kept) if kept else None

    @classmethod
    def _pad_per_channel_tile(cls, sch: Schedule, o_o: For, lanes: int) -> None:
        """``pad_at`` channel_tile: the padded copy's stages computed under the channel-tile loop ``o_o``,
        so each tile pads its own channels into a buffer of a few KiB (on the stack, in L1) instead of
        one copy of the whole input allocated on every call. The rows stage copies the input's rows only
        (its region grew by the columns stage's reads one pixel beyond each end of a row, which that
        stage's select discards); both stages run in vectors of the target's lanes."""
        pads = [b for b in sch.blocks() if b.name.endswith("_pad")]
        cols = next(b for b in pads if not b.name.endswith("_rows_pad"))
        rows = next((b for b in pads if b.name.endswith("_rows_pad")), None)
        sch.compute_at(cols, o_o)
        if rows is None:  # one stage (a pad wider than the image): its select stays scalar
            return
        sch.compute_at(rows, o_o)
        # the rows stage's whole image (its extra zero rows included) and the input's rows only: its
        # region was the columns stage's reads, which start one row in and reach one pixel beyond each
        # end of a row (pixels that stage's select discards); with the extra rows kept, those reads stay
        # inside the tile's buffer, so the columns stage vectorizes
        y_loop, x_loop = sch.get_loops(rows)[-2:]
        for d, lp in ((2, y_loop), (3, x_loop)):
            if rows.bindings[d] is lp.var or lp.var not in free_vars(rows.bindings[d]):
                continue
            lp.extent = rows.iter_vars[d].extent
            rows.bindings = [lp.var if k == d else e for k, e in enumerate(rows.bindings)]
            if rows.predicate is not None:
                kept = [c for c in conjuncts(rows.predicate) if lp.var not in free_vars(c)]
                rows.predicate = logical_and(*kept) if kept else None
        for b in (rows, cols):
            cls._vector_pad_rows(sch, b, lanes)

    @classmethod
    def _vector_pad_rows(cls, sch: Schedule, block: Block, lanes: int) -> None:
        """A pad stage's row loop in vectors of ``lanes``: overlapped when that costs at most one extra
        vector (a copy: a pixel stored twice gets the same value), else the last vector guarded."""
        row = sch.get_loops(block)[-1]
        if lanes <= 1 or row.extent < lanes:
            return
        step = overlap_step(row.extent, lanes)
        if step is not None and overlap_tiles(row.extent, lanes, step) > -(-row.extent // lanes) + 1:
            step = None  # more than one extra vector (30 in vectors of 8 would take 12): a guarded tail
        r_o, vec = sch.split(row, [overlap_tiles(row.extent, lanes, step), lanes])
        sch.vectorize(vec)
        if step is not None:
            cls._overlap_row_tiles([block], r_o, lanes, step)

    @classmethod
    def _schedule_pad(cls, sch: Schedule, config: Config, target: Target) -> None:
        """The zero-padded input copy (te_ops' two stages, rows then columns, or one): each stage one
        pass, parallel over its outer axes with a parallel convolution of at least
        ``PAD_PARALLEL_MIN_WORK`` elements; both stages of a two-stage copy in vectors of the target's
        lanes (the rows stage's loads are clamped into the input, the columns stage's stay inside the rows
        stage's extra zero rows, so their selects vectorize)."""
        lanes = target.vector_lanes_f32
        two_stage = any(b.name.endswith("_rows_pad") for b in sch.blocks())
        for b in sch.blocks():
            if not b.name.endswith("_pad"):
                continue
            loops = sch.get_loops(b)
            numel = math.prod(lp.extent for lp in loops)
            if len(loops) > 1 and config["parallel_x"] != "none" and numel >= PAD_PARALLEL_MIN_WORK:
                sch.parallel(fuse_loops(sch, loops[:-2]))
            if two_stage:
                # both stages in vectors: the rows stage's loads are clamped into the input and the
                # columns stage's stay inside the rows stage's extra zero rows (a scalar rows stage, left to
                # gcc, took 18.3 of conv_net's second convolution's 288 us, AVX-512, 1 thread; vectors: see
                # the note of this change); a one-stage copy reads out of bounds at its corners and stays
                # scalar
                cls._vector_pad_rows(sch, b, lanes)


def decompose_and_unroll_taps(sch: Schedule, mm: Block, red: Sequence[For]) -> Block:
    """Split the accumulator's init off before the first reduction loop of ``mm`` and unroll the short
    kernel-tap loops after it (extent <= 7); returns the init block."""
    init = sch.decompose_reduction(mm, red[0])
    for small in red[1:]:
        if small.extent <= 7:
            sch.unroll(small)
    return init


def pack_weight(sch: Schedule, group: Group, oc: int) -> None:
    """The convolution's constant weight re-laid out at compile time in tiles of ``oc`` output channels
    (the channel count padded to a whole tile)."""
    weight = sch.func.params[group.inputs.index(group.anchor.inputs[1])]
    sch.transform_input_layout(weight, TilePack(0, oc, pad_to=oc))


def parallel_outer(sch: Schedule, config: Config, outer: Sequence[For]) -> None:
    """``parallel_x`` outer: the ``outer`` loops fused into one parallel loop (when it has more than one
    iteration)."""
    if config["parallel_x"] == "outer":
        fused = fuse_loops(sch, list(outer))
        if fused is not None and fused.extent > 1:
            sch.parallel(fused)


def registers(target: Target) -> int:
    """Vector registers of the target's ISA (32 with AVX-512 or on aarch64, 16 with AVX2)."""
    return target.vector_registers
