"""The CUDA contraction sketch: matmul / batch_matmul / conv2d with a fused epilogue.

Knobs ``bm``, ``bn`` (block tile of C), ``bk`` (K slice staged in shared memory), ``tm``, ``tn``
(register tile per thread), ``vector`` (width of the cooperative global loads), ``double_buffer``.
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
"""

from __future__ import annotations

from compiler.backends import group_analysis as G
from compiler.backends.cuda.sketches.common import cooperative, localize, thread_per_element
from compiler.backends.group_analysis import GemmView, gemm_view
from compiler.backends.sketch import Config, Knob, Sketch, contraction_stages, prepare
from compiler.errors import ScheduleError
from compiler.fusion import Group
from compiler.loopir import analysis as A
from compiler.loopir.expr import IterVar, Load, Select, free_vars, walk
from compiler.loopir.schedule import Schedule
from compiler.loopir.stmt import Block, Buffer, For
from compiler.target import Target

SIMPLE_THREADS = 128


class CudaContractionSketch(Sketch):
    """Contraction groups on the GPU: shared-memory tiles of A and B, a register tile of C per thread."""

    name = "contraction"
    version = 1
    kinds = ("contraction",)

    def space(self, group: Group, target: Target) -> list[Knob]:
        return [
            Knob("bm", (32, 64, 128, 256), "rows of C per thread block"),
            Knob("bn", (32, 64, 128, 256), "columns of C per thread block"),
            Knob("bk", (8, 16, 32, 64), "K slice staged in shared memory"),
            Knob("tm", (1, 2, 4, 8), "rows of C per thread (register tile)"),
            Knob("tn", (1, 2, 4, 8), "columns of C per thread (register tile)"),
            Knob("vector", (1, 2, 4), "vector width of global loads"),
            Knob("double_buffer", (0, 1), "double-buffer the shared-memory tiles"),
        ]

    def check_combination(self, group: Group, config: Config, target: Target) -> None:
        threads = (config["bm"] // config["tm"]) * (config["bn"] // config["tn"])
        if threads > target.max_threads_per_block or threads < 32:
            raise ScheduleError(
                f"contraction: {threads} threads per block is outside [32, {target.max_threads_per_block}]"
            )
        smem = (config["bm"] + config["bn"]) * config["bk"] * 4 * (2 if config["double_buffer"] else 1)
        if smem > target.max_shared_bytes_optin:
            raise ScheduleError(f"contraction: {smem} bytes of shared memory exceed the device limit")

    def default(self, group: Group, target: Target) -> Config:
        m_ext, n_ext = G.anchor_extents(group)
        if m_ext >= 512 and n_ext >= 512 and not G.is_conv(group):
            # large GEMMs: 128x128 block tiles, 8x8 per thread, prefetching double buffer
            # (nvcc: 128 registers, 32 KiB shared, no spills on sm_90)
            return {"bm": 128, "bn": 128, "bk": 16, "tm": 8, "tn": 8, "vector": 4, "double_buffer": 1}
        return {"bm": 64, "bn": 64, "bk": 16, "tm": 4, "tn": 4, "vector": 4, "double_buffer": 0}

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
    sch.bind(mb, "blockIdx.y")
    sch.bind(nb, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    sch.unroll(ki)
    for lp in inner_k:
        if lp.extent <= 8:
            sch.unroll(lp)
    sch.unroll(mi)
    sch.unroll(ni)
    acc = A.writes(mm)[0]
    init = sch.decompose_reduction(mm, ko)
    _bind_init(sch, init)
    staged = False
    for operand, tiled in ((view.a, m_iv), (view.b, n_iv)):
        axes = _stage_axes(mm, operand, tiled)
        if axes is None:
            continue
        staged = True
        copy = sch.cache_read(mm, operand, "shared")
        sch.compute_at(copy, ko)
        cache = A.writes(copy)[0]
        d_mn, d_k = axes
        perm = [d for d in range(len(cache.shape)) if d not in axes] + [d_k, d_mn]
        sch.transform_layout(
            cache, lambda *idx, perm=perm: [idx[d] for d in perm], [cache.shape[d] for d in perm]
        )
        cooperative(sch, copy, ko, ny, nx, config["vector"])
    if staged and config["double_buffer"]:
        ko.annotations["double_buffer"] = 1  # lowered by compiler.backends.cuda.lower
    sch.reverse_compute_at(epi, nb)
    _bind_epilogue(sch, mm, epi, acc, m_iv, n_iv, ny, nx, tm, tn)


def _iter_var(block: Block, loop: For) -> IterVar | None:
    for iv, e in zip(block.iter_vars, block.bindings):
        if e is loop.var or loop.var in free_vars(e):
            return iv
    return None


def _bind_init(sch: Schedule, init: Block) -> None:
    """The accumulator init copies the (ty, tx, i, j) loops serially: bind them like the main loop."""
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
    sch.bind(ety, "threadIdx.y")
    sch.bind(etx, "threadIdx.x")
    sch.unroll(emi)
    sch.unroll(eni)


def _stage_axes(mm: Block, operand: Buffer, tiled: IterVar | None) -> tuple[int, int] | None:
    """(axis indexed by the tiled M/N variable, axis indexed by the K variable) of ``operand`` when every
    load of it indexes them on separate axes, no other axis uses them, and no load is under a select."""
    r_vars = [iv.var for iv in mm.iter_vars if iv.kind == "R"]
    if tiled is None or len(r_vars) != 1:
        return None
    kv, mv = r_vars[0], tiled.var
    found: set[tuple[int, int]] = set()
    for st in A.block_stores(mm):
        if _under_select(st.value, operand):
            return None
        for ld in walk(st.value):
            if not (isinstance(ld, Load) and ld.buffer is operand):
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
