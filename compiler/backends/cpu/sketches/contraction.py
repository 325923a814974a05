"""The CPU contraction sketch: matmul / batch_matmul / conv2d with a fused elementwise epilogue.

The block's spatial loops are classified by the operands they index (:func:`group_analysis.gemm_view`):
M (only the first operand), N (only the second), batch (both). The schedule is BLIS style without K
blocking (the accumulator tile lives in registers for the whole K, so the epilogue runs on registers):

    parallel for (batch, outer M/N dims, n_o)   [pack B panel: n_o's K x NC block, layout [NC/NR][K][NR]]
      for m_o                                   [pack A panel: MC x K, layout [MC/MR][K][MR]]
        for n_m, m_m   (order knob)             [acc: MR x NR register tile, zeroed]
          for k                          acc[mr][nr] += A[m][k] * Bp[k][nr]  (mr unrolled, nr vectorized)
          epilogue on the tile                  out = f(acc, bias, residual, ...)

Knobs: ``mr``, ``nr`` (register tile), ``vector``, ``mc_tiles`` / ``nc_tiles`` (cache block = tiles x
register tile), ``pack_a``, ``pack_b``, ``order``, ``unroll_k``, ``parallel``.
"""

from __future__ import annotations

import math

from compiler.backends import group_analysis as G
from compiler.backends.cpu.sketches.common import PARALLEL_MIN_WORK
from compiler.backends.group_analysis import GemmView, gemm_view
from compiler.backends.sketch import Config, Knob, Sketch, contraction_stages, fuse_loops, prepare
from compiler.errors import ScheduleError
from compiler.fusion import Group
from compiler.layouts import TilePack
from compiler.loopir import analysis as A
from compiler.loopir.expr import Load, free_vars, structural_equal
from compiler.loopir.schedule import Schedule
from compiler.loopir.stmt import Block, For
from compiler.target import Target

NR_VALUES = (4, 8, 16, 32, 48, 64, 128)
SPARE_REGISTERS = 4  # vector registers a micro-kernel keeps for B vectors and the broadcast A value


