"""The CUDA contraction sketch: matmul / batch_matmul / conv2d with a fused epilogue.

Knobs ``bm``, ``bn`` (block tile of C), ``bk`` (K slice staged in shared memory), ``tm``, ``tn``
(register tile per thread), ``vector`` (width of the cooperative global loads), ``double_buffer``,
``min_blocks`` (occupancy: ``__launch_bounds__(threads, min_blocks)``), ``smem_pad`` (floats of padding
per row of a transposed shared tile), ``group_m`` (grouped block order), ``warp_rows`` (warp tiling),
``swizzle`` (rotated 4-float chunks of a transposed shared tile, the alternative to ``smem_pad``) and
``stages`` (a cp.async ring of shared tiles on sm_80+, the alternative to ``double_buffer``).
The classic shared-memory SGEMM, written with the primitives::

    blockIdx.z  batch and outer M/N loops (fused)
    blockIdx.y  mb ; blockIdx.x nb                        C tile [bm, bn]
      threadIdx.y ty, threadIdx.x tx: acc[tm][tn] = 0      (decompose_reduction, registers)
      for ko in K / bk:                                    (double_buffer: one stage ahead, one barrier)
        As[bk][bm] = A[mb*bm.., ko*bk..]                   (cache_read -> shared, all threads, float4 loads)
        Bs[bk][bn] = B[ko*bk.., nb*bn..]                   (k-major layouts: transform_layout)
        __syncthreads()
        threadIdx.y ty, threadIdx.x tx:
          for ki in bk: for i in tm: for j in tn:          (unrolled; Bs/As rows read as float4)
            acc[i][j] += As[ki][ty*tm + i] * Bs[ki][tx*tn + j]
      threadIdx.y ty, threadIdx.x tx: for i, j:            (reverse_compute_at: epilogue on registers)
        C[m, n] = epilogue(acc[i][j], bias[n], residual[m, n] ...)

The tiled axes are the innermost M and N loops (like the CPU sketch); batch dims and outer M/N loops
(conv2d's batch and output rows) go to blockIdx.z. An operand is staged in shared memory only when each
of its loads indexes it with the M (or N) and K variables on separate axes and outside any select
(padding); conv2d's image and its fused (c, kh, kw) weight axis are read from global memory (L1-cached),
the simpler conv schedule. Shapes without an M or N loop (matrix-vector) get one output per thread.

Occupancy, bank conflicts, block order:

* ``min_blocks`` = B asks ptxas for B resident blocks per SM (``func.attrs["min_blocks_per_sm"]``, printed
  as the second ``__launch_bounds__`` argument): registers per thread are capped at 65536 / (threads x B);
  ``check`` keeps threads x B and shared bytes x B within the SM (2048 threads on sm_80/sm_90, 1536 on
  sm_86/sm_89; shared memory: the opt-in limit + 1 KiB);
* ``smem_pad`` = P lays a transposed tile (A read [m][k], stored [k][m]) out as [bk][bm + P]: the
  cooperative copy's stores, a warp's 32 threads writing a column of it, fall into different banks
  (:func:`transposed_store_conflicts` counts the ways: 128x16 tiles with float4 loads: 4-way at P=0,
  2-way at P=4, conflict-free at P=2). P = 1 or 2 costs the float4 reads of the register tile (float2 or
  scalar instead); the default takes the better of P = 0 and P = 4 (both keep float4 reads);
* ``group_m`` = G launches the output tiles in groups of G block rows (blockIdx.x = (mg, nb, mi) fused, M
  tile = mg*G + mi), so consecutive blocks share B tiles in L2 (Triton's grouped ordering); G must divide
  the number of block rows.

* ``warp_rows`` = r splits the [bm/tm, bn/tn] thread grid into warps of r x 32/r threads
  (:func:`_bind_threads`): a warp then reads r*tm rows of the A tile and 32/r*tn columns of the B tile per
  k step, fewer distinct shared words than the 1 or 2 rows of a row-major warp;
* ``swizzle`` = s stores element m of row k of a transposed tile at chunk ``(m/4 + (k/g)*s) mod (M/4)``
  (``lower.swizzle_shared``, after compaction; g = k values one thread stores per copy step): the
  cooperative stores become conflict-free (``transposed_store_conflicts(..., swizzle=s)``) while the
  register tile's float4 reads stay whole chunks. The loop IR has no XOR, so it is a rotation.

* ``stages`` = S >= 2 (sm_80+; sketch version 4) replaces the register-staged double buffer by a ring of S
  shared tiles filled with ``cp.async`` (``pipeline.cp_async_pipeline``): S-1 tiles in flight, one
  ``cp.async.wait_group(S-2)`` + barrier per K step. A tile stored as the operand is laid out (B [k][n]
  of a plain matmul) is copied ``vector`` floats (4, 8 or 16 bytes) per copy; a transposed tile (A
  [m][k] stored [k][m]) one float (4 bytes) per copy, as CUTLASS's SIMT multistage kernels do. Legal
  (``check``) on float32 tiles, when no tile is a double buffer, some operand is staged, and each vector
  copy's global rows are a whole number of vectors (aligned addresses). Below sm_80 the knob is fixed to 1.

Split-K is not built: partial sums across blocks need a global workspace (or atomics into a zeroed output)
and the runtime passes a kernel only its group's buffers.

Block tiles never exceed the M/N extent's next power of two (at least 32: ``tile_cap``); a larger tile only
adds idle threads (a 128x128 conv tile over 16 output columns made cicc run for minutes). The default
picks, among 128x128 / 64x64 / 64x32 / 32x64 / 32x32 block tiles, the largest one that still gives
every SM a block (BERT's 128x768 projections: 32x32 tiles, 96 blocks, instead of 24 at 64x64).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from compiler import dtypes
from compiler.backends import group_analysis as G
from compiler.backends.cuda.lower import SMEM_PAD, SMEM_SWIZZLE, SWIZZLE_CHUNK
from compiler.backends.cuda.pipeline import CP_ASYNC_STAGES
from compiler.backends.cuda.sketches.common import cooperative, localize, thread_per_element
from compiler.backends.group_analysis import GemmView, gemm_view
from compiler.backends.sketch import Config, Knob, Sketch, contraction_stages, prepare
from compiler.errors import ScheduleError
from compiler.fusion import Group
from compiler.loopir import analysis as A
from compiler.loopir.expr import IterVar, Load, Select, free_vars, structural_equal, walk
from compiler.loopir.schedule import Schedule
from compiler.loopir.stmt import Block, Buffer, For
from compiler.target import Target

SIMPLE_THREADS = 128
THREADS_PER_SM = {"sm_86": 1536, "sm_87": 1536, "sm_89": 1536}  # others (sm_70/75/80/90): 2048
BANKS = 32
WARP = 32
STAGES = (1, 2, 3, 4)  # 1: no cp.async ring (double_buffer decides)
DEFAULT_STAGES = 3  # large GEMMs on sm_80+ (unmeasured: no GPU)


def sm_version(target: Target) -> int:
    """The compute capability of a CUDA target as a number (sm_90a -> 90; 0 when unknown)."""
    try:
        return int(target.arch.split("_")[1].rstrip("a")) if target.kind == "cuda" else 0
    except (IndexError, ValueError):
        return 0


def cp_async_target(target: Target) -> bool:
    """Whether the target has cp.async (sm_80 and newer)."""
    return sm_version(target) >= 80


def tile_cap(extent: int) -> int:
    """The largest legal block tile along an axis of ``extent``: its next power of two, at least 32."""
    return max(32, 1 << (extent - 1).bit_length())


def threads_per_sm(target: Target) -> int:
    return THREADS_PER_SM.get(target.arch, 2048)


def swizzled(m: int, k: int, rows: int, group: int, step: int) -> int:
    """Where ``lower.swizzle_shared`` stores element m of row k of a [bk][rows] tile."""
    c = SWIZZLE_CHUNK
    return ((m // c + (k // group) * step) % (rows // c)) * c + m % c


def transposed_store_conflicts(
    rows: int, bk: int, vector: int, pad: int, threads: int, swizzle: int = 0
) -> int:
    """Worst bank-conflict degree (ways) of the shared stores of one warp in the cooperative copy of a
    [rows, bk] tile (element f = (step*threads + thread)*vector + lane, m = f // bk, k = f % bk) into a
    [bk][rows + pad] layout, its rows' chunks rotated by ``swizzle`` per group of ``vector`` k values:
    the number of distinct 4-byte words one bank serves in one store."""
    worst = 1
    v = vector if (rows * bk) % vector == 0 else 1
    steps = -(-(rows * bk) // (threads * v))
    for step in range(steps):
        for lane in range(v):
            banks: dict[int, set[int]] = {}
            for t in range(min(32, threads)):
                f = (step * threads + t) * v + lane
                if f >= rows * bk:
                    continue
                m, k = divmod(f, bk)
                col = swizzled(m, k, rows, v if bk % v == 0 else 1, swizzle) if swizzle else m
                addr = k * (rows + pad) + col
                banks.setdefault(addr % BANKS, set()).add(addr)
            if banks:
                worst = max(worst, max(len(a) for a in banks.values()))
    return worst


# the large-GEMM default's block tiles, in order of preference
LARGE_TILES = ((128, 128, 8, 8), (128, 64, 8, 4), (64, 128, 4, 8), (64, 64, 4, 4))  # (bm, bn, tm, tn)


class CudaContractionSketch(Sketch):
    """Contraction groups on the GPU: shared-memory tiles of A and B, a register tile of C per thread."""

    name = "contraction"
    version = 4  # 3: warp_rows, swizzle; 4: stages (cp.async ring)
    kinds = ("contraction",)

    def __init__(self) -> None:
        self._staged: dict[str, list[StagedTile]] = {}

    def space(self, group: Group, target: Target) -> list[Knob]:
        return [
            Knob("bm", (32, 64, 128, 256), "rows of C per thread block"),
            Knob("bn", (32, 64, 128, 256), "columns of C per thread block"),
            Knob("bk", (8, 16, 32, 64), "K slice staged in shared memory"),
            Knob("tm", (1, 2, 4, 8), "rows of C per thread (register tile)"),
            Knob("tn", (1, 2, 4, 8), "columns of C per thread (register tile)"),
            Knob("vector", (1, 2, 4), "vector width of global loads"),
            Knob("double_buffer", (0, 1), "double-buffer the shared-memory tiles"),
            Knob("min_blocks", (1, 2, 3, 4), "resident blocks per SM asked of ptxas (__launch_bounds__)"),
            Knob("smem_pad", (0, 1, 2, 4), "floats of padding per row of a transposed shared tile"),
            Knob("group_m", (1, 4, 8), "block rows per group of the grouped launch order"),
            Knob("warp_rows", (0, 2, 4, 8), "warp tile: 0 row-major threads, r: warps of r x 32/r threads"),
            Knob("swizzle", (0, 1, 2, 4), "4-float chunks a transposed shared row rotates per k group"),
            Knob(
                "stages",
                STAGES if cp_async_target(target) else (1,),
                "shared stages of a cp.async ring (sm_80+; 1: none, double_buffer decides)",
            ),
        ]

    def check_combination(self, group: Group, config: Config, target: Target) -> None:
        m_ext, n_ext = G.anchor_extents(group)
        for knob, ext, axis in (("bm", m_ext, "M"), ("bn", n_ext, "N")):
            if config[knob] > tile_cap(ext):
                raise ScheduleError(
                    f"contraction: {knob} {config[knob]} exceeds the {axis} extent {ext} "
                    f"(tiles up to {tile_cap(ext)}: a larger one only adds idle threads)"
                )
        threads = (config["bm"] // config["tm"]) * (config["bn"] // config["tn"])
        if threads > target.max_threads_per_block or threads < 32:
            raise ScheduleError(
                f"contraction: {threads} threads per block is outside [32, {target.max_threads_per_block}]"
            )
        pad = config["smem_pad"]
        copies = config["stages"] if config["stages"] > 1 else (2 if config["double_buffer"] else 1)
        smem = (config["bm"] + config["bn"] + 2 * pad) * config["bk"] * 4 * copies
        if smem > target.max_shared_bytes_optin:
            raise ScheduleError(
                f"contraction: {smem} bytes of shared memory exceed the device limit"
                + (f" (stages {config['stages']})" if config["stages"] > 1 else "")
            )
        if config["stages"] > 1:
            self._check_stages(group, config, target)
        blocks = config["min_blocks"]
        if threads * blocks > threads_per_sm(target):
            raise ScheduleError(
                f"contraction: min_blocks {blocks} x {threads} threads exceed the {threads_per_sm(target)} "
                f"threads of an SM ({target.arch})"
            )
        if smem * blocks > target.max_shared_bytes_optin + 1024:
            raise ScheduleError(
                f"contraction: min_blocks {blocks} x {smem} bytes of shared memory exceed an SM's"
            )
        if config["swizzle"] and config["smem_pad"]:
            raise ScheduleError("contraction: swizzle and smem_pad are alternatives (one of them must be 0)")
        r = config["warp_rows"]
        ny, nx = config["bm"] // config["tm"], config["bn"] // config["tn"]
        if r and (ny % r or nx % (WARP // r)):
            raise ScheduleError(
                f"contraction: warp_rows {r} needs the {ny} x {nx} threads to split into warps of "
                f"{r} x {WARP // r}"
            )
        g = config["group_m"]
        if g > 1:
            rows = -(-m_ext // config["bm"])
            if rows % g:
                raise ScheduleError(
                    f"contraction: group_m {g} does not divide the {rows} block rows (M {m_ext})"
                )

    def staged_tiles(self, group: Group) -> list[StagedTile]:
        """The operands the schedule stages in shared memory (memoized by workload key: ``check`` runs for
        every sampled config)."""
        key = group.workload_key
        if key not in self._staged:
            sch, blocks = prepare(group)
            mm, _ = contraction_stages(sch, blocks)
            view = gemm_view(sch, mm)
            tiles = []
            if view.m and view.n:
                for operand, loop in ((view.a, view.m[-1]), (view.b, view.n[-1])):
                    axes = _stage_axes(mm, operand, _iter_var(mm, loop))
                    if axes is not None:
                        tiles.append(StagedTile(operand.name, operand.shape, operand.dtype, *axes))
            self._staged[key] = tiles
        return self._staged[key]

    def _check_stages(self, group: Group, config: Config, target: Target) -> None:
        """``stages`` > 1 needs sm_80, no double buffer, and tiles cp.async can copy: float32 elements,
        and 4/8/16-byte aligned vectors (each copy's global rows a whole number of ``vector`` floats)."""
        s = config["stages"]
        if not cp_async_target(target):
            raise ScheduleError(f"contraction: stages {s} needs cp.async (sm_80 or newer), not {target.arch}")
        if config["double_buffer"]:
            raise ScheduleError(
                f"contraction: stages {s} (a cp.async ring) and double_buffer 1 (register staging) are "
                "alternatives: set one of them to its plain value (stages 1 or double_buffer 0)"
            )
        tiles = self.staged_tiles(group)
        if not tiles:
            raise ScheduleError(
                f"contraction: stages {s} needs shared-memory tiles; {group.name} stages no operand "
                "(conv2d and matrix-vector shapes read global memory)"
            )
        for t in tiles:
            if dtypes.info(t.dtype).itemsize != 4:
                raise ScheduleError(
                    f"contraction: stages {s} copies float32 tiles (cp.async moves 4, 8 or 16 bytes); "
                    f"{t.name} is {t.dtype}"
                )
            v = config["vector"]
            if t.vector_copy and v > 1 and t.shape[-1] % v:
                raise ScheduleError(
                    f"contraction: stages {s} needs {4 * v}-byte aligned cp.async copies: the rows of "
                    f"{t.name} ({t.shape[-1]} floats) are not a multiple of vector {v} "
                    "(use vector 1 or stages 1)"
                )

    def default(self, group: Group, target: Target) -> Config:
        m_ext, n_ext = G.anchor_extents(group)
        extra = {"min_blocks": 1, "group_m": 1, "warp_rows": 0, "swizzle": 0, "stages": 1}
        batch = G.reduce_and_batch(group)[1]

        def blocks(bm: int, bn: int) -> int:
            return batch * -(-m_ext // bm) * -(-n_ext // bn)

        def whole(bm: int, bn: int) -> bool:
            # tiles that divide M and N: a partial tile at the edge made the H200 run the whole kernel
            # 3-10x slower (benchmarks/cost_model_cuda_search.md, docs/cuda.md: on 19 of 19 random GEMMs'
            # uniform pools the configs with partial tiles had a 3.45x slower median)
            return m_ext % bm == 0 and n_ext % bn == 0

        if m_ext >= 512 and n_ext >= 512 and not G.is_conv(group):
            # large GEMMs: 128x128 block tiles, 8x8 per thread, prefetching double buffer
            # (nvcc: 128 registers, 32 KiB shared, no spills on sm_90); when 128 does not divide M or N,
            # the largest smaller whole tile that gives every SM a block (else the largest whole one)
            tile = {"bm": 128, "bn": 128, "bk": 16, "tm": 8, "tn": 8, "vector": 4, "double_buffer": 1}
            if not whole(128, 128):
                wholes = [t for t in LARGE_TILES[1:] if whole(t[0], t[1])]
                filling = [t for t in wholes if blocks(t[0], t[1]) >= target.cores]
                pick = (filling or wholes or [None])[0]
                if pick is not None:
                    tile.update(bm=pick[0], bn=pick[1], tm=pick[2], tn=pick[3])
        else:
            tile = {"bm": 64, "bn": 64, "bk": 16, "tm": 4, "tn": 4, "vector": 4, "double_buffer": 0}
            # small grids (BERT's 128 x 768 projections): smaller tiles until every SM gets a block,
            # whole tiles first; tiles never exceed the extents' caps (check)
            fits = [
                (bm, bn, tm, tn)
                for bm, bn, tm, tn in ((64, 64, 4, 4), (64, 32, 4, 2), (32, 64, 2, 4), (32, 32, 2, 2))
                if bm <= tile_cap(m_ext) and bn <= tile_cap(n_ext)
            ]  # (32, 32) always fits
            if G.is_conv(group):  # not measured with partial tiles: the first tile, as before
                pick = fits[0]
            else:
                filling = [f for f in fits if blocks(f[0], f[1]) >= target.cores]
                pick = next((f for f in filling if whole(f[0], f[1])), filling[0] if filling else fits[-1])
            tile.update(bm=pick[0], bn=pick[1], tm=pick[2], tn=pick[3])
        threads = (tile["bm"] // tile["tm"]) * (tile["bn"] // tile["tn"])
        pad = min((0, 4), key=lambda p: transposed_store_conflicts(tile["bm"], tile["bk"], 4, p, threads))
        config = {**tile, **extra, "smem_pad": pad}
        if tile["double_buffer"] and cp_async_target(target):
            # sm_80+: a 3-stage cp.async ring instead of the register double buffer when check allows it
            # (float32 tiles, aligned rows, the shared memory of 3 stages); unmeasured (no GPU)
            staged = {**config, "double_buffer": 0, "stages": DEFAULT_STAGES}
            try:
                self.check(group, staged, target)
                config = staged
            except ScheduleError:
                pass
        return config

    def build(self, group: Group, config: Config, target: Target) -> Schedule:
        self.check(group, config, target)
        sch, blocks = prepare(group)
        mm, epi = contraction_stages(sch, blocks)
        view = gemm_view(sch, mm)
        if not view.m or not view.n:
            _per_output(sch, mm, epi)
        else:
            _tile(sch, view, epi, config)
        localize(sch)
        return sch


def _per_output(sch: Schedule, mm: Block, epi: Block) -> None:
    """One output element per thread, serial K (matrix-vector shapes)."""
    spatial = sch.get_loops(epi)[: G.n_spatial(epi)]
    tx = thread_per_element(sch, spatial, SIMPLE_THREADS, "contraction (cuda): a scalar output")
    sch.compute_at(mm, tx)


def _tile(sch: Schedule, view: GemmView, epi: Block, config: Config) -> None:
    mm = view.block
    bm, bn, bk, tm, tn = config["bm"], config["bn"], config["bk"], config["tm"], config["tn"]
    ny, nx = bm // tm, bn // tn
    outer = [*view.batch, *view.m[:-1], *view.n[:-1]]
    m_iv, n_iv = _iter_var(mm, view.m[-1]), _iter_var(mm, view.n[-1])
    if m_iv is None or n_iv is None:
        raise ScheduleError(
            f"contraction (cuda): the M/N loops of {mm.name} are not plain iteration variables"
        )
    mb, ty, mi = sch.split(view.m[-1], [None, ny, tm])
    nb, tx, ni = sch.split(view.n[-1], [None, nx, tn])
    # the outermost K loop is tiled; inner K loops (conv2d's kh, kw) stay whole: simple indices
    ko, ki = sch.split(view.k[0], [None, bk])
    inner_k = view.k[1:]
    sch.reorder(*outer, mb, nb, ko, ty, tx, ki, *inner_k, mi, ni)
    zb = sch.fuse(*outer) if len(outer) > 1 else (outer[0] if outer else None)
    if zb is not None:
        sch.bind(zb, "blockIdx.z")
    g = config["group_m"]
    if g > 1 and mb.extent % g == 0 and mb.extent > g:
        mg, mi_b = sch.split(mb, [None, g])
        sch.reorder(mg, nb, mi_b)
        nb = sch.fuse(mg, nb, mi_b)  # the epilogue is placed under this one block loop
        sch.bind(nb, "blockIdx.x")
    else:
        sch.bind(mb, "blockIdx.y")
        sch.bind(nb, "blockIdx.x")
    if config["min_blocks"] > 1:
        sch.func.attrs["min_blocks_per_sm"] = config["min_blocks"]
    warp = config["warp_rows"]
    _bind_threads(sch, ty, tx, warp)
    sch.unroll(ki)
    for lp in inner_k:
        if lp.extent <= 8:
            sch.unroll(lp)
    sch.unroll(mi)
    sch.unroll(ni)
    acc = A.writes(mm)[0]
    init = sch.decompose_reduction(mm, ko)
    _bind_init(sch, init)
    threads_y, threads_x = (ny // warp, (nx // (WARP // warp)) * WARP) if warp else (ny, nx)
    staged = False
    sides = G.product_sides(mm) if view.a is view.b else ([], [])
    for (operand, tiled), mine in zip(((view.a, m_iv), (view.b, n_iv)), sides):
        # two views of one buffer (x @ x^T, Q and K slices of a merged Q/K/V output): each side is staged
        # apart, only its own loads read its tile (the copies only read the buffer, so they may alias it)
        own = (lambda ld, mine=mine: any(structural_equal(ld, x) for x in mine)) if view.a is view.b else None
        axes = _stage_axes(mm, operand, tiled, own)
        if axes is None:
            continue
        staged = True
        copy = sch.cache_read(mm, operand, "shared", only=own)
        sch.compute_at(copy, ko)
        cache = A.writes(copy)[0]
        d_mn, d_k = axes
        perm = [d for d in range(len(cache.shape)) if d not in axes] + [d_k, d_mn]
        sch.transform_layout(
            cache, lambda *idx, perm=perm: [idx[d] for d in perm], [cache.shape[d] for d in perm]
        )
        if d_mn < d_k and config["smem_pad"]:  # stored transposed: pad its rows against bank conflicts
            # applied to the compacted tile by compiler.backends.cuda.lower (compaction would drop it here)
            sch.func.attrs.setdefault(SMEM_PAD, {})[cache.name] = config["smem_pad"]
        if d_mn < d_k and config["swizzle"]:  # or rotate its rows' 4-float chunks (lower.swizzle_shared)
            group = _copy_k_group(operand, d_k, config["vector"], bk)
            sch.func.attrs.setdefault(SMEM_SWIZZLE, {})[cache.name] = (group, config["swizzle"])
        cooperative(sch, copy, ko, threads_y, threads_x, config["vector"])
    if staged and config["stages"] > 1:
        ko.annotations[CP_ASYNC_STAGES] = config["stages"]  # lowered by compiler.backends.cuda.pipeline
    elif staged and config["double_buffer"]:
        ko.annotations["double_buffer"] = 1  # lowered by compiler.backends.cuda.lower
    sch.reverse_compute_at(epi, nb)
    _bind_epilogue(sch, mm, epi, acc, m_iv, n_iv, ny, nx, tm, tn, warp)


@dataclass(frozen=True)
class StagedTile:
    """An operand the schedule copies into shared memory: its axes indexed by M/N (``d_mn``) and K."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    d_mn: int
    d_k: int

    @property
    def vector_copy(self) -> bool:
        """The copy's vector lanes are consecutive in both memories (the tile keeps the operand's layout,
        M/N innermost); otherwise the copy moves one element at a time."""
        return self.d_mn == len(self.shape) - 1 and self.d_k < self.d_mn


def _copy_k_group(operand: Buffer, d_k: int, vector: int, bk: int) -> int:
    """The k values one thread stores per step of the cooperative copy of a transposed tile (its float4
    lanes when K is the operand's innermost axis): the swizzle rotates chunks per group of them."""
    innermost = d_k == len(operand.shape) - 1
    return vector if innermost and bk % vector == 0 else 1


def _iter_var(block: Block, loop: For) -> IterVar | None:
    for iv, e in zip(block.iter_vars, block.bindings):
        if e is loop.var or loop.var in free_vars(e):
            return iv
    return None


def _bind_threads(sch: Schedule, ty: For, tx: For, warp_rows: int) -> None:
    """Bind the thread-grid loops ``ty`` (extent ny, outer) and ``tx`` (nx) of a [ny, nx] thread tile.

    ``warp_rows`` = 0: ``threadIdx.y = ty``, ``threadIdx.x = tx`` (a warp is 32 consecutive tx, i.e.
    32 / nx rows of nx threads). ``warp_rows`` = r: warp tiling, ty = (wy, ly) and tx = (wx, lx) with
    ly < r and lx < 32 / r; ``threadIdx.y = wy``, ``threadIdx.x = (wx, ly, lx)`` fused, so a warp (32
    consecutive threadIdx.x) is an r x 32/r block of threads: it reads r*tm rows of the A tile and
    32/r*tn columns of the B tile per k step (fewer distinct shared words than a 1 x 32 or 2 x 16 warp)."""
    if not warp_rows:
        sch.bind(ty, "threadIdx.y")
        sch.bind(tx, "threadIdx.x")
        return
    wy, ly = sch.split(ty, [None, warp_rows])
    wx, lx = sch.split(tx, [None, WARP // warp_rows])
    sch.reorder(wy, wx, ly, lx)
    sch.bind(wy, "threadIdx.y")
    sch.bind(sch.fuse(wx, ly, lx), "threadIdx.x")


def _bind_init(sch: Schedule, init: Block) -> None:
    """The accumulator init copies the (thread y, thread x, i, j) loops serially (after warp tiling's
    split and fuse): bind them like the main loop."""
    loops = [lp for lp in sch.get_loops(init) if lp.kind != "thread"]
    if len(loops) < 4:
        raise ScheduleError(f"contraction (cuda): unexpected loops around {init.name}")
    ty, tx, i, j = loops[-4:]
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    sch.unroll(i)
    sch.unroll(j)


def _bind_epilogue(
    sch: Schedule,
    mm: Block,
    epi: Block,
    acc: Buffer,
    m_iv: IterVar,
    n_iv: IterVar,
    ny: int,
    nx: int,
    tm: int,
    tn: int,
    warp_rows: int,
) -> None:
    """Map the [bm, bn] region nest of the epilogue onto the threads exactly as the accumulator tile."""
    s_ivs = [iv for iv in mm.iter_vars if iv.kind == "S"]
    dim_m, dim_n = s_ivs.index(m_iv), s_ivs.index(n_iv)
    ld = next(
        x for st in A.block_stores(epi) for x in walk(st.value) if isinstance(x, Load) and x.buffer is acc
    )
    bind = A.binding_map(epi)
    loops = sch.get_loops(epi)

    def loop_of(dim: int) -> For:
        e = bind.get(ld.indices[dim], ld.indices[dim])  # type: ignore[call-overload]
        hits = [lp for lp in loops if lp.kind != "thread" and lp.var in free_vars(e)]
        if len(hits) != 1:
            raise ScheduleError(f"contraction (cuda): cannot find the tile loop of {epi.name} on axis {dim}")
        return hits[0]

    m_loop, n_loop = loop_of(dim_m), loop_of(dim_n)
    ety, emi = sch.split(m_loop, [ny, tm])
    etx, eni = sch.split(n_loop, [nx, tn])
    order = [lp for lp in sch.get_loops(epi) if lp in (ety, emi, etx, eni)]
    if order != [ety, etx, emi, eni]:
        sch.reorder(ety, etx, emi, eni)
    _bind_threads(sch, ety, etx, warp_rows)
    sch.unroll(emi)
    sch.unroll(eni)


def _stage_axes(
    mm: Block, operand: Buffer, tiled: IterVar | None, only: Callable[[Load], bool] | None = None
) -> tuple[int, int] | None:
    """(axis indexed by the tiled M/N variable, axis indexed by the K variable) of ``operand`` when every
    load of it (``only``: every selected load) indexes them on separate axes, no other axis uses them, and
    no load is under a select."""
    r_vars = [iv.var for iv in mm.iter_vars if iv.kind == "R"]
    if tiled is None or len(r_vars) != 1:
        return None
    kv, mv = r_vars[0], tiled.var
    found: set[tuple[int, int]] = set()
    for st in A.block_stores(mm):
        if _under_select(st.value, operand):
            return None
        for ld in walk(st.value):
            if not (isinstance(ld, Load) and ld.buffer is operand) or (only is not None and not only(ld)):
                continue
            dm = [d for d, i in enumerate(ld.indices) if mv in free_vars(i)]
            dk = [d for d, i in enumerate(ld.indices) if kv in free_vars(i)]
            if len(dm) != 1 or len(dk) != 1 or dm == dk:
                return None
            found.add((dm[0], dk[0]))
    return found.pop() if len(found) == 1 else None


def _under_select(e, operand: Buffer) -> bool:
    for x in walk(e):
        if isinstance(x, Select) and any(isinstance(y, Load) and y.buffer is operand for y in walk(x)):
            return True
    return False
