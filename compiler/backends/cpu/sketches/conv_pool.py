"""The CPU convolution + pooling sketch: ``conv_pool`` groups (a conv2d, its elementwise epilogue, and the
non-overlapping pooling window that reads it; :mod:`compiler.fusion`'s ``pool_prologue`` edge, off in the
rules' plan, so the plan search decides it by measurement).

The pooled output is tiled; each tile computes the convolution's register tile that covers its windows
exactly (the direct method of :mod:`~compiler.backends.cpu.sketches.conv`: accumulators in vector
registers, weights re-laid out to ``[O/OC][C/g][KH][KW][OC]``, the zero-padded input copy), stores it once
into a tile buffer on the stack (at most a few KiB: L1), and pools that buffer into the output, so the
convolution's full-size output is never written to memory nor read back::

    parallel for (n, o_o, py_o)
      for px_o                                     acc[oc_tile][ry][nr]: the conv tile, in registers
        for c, kh, kw   (kh, kw unrolled)
          for o_i, y_i, x_v (unrolled), lanes (vector)
            acc[o_i][y_i][x] += pad[n][c][y + kh][x + kw] * W[o/OC][c][kh][kw][o_i]
        tile[o_i][y_i][x] = acc                    (vector stores)
        for wy, wx, o_i, py_i (unrolled), px_v (unrolled), lanes (vector)
          out[n][o][py][px] = max/sum(out, epilogue(tile[o_i][py_i*KY + wy][px*KX + wx]))

A tap of a 2-wide window reads every other pixel of a tile row: a stride-2 vector, which the C printer
writes as two contiguous loads deinterleaved (``CPrinter.stride2_load``). The conv tile's rows and pixels
are whole windows (``ry``, ``nr_x`` multiples of the pool's kernel), the windows do not overlap (stride =
kernel, no padding) and the tiles divide the output exactly (no row tails), so no pixel is computed
twice. Knobs: the conv direct method's register tile (``oc_tile``, ``ry``, ``nr_x``, ``vector_x``),
``parallel_x``, and ``pool_vector`` (the pooled values of a tile row reduced lane by lane, 1, or in vectors
of ``vector_x`` lanes).
"""

from __future__ import annotations

from compiler.backends import group_analysis as G
from compiler.backends.cpu.sketches.common import PARALLEL_MIN_WORK
from compiler.backends.cpu.sketches.conv import (
    CpuConvSketch,
    conv_geometry,
    decompose_and_unroll_taps,
    pack_weight,
    parallel_outer,
    registers,
)
from compiler.backends.sketch import Config, Knob, Sketch, output_blocks, prepare
from compiler.errors import ScheduleError
from compiler.fusion import Group
from compiler.loopir import analysis as A
from compiler.loopir.expr import free_vars
from compiler.loopir.schedule import Schedule
from compiler.loopir.stmt import Block, For
from compiler.target import Target

VECTORS = (1, 4, 8, 16)


def pool_node(group: Group):
    """The group's pooling node (None when it has none)."""
    return next((n for n in group.nodes if n.op in G.POOLS), None)


def pool_geometry(group: Group) -> dict[str, int]:
    """The pooling window: kernel (ky, kx) and the pooled output's height and width."""
    pool = pool_node(group)
    if pool is None:
        raise ScheduleError(f"conv_pool: group {group.name} has no pooling op")
    ky, kx = pool.attrs["kernel"]
    _n, _c, ph, pw = pool.output.shape
    return {"ky": ky, "kx": kx, "ph": ph, "pw": pw}