class CpuContractionSketch(Sketch):
    """Contraction groups on the CPU: a register-tiled micro-kernel inside cache blocks, packed panels."""

    name = "contraction"
    version = 1
    kinds = ("contraction",)

    def space(self, group: Group, target: Target) -> list[Knob]:
        lanes = target.vector_lanes_f32
        m_ext, n_ext = G.anchor_extents(group)
        conv = G.is_conv(group)
        vectors = tuple(v for v in (1, 4, 8, 16) if v <= lanes)
        return [
            Knob("mr", tuple(v for v in (1, 2, 4, 6, 8, 12, 14) if v <= max(1, m_ext)), "register tile rows"),
            Knob(
                "nr",
                tuple(v for v in NR_VALUES if v <= max(4, n_ext) or v == 4),
                "register tile columns",
            ),
            Knob("vector", vectors, "SIMD lanes along N"),
            Knob("mc_tiles", (1, 2, 4, 8, 16, 32), "register tiles per M cache block (MC = mc_tiles * mr)"),
            Knob("nc_tiles", (1, 2, 4, 8, 16), "register tiles per N cache block (NC = nc_tiles * nr)"),
            Knob("pack_a", (0,) if conv else (0, 1), "pack the A panel [MC/MR][K][MR]"),
            Knob(
                "pack_b",
                (0, 1, 2) if G.const_second_operand(group) else (0, 1),
                "B panel: 0 read in place, 1 packed per call [NC/NR][K][NR], "
                "2 pre-packed weights (at compile time)",
            ),
            Knob("order", ("nm", "mn"), "order of the tile loops inside the cache block"),
            Knob("unroll_k", (1, 2, 4), "unroll of the K loop"),
            Knob("parallel", ("batch_n", "batch_m", "none"), "OpenMP over batch+N blocks or batch+M blocks"),
        ]

    def check_combination(self, group: Group, config: Config, target: Target) -> None:
        v, nr, mr = config["vector"], config["nr"], config["mr"]
        if nr % v:
            raise ScheduleError(f"contraction: vector {v} does not divide nr {nr}")
        if v > 1 and mr * (nr // v) > target.vector_registers - SPARE_REGISTERS:
            raise ScheduleError(
                f"contraction: a {mr}x{nr} tile needs {mr * nr // v} vector accumulators; "
                f"{target.device} has {target.vector_registers} vector registers"
            )
        m_ext, n_ext = G.anchor_extents(group)
        if config["mc_tiles"] > 1 and mr * config["mc_tiles"] > 2 * m_ext:
            raise ScheduleError("contraction: the M cache block is far larger than M")
        if config["nc_tiles"] > 1 and nr * config["nc_tiles"] > 2 * n_ext:
            raise ScheduleError("contraction: the N cache block is far larger than N")

    def default(self, group: Group, target: Target) -> Config:
        m_ext, n_ext = G.anchor_extents(group)
        k_ext, batch = G.reduce_and_batch(group)
        lanes = target.vector_lanes_f32
        v = lanes if n_ext >= lanes else max(x for x in (4, 8, 16) if x <= max(4, n_ext) and x <= lanes)
        nr = 2 * v if n_ext >= 2 * v else v
        accumulators = target.vector_registers - SPARE_REGISTERS
        fitting = [x for x in (1, 2, 4, 6, 8) if x <= max(1, m_ext) and x * (nr // v) <= accumulators]
        # the most rows of useful work per tile (a 6-row tile on AVX2's 16 registers, 6x16 = 12
        # accumulators, beats a 4-row one that divides M: the FMA pipes need ~4 x fma_units independent
        # accumulators); a tile that divides M (no row guards) wins ties
        mr = max(fitting, key=lambda x: (m_ext / (-(-m_ext // x) * x) * x, m_ext % x == 0))
        # few rows (a matrix-vector product): widen the tile along N until it has the 4 x fma_units
        # independent accumulators that hide the FMA latency (1 x 128 floats on AVX-512 for M = 1)
        while (
            mr * (nr // v) < 4 * target.fma_units
            and 2 * nr in NR_VALUES
            and 2 * nr <= n_ext
            and mr * (2 * nr // v) <= accumulators
        ):
            nr *= 2
        # the packed B panel (K x NC) and the A block (MC x K) should sit in about half of L2 each
        budget = target.l2_bytes // 2
        nc_cap = max(1, min(16, budget // max(1, 4 * k_ext * nr), -(-n_ext // nr)))
        mc_cap = max(1, min(32, budget // max(1, 4 * k_ext * mr), -(-m_ext // mr)))
        nc_tiles = _tiles_within(nc_cap, n_ext, nr)
        mc_tiles = _tiles_within(mc_cap, m_ext, mr)
        n_blocks = batch * -(-n_ext // (nr * nc_tiles))
        m_blocks = batch * -(-m_ext // (mr * mc_tiles))
        if n_blocks >= target.cores:
            parallel = "batch_n"
        else:
            parallel = "batch_m"
            # every block count up to the L2 cap, not only those dividing M: a thread's work is what counts
            # here (on one thread a dividing block is a little faster; on two, 16-row blocks that divide
            # M = 2000 cost 2.3x: 125 blocks, each streaming the B panel again)
            mc_tiles = _balanced_tiles(mc_cap, m_ext, mr, batch, target.cores)
            m_blocks = batch * -(-m_ext // (mr * mc_tiles))
            if m_blocks < 2:
                parallel = "none" if n_blocks < 2 else "batch_n"
        if group.flops < 8 * PARALLEL_MIN_WORK:
            parallel = "none"
        return {
            "mr": mr,
            "nr": nr,
            "vector": v,
            "mc_tiles": mc_tiles,
            "nc_tiles": nc_tiles,
            "pack_a": 0,
            "pack_b": 2 if G.const_second_operand(group) else 1,
            "order": "nm",
            "unroll_k": 1,
            "parallel": parallel,
        }

    # ------------------------------------------------------------------ build
    def build(self, group: Group, config: Config, target: Target) -> Schedule:
        self.check(group, config, target)
        # a convolution's zero-padded input copy stays a stage of its own (read with affine indices)
        sch, blocks = prepare(group, keep=lambda _sch, b: b.name.endswith("_pad"))
        mm, epi = contraction_stages(sch, blocks)
        view = gemm_view(sch, mm)
        if not view.m or not view.n:
            return self._simple(sch, mm, epi, config)
        self._tile(sch, view, epi, config)
        self._schedule_pad(sch, config)
        return sch

    @staticmethod
    def _acc_layout_n_last(sch: Schedule, mm: Block, n_dims: list[int]) -> None:
        """Lay the accumulator out with the N axes innermost (a convolution's output is [n, o, y, x] with o
        on the N side): the register tile's vector lanes must be contiguous."""
        acc = A.writes(mm)[0]
        rank = len(acc.shape)
        if not n_dims or n_dims == list(range(rank - len(n_dims), rank)):
            return
        order = [d for d in range(rank) if d not in n_dims] + n_dims
        sch.transform_layout(acc, lambda *idx: [idx[d] for d in order], [acc.shape[d] for d in order])

    @staticmethod
    def _schedule_pad(sch: Schedule, config: Config) -> None:
        """The convolution's padded input copy: one pass, parallel over its outer axes when big enough."""
        for b in sch.blocks():
            if not b.name.endswith("_pad"):
                continue
            loops = sch.get_loops(b)
            numel = math.prod(lp.extent for lp in loops)
            if len(loops) > 1 and config["parallel"] != "none" and numel >= PARALLEL_MIN_WORK:
                sch.parallel(fuse_loops(sch, loops[:-1]))

    def _simple(self, sch: Schedule, mm: Block, epi: Block, config: Config) -> Schedule:
        """Shapes without both an M and an N axis (e.g. matrix-vector): parallel outer loop, serial K."""
        loops = sch.get_loops(mm)
        sp = [lp for lp, iv in zip(loops, mm.iter_vars) if iv.kind == "S"]
        k = [lp for lp, iv in zip(loops, mm.iter_vars) if iv.kind == "R"]
        if sp:
            sch.reverse_compute_at(epi, sp[-1])
            sch.decompose_reduction(mm, k[0])
            if config["parallel"] != "none":
                sch.parallel(sp[0])
        return sch

    def _tile(self, sch: Schedule, view: GemmView, epi: Block, config: Config) -> None:
        mm = view.block
        self._acc_layout_n_last(sch, mm, view.n_dims)
        mr, nr, v = config["mr"], config["nr"], config["vector"]
        mc, nc = mr * config["mc_tiles"], nr * config["nc_tiles"]
        outer_m, outer_n = view.m[:-1], view.n[:-1]
        m_o, m_m, m_r = sch.split(view.m[-1], [None, max(1, mc // mr), mr])
        n_o, n_m, n_r = sch.split(view.n[-1], [None, max(1, nc // nr), nr])
        k_loops = view.k
        # several reduction axes (a convolution's c, kh, kw) stay separate loops: fusing them would put
        # division and modulo into every operand load of the micro-kernel
        k = k_loops[0]
        mid = [n_m, m_m] if config["order"] == "nm" else [m_m, n_m]
        if config["parallel"] == "batch_m":
            top = [*view.batch, *outer_m, *outer_n, m_o, n_o]
        else:
            top = [*view.batch, *outer_m, *outer_n, n_o, m_o]
        sch.reorder(*top, *mid, *k_loops, m_r, n_r)
        tile_loop = mid[-1]
        sch.reverse_compute_at(epi, tile_loop)
        init = sch.decompose_reduction(mm, k)
        for small in k_loops[1:]:  # a convolution window (kh, kw): unroll it whole
            if small.extent <= 7:
                sch.unroll(small)
        if config["unroll_k"] > 1 and len(k_loops) == 1:
            _, ku = sch.split(k, [None, config["unroll_k"]])
            sch.unroll(ku)
        n_rv, n_v = sch.split(n_r, [None, v])
        if v > 1:
            sch.vectorize(n_v)
        sch.unroll(n_rv)
        sch.unroll(m_r)
        self._vector_tile(sch, init, v, nr)
        self._vector_tile(sch, epi, v, nr, view.n_dims[-1] if view.n_dims else None)
        # weights packed once, at compile time (not when A reads the same parameter: its loads would move too)
        if config["pack_b"] == 2 and view.b_ndim is not None and view.a is not view.b:
            sch.transform_input_layout(view.b, TilePack(view.b_ndim, nr, pad_to=nc))
            if view.n_extent % nr:
                self._pad_lanes(sch, (mm, init))
        elif config["pack_b"]:
            at = top[-2] if config["parallel"] == "batch_n" else top[-1]
            pack = self._pack(sch, mm, view, "b", nr, at)
            if view.b_ndim is not None and view.n_extent % nr and pack.predicate is not None:
                # N tail: zero-pad the packed panel so the micro-kernel never predicates a vector lane
                lane = next(
                    (
                        lp
                        for lp in reversed(sch.get_loops(pack))
                        if lp.var in free_vars(pack.bindings[view.b_ndim])
                    ),
                    None,
                )
                if lane is not None:
                    sch.pad(pack, lane, fill=0.0)
                    self._pad_lanes(sch, (mm, init))
        if config["pack_a"] and view.a_mdim is not None:
            self._pack(sch, mm, view, "a", mr, m_o)
        if config["parallel"] != "none":
            par = top[: len(top) - 1]
            fused = fuse_loops(sch, par)
            if fused is not None and fused.extent > 1:
                sch.parallel(fused)

    @staticmethod
    def _pad_lanes(sch: Schedule, blocks: tuple[Block, ...]) -> None:
        """Let the micro-kernel and its accumulator init run whole tiles (their innermost loop is the N lane
        loop); only the epilogue keeps the N guard."""
        for b in blocks:
            lane = sch.get_loops(b)[-1]
            if b.predicate is not None and lane.var in free_vars(b.predicate):
                sch.pad(b, lane)

    def _vector_tile(self, sch: Schedule, block: Block, v: int, nr: int, n_dim: int | None = None) -> None:
        """Walk a register tile (the accumulator init, or the epilogue) N-innermost: vectorize the N loop
        and unroll everything else, so every index into the accumulator is a constant and it stays in
        registers. ``n_dim`` names the iteration variable of the N axis when it is not already innermost."""
        loops = sch.get_loops(block)
        if n_dim is not None:
            n_vars = free_vars(block.bindings[n_dim])
            n_loop = next((lp for lp in reversed(loops) if lp.var in n_vars), None)
            if n_loop is not None and n_loop is not loops[-1] and n_loop.extent == nr:
                tile_loops = [lp for lp in loops if lp.extent > 1 and lp in loops[-2:]]
                if n_loop in tile_loops and len(tile_loops) == 2:
                    sch.reorder(*[lp for lp in tile_loops if lp is not n_loop], n_loop)
                    loops = sch.get_loops(block)
        inner = [lp for lp in loops if lp.extent in (nr,) and lp is loops[-1]]
        if not inner:
            return
        rows = loops[-2] if len(loops) >= 2 and loops[-2].extent <= 16 else None
        lv, vv = sch.split(inner[0], [None, v])
        if v > 1:
            sch.vectorize(vv)
        sch.unroll(lv)
        if rows is not None and rows.kind == "serial":
            sch.unroll(rows)

    def _pack(self, sch: Schedule, mm: Block, view: GemmView, side: str, tile: int, at: For) -> Block:
        """Copy the panel of operand ``side`` ("a" or "b") used under loop ``at`` into a buffer laid out
        [.., axis/tile, .., tile]. When A and B are views of one buffer (Q and K sliced from one fused
        projection) only that side's loads read the copy; the other side keeps reading the buffer itself
        (the copy only reads it, so the alias is safe)."""
        buf, axis = (view.a, view.a_mdim) if side == "a" else (view.b, view.b_ndim)
        mine = G.product_sides(mm)[0 if side == "a" else 1]

        def on_this_side(ld: Load) -> bool:
            return any(structural_equal(ld, x) for x in mine)

        pack = sch.cache_read(mm, buf, "global", only=on_this_side if view.a is view.b else None)
        sch.compute_at(pack, at)
        if axis is None:
            return pack
        cache = A.writes(pack)[0]
        rank = len(cache.shape)
        shape = list(cache.shape)
        others = [d for d in range(rank) if d != axis]
        new_shape = [-(-shape[axis] // tile), *(shape[d] for d in others), tile]

        def index_map(*idx):
            return [idx[axis] // tile, *(idx[d] for d in others), idx[axis] % tile]

        sch.transform_layout(cache, index_map, new_shape)
        # when the copy's innermost loop runs along the packed axis, both sides are contiguous: vectorize
        loops = sch.get_loops(pack)
        binding = pack.bindings[axis]
        if loops and loops[-1].var in free_vars(binding) and loops[-1].extent % tile == 0 and tile > 1:
            _outer, inner = sch.split(loops[-1], [None, tile])
            lanes = max(x for x in (1, 4, 8, 16) if tile % x == 0)
            if lanes > 1:
                _, lane = sch.split(inner, [None, lanes])
                sch.vectorize(lane)
        return pack


# What one more M cache block costs its thread, in rows of the block's work: each block streams the whole
# B panel (K x NC) again and, with B packed per call, packs it again; a row of the block costs 2 K NC flops.
# Their ratio is about twice the core's flop rate over its L2 bandwidth, independent of K and NC. Measured on
# an AVX-512 Xeon, 2 threads, [M, 512] x [512, 512]: a block cost as much as ~15 rows (mc_tiles 1 -> 32 at
# M = 1026: 4.58 -> 1.95 ms, while the busiest thread's rows grow 520 -> 768; scripts/bench_m_blocks.py).
BLOCK_ROWS = 16


def _balanced_tiles(cap: int, extent: int, tile: int, batch: int, cores: int) -> int:
    """The cache-block tile count (a knob value up to ``cap``) whose blocks, dealt out statically to
    ``cores`` threads, give the busiest thread the least work: its rows plus ``BLOCK_ROWS`` per block (M =
    256 in 6-row tiles: 96-row blocks make 3 blocks, one thread doing 192 rows; 48-row blocks make 6, 144
    rows each; 12-row blocks would make 22 but cost 11 blocks per thread); the larger count on ties."""

    def busiest(t: int) -> int:
        blocks = -(-batch * -(-extent // (tile * t)) // cores)
        return blocks * tile * t + blocks * BLOCK_ROWS

    values = [t for t in (1, 2, 4, 8, 16, 32) if t <= cap] or [1]
    return min(values, key=lambda t: (busiest(t), -t))


def _tiles_within(cap: int, extent: int, tile: int) -> int:
    """The largest knob value (1, 2, 4 ... 32) not above ``cap``, preferring one whose cache block
    (value x tile) divides ``extent`` so no tail guard is needed."""
    values = [t for t in (1, 2, 4, 8, 16, 32) if t <= cap] or [1]
    dividing = [t for t in values if extent % (t * tile) == 0]
    return max(dividing) if dividing else max(values)