def _divisors(n: int, values: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(v for v in values if n % v == 0)


class CpuConvPoolSketch(Sketch):
    """``conv_pool`` groups on the CPU: the direct convolution's register tile reduced into the pooled output
    in registers (see the module docstring)."""

    name = "conv_pool"
    version = 1
    kinds = ("conv_pool",)

    def applies(self, group: Group) -> bool:
        """A conv2d with constant weights, pooled by a window whose stride is its kernel (no padding)
        over an output that the windows tile exactly, the pool being the group's only output (nothing
        after it, the convolution's output not read elsewhere)."""
        pool = pool_node(group)
        if group.kind not in self.kinds or pool is None or not G.is_conv(group):
            return False
        if not G.const_second_operand(group) or group.outputs != [pool.output]:
            return False
        attrs = pool.attrs
        ky, kx = attrs["kernel"]
        _n, _c, h, w = pool.inputs[0].shape
        return (
            tuple(attrs.get("strides", (ky, kx))) == (ky, kx)
            and not any(attrs.get("padding", (0, 0, 0, 0)))
            and h % ky == 0
            and w % kx == 0
        )

    # ------------------------------------------------------------------ space
    def space(self, group: Group, target: Target) -> list[Knob]:
        geo, pg = conv_geometry(group), pool_geometry(group)
        lanes = target.vector_lanes_f32
        rows = tuple(pg["ky"] * k for k in (1, 2) if geo["oh"] % (pg["ky"] * k) == 0)
        pixels = tuple(pg["kx"] * k for k in (1, 2, 4, 8, 16, 32) if geo["ow"] % (pg["kx"] * k) == 0)
        if not rows or not pixels:
            raise ScheduleError(f"conv_pool: no conv tile of whole windows tiles the output of {group.name}")
        return [
            Knob("oc_tile", _divisors(geo["o"], (1, 2, 4, 6, 8, 12)), "output channels per register tile"),
            Knob("ry", rows, "output rows per register tile (whole windows)"),
            Knob("nr_x", pixels, "output pixels of one row per register tile (whole windows)"),
            Knob("vector_x", tuple(v for v in VECTORS if v <= lanes), "SIMD lanes along the output row"),
            Knob("parallel_x", ("outer", "none"), "OpenMP over batch x channel tiles x row tiles"),
            Knob(
                "pool_vector",
                tuple(v for v in VECTORS if v <= lanes),
                "pooled values of a tile row reduced lane by lane (1) or as vectors of that many lanes",
            ),
        ]

    def check_combination(self, group: Group, config: Config, target: Target) -> None:
        pg = pool_geometry(group)
        v, nr = config["vector_x"], config["nr_x"]
        if nr % v:
            raise ScheduleError(f"conv_pool: vector_x {v} does not divide nr_x {nr}")
        regs = config["oc_tile"] * config["ry"] * (nr // v)
        if v > 1 and regs > registers(target) - 2:
            raise ScheduleError(f"conv_pool: a direct tile of {regs} vector accumulators does not fit")
        pv = config["pool_vector"]
        if pv not in (1, v):
            raise ScheduleError(
                f"conv_pool: pool_vector {pv} must be 1 or vector_x {v} (narrower vectors deinterleaved "
                "out of the wider stores of the tile measured 3x slower)"
            )
        pooled = nr // pg["kx"]
        if pooled % pv:
            raise ScheduleError(
                f"conv_pool: pool_vector {config['pool_vector']} does not divide the {pooled} pooled "
                f"values of a tile row (nr_x {nr} / window {pg['kx']})"
            )

    # ------------------------------------------------------------------ default
    def default(self, group: Group, target: Target) -> Config:
        """The whole-window tile with the most FMAs per load that fits in the vector registers (ties: the
        longer row, so that a tile row holds a whole vector of pooled values, then the larger tile); the
        pooled values in the widest vectors that divide a tile row."""
        knobs = {k.name: k.values for k in self.space(group, target)}
        lanes = max(v for v in knobs["vector_x"] if any(nr % v == 0 for nr in knobs["nr_x"]))
        budget = registers(target) - 4
        best, best_key = None, None
        for oc in knobs["oc_tile"]:
            for ry in knobs["ry"]:
                for nr in knobs["nr_x"]:
                    if nr % lanes or oc * ry * (nr // lanes) > budget:
                        continue
                    nv = nr // lanes
                    # FMAs per load (the conv sketch's measure), then the longer row, then the larger tile
                    key = (oc * ry * nv / (ry * nv + oc), nr, oc * ry * nv)
                    if best_key is None or key > best_key:
                        best, best_key = (oc, ry, nr), key
        if best is None:
            best, lanes = (knobs["oc_tile"][0], knobs["ry"][0], knobs["nr_x"][0]), 1
        oc, ry, nr = best
        config = {
            "oc_tile": oc,
            "ry": ry,
            "nr_x": nr,
            "vector_x": lanes,
            "parallel_x": "outer" if group.flops >= 8 * PARALLEL_MIN_WORK else "none",
            "pool_vector": lanes if (nr // pool_geometry(group)["kx"]) % lanes == 0 else 1,
        }
        self.check(group, config, target)
        return config

    # ------------------------------------------------------------------ build
    def build(self, group: Group, config: Config, target: Target) -> Schedule:
        self.check(group, config, target)
        pg = pool_geometry(group)
        oc, ry, nr, v = config["oc_tile"], config["ry"], config["nr_x"], config["vector_x"]
        sch, blocks = prepare(group, keep=lambda _sch, b: b.name.endswith("_pad"))
        mm = next(b for b in blocks if b.is_reduction)
        conv_out = A.writes(mm)[0]
        # the window: the reduction reading the convolution (an average pool: its sum, then the divide,
        # the output block, elementwise on it)
        pool = next(b for b in sch.blocks() if b is not mm and b.is_reduction and conv_out in A.reads(b))
        (out,) = output_blocks(sch)
        # the conv tile accumulates in registers and is stored once into a tile buffer in L1 (the
        # convolution's output compacted to one tile), which the pool reads with vector loads
        copy = sch.cache_write(mm, conv_out, "local")
        n, c, py, px, *window = sch.get_loops(pool)
        c_o, c_i = sch.split(c, [None, oc])
        py_o, py_i = sch.split(py, [None, ry // pg["ky"]])
        px_o, px_i = sch.split(px, [None, nr // pg["kx"]])
        sch.reorder(n, c_o, py_o, px_o, *window, c_i, py_i, px_i)
        sch.compute_at(copy, px_o)  # the conv tile covering the tile's windows
        sch.compute_at(mm, px_o)
        if out is not pool:
            sch.reverse_compute_at(out, px_o)
        tile, red = _under(sch, mm, px_o)
        if tile:
            sch.reorder(*red, *tile)
        init = decompose_and_unroll_taps(sch, mm, red)
        for b in (mm, init):  # whole tiles (the knobs divide the output): the bounds guards go
            for lp in sch.get_loops(b)[-3:]:
                if b.predicate is not None and lp.var in free_vars(b.predicate):
                    sch.pad(b, lp)
        pack_weight(sch, group, oc)
        for b in (mm, init, copy):
            CpuConvSketch._vector_tile(sch, b, v, px_o)
        self._pool_tile(sch, pool, px_o, config["pool_vector"])
        if out is not pool:
            _unroll_rows(sch, out, px_o, config["pool_vector"])
        CpuConvSketch._schedule_pad(sch, config, target)
        parallel_outer(sch, config, [n, c_o, py_o])
        return sch

    @staticmethod
    def _pool_tile(sch: Schedule, pool: Block, px_o: For, pv: int) -> None:
        """The pooling block under the tile loop ``px_o``: its init split off, the window loops outside
        the tile's (channel, row, pixel) loops, which are unrolled, the pixels in vectors of ``pv``
        lanes."""
        _tile, window = _under(sch, pool, px_o)
        if pool.init is not None and window:
            init = sch.decompose_reduction(pool, window[0])
            _unroll_rows(sch, init, px_o, pv)
        _unroll_rows(sch, pool, px_o, pv)
        for lp in window:
            sch.unroll(lp)


def _under(sch: Schedule, block: Block, loop: For) -> tuple[list[For], list[For]]:
    """The block's loops under ``loop``: (the spatial ones, the ones that drive its reduction)."""
    loops = sch.get_loops(block)
    below = loops[[lp.var for lp in loops].index(loop.var) + 1 :]
    red = [lp for lp in below if G.drives_reduce(block, lp)]
    return [lp for lp in below if lp not in red], red


def _unroll_rows(sch: Schedule, block: Block, loop: For, pv: int) -> None:
    """The block's spatial loops under ``loop`` unrolled, the innermost split into vectors of ``pv``."""
    tile, _red = _under(sch, block, loop)
    if not tile:
        return
    *rest, x = tile
    xo, xv = sch.split(x, [None, pv])
    if pv > 1:
        sch.vectorize(xv)
    sch.unroll(xo)
    for lp in rest:
        sch.unroll(lp)
