"""Fixed-length features of a scheduled, lowered loop IR (one vector per candidate).

A candidate (group, config, target) is scheduled by its sketch and lowered *without* explicit unrolling
(the backend's ``lower(..., unroll=False)``: unrolled loops stay loops with their annotation, which is both
what the features want and 3-5x faster than full lowering). :func:`extract` turns the function into
``N_FEATURES`` float32 values, named by :data:`FEATURE_NAMES`:

- ``wl_*`` (13) workload summary: log flops and bytes, intensity, kind one-hot, op and input counts, the
  group's characteristic extents (M/N/K of a contraction, rows and row length of a reduction), its bytes
  over the target's last-level cache.
- ``fn_*`` (14) the function: stores, loops, depth, loop-overhead iterations, OpenMP region entries,
  register/local, shared and global scratch bytes, barriers, vector stores, the fraction of stored bytes
  written non-temporally (streaming stores, see :mod:`cost_model.store_features`) and that fraction times
  ``wl_log_llc`` (streaming a workload that fits the last-level cache, < 0, or overflows it, > 0).
- ``gpu_*`` (14) launch shape: blocks, threads per block, shared bytes, registers per thread (reported by
  the build or estimated, with a flag saying which), occupancy from the target's per-SM limits and what
  bounds it, waves, lane and SM utilization, and over the global accesses the fractions that are coalesced
  / broadcast / strided along ``threadIdx.x`` and their mean vector width.
- ``tot_*`` (11) totals over stores (log): executions, weighted ops, bytes, L1/L2/L3 traffic, load/store
  instructions, compute / latency / issue / memory cycles.
- ``wm_*`` (5) means over stores weighted by their estimated cycles: SIMD lanes credited, parallel speedup,
  dependency chains, contiguous reads, gathers.
- ``r_*`` (3) ratios to the workload's own size, which transfer between workloads: executed flops /
  workload flops (recomputation), L2 and L3 traffic / workload bytes.
- ``est_*`` (3) the analytic estimate: log2 cycles, log2 ideal cycles (roofline of the workload), their
  difference (the schedule's efficiency). :class:`~cost_model.model.AnalyticModel` ranks by
  ``est_log_cycles``.
- ``s{0,1,2}_*`` (3 x 49) the rows of the three most expensive stores (by estimated cycles, ties in
  program order; zeros when there are fewer), see :data:`cost_model.store_features.STORE_FIELDS`.

:data:`FEATURE_VERSION` changes whenever a feature's meaning changes; cached vectors in the tuning
database are keyed by it. :class:`FeatureExtractor` memoizes vectors by (workload, sketch, version,
target, config) so every asked candidate is scheduled and lowered at most once per process.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any

import numpy as np

from compiler.backends import get_backend, get_sketch, sketch_for
from compiler.backends.cpu.codegen import STREAM_FROM, STREAM_STORES
from compiler.backends.sketch import Config
from compiler.canonical import canonical_json
from compiler.errors import KilnError, ScheduleError
from compiler.fusion import Group
from compiler.loopir.stmt import PrimFunc
from compiler.target import Target
from cost_model.loops import collect_stores
from cost_model.store_features import STORE_FIELDS, Machine, lg, store_row

FEATURE_VERSION = 9  # 9: the CPU prior's LLC measured per host (llc_probe.py); 8: CUDA partial tiles
TOP_STORES = 3
KINDS = ("pointwise", "reduction", "contraction")

WORKLOAD_FIELDS = (
    "wl_log_flops",
    "wl_log_bytes",
    "wl_log_intensity",
    "wl_kind_pointwise",
    "wl_kind_reduction",
    "wl_kind_contraction",
    "wl_kind_other",
    "wl_n_ops",
    "wl_n_inputs",
    "wl_log_dim0",  # contraction: M; reduction: rows; pointwise: outer elements
    "wl_log_dim1",  # contraction: N; reduction: row length; pointwise: last extent
    "wl_log_dim2",  # contraction: K; reduction: number of reductions
    "wl_log_llc",  # log2(workload bytes / the target's last-level cache): whether its data stays cached
)
FUNC_FIELDS = (
    "fn_stores",
    "fn_loops",
    "fn_depth",
    "fn_log_loop_iters",
    "fn_log_loop_iters_par",
    "fn_parallel_entries",
    "fn_log_local_bytes",
    "fn_log_shared_bytes",
    "fn_log_scratch_bytes",
    "fn_log_scratch_allocs",
    "fn_log_barriers",
    "fn_vector_stores",
    "fn_stream_frac",  # fraction of the bytes stored to global buffers written non-temporally
    "fn_stream_llc",  # fn_stream_frac x wl_log_llc: streaming a workload that fits the cache (< 0) or not
)
GPU_FIELDS = (
    "gpu_log_blocks",
    "gpu_log_threads",  # threads per block
    "gpu_log_shared",  # shared memory bytes per block
    "gpu_regs",  # registers per thread: reported by the build when known, else estimated
    "gpu_regs_reported",  # 1 when gpu_regs came from the build (ptxas / cuFuncGetAttribute)
    "gpu_occupancy",  # resident warps per SM / the SM's maximum, from threads, shared and registers
    "gpu_occ_limiter",  # what bounds occupancy: 0 warps, 1 blocks per SM, 2 shared memory, 3 registers
    "gpu_waves",  # blocks / (SMs x resident blocks per SM)
    "gpu_lane_util",  # threads per block / threads of the warps it occupies
    "gpu_sm_util",  # fraction of SMs the grid keeps busy
    "gpu_frac_coalesced",  # global accesses (over stores) with threadIdx.x stride = one access width
    "gpu_frac_bcast",  # ... invariant in threadIdx.x
    "gpu_frac_strided",  # ... larger or unknown stride
    "gpu_vec_width",  # mean elements per global load/store instruction
)
TOTAL_FIELDS = (
    "tot_log_trip",
    "tot_log_ops",
    "tot_log_bytes",
    "tot_log_traffic_l1",
    "tot_log_traffic_l2",
    "tot_log_traffic_l3",
    "tot_log_mem_instr",
    "tot_log_cyc_compute",
    "tot_log_cyc_latency",
    "tot_log_cyc_ldst",
    "tot_log_cyc_memory",
)
MEAN_FIELDS = ("wm_vec_eff", "wm_speedup", "wm_log_chains", "wm_contig", "wm_gathers")
RATIO_FIELDS = ("r_flops", "r_traffic_l2", "r_traffic_l3")
EST_FIELDS = ("est_log_cycles", "est_log_ideal", "est_log_efficiency")

FEATURE_NAMES: tuple[str, ...] = (
    *WORKLOAD_FIELDS,
    *FUNC_FIELDS,
    *GPU_FIELDS,
    *TOTAL_FIELDS,
    *MEAN_FIELDS,
    *RATIO_FIELDS,
    *EST_FIELDS,
    *(f"s{k}_{f}" for k in range(TOP_STORES) for f in STORE_FIELDS),
)
N_FEATURES = len(FEATURE_NAMES)
EST_INDEX = FEATURE_NAMES.index("est_log_cycles")


def workload_row(group: Group, llc_bytes: int) -> list[float]:
    """The ``wl_*`` features of a group on a target whose last-level cache holds ``llc_bytes``."""
    kind = group.kind
    dims = _characteristic_dims(group)
    flops, nbytes = max(1.0, group.flops), max(1.0, group.bytes)
    return [
        lg(flops),
        lg(nbytes),
        math.log2(flops / nbytes),
        float(kind == "pointwise"),
        float(kind == "reduction"),
        float(kind == "contraction"),
        float(kind not in KINDS),
        float(sum(1 for n in group.nodes if n.op != "constant")),
        float(len(group.inputs)),
        *(lg(d) for d in dims),
        log_llc(group, llc_bytes),
    ]


def log_llc(group: Group, llc_bytes: int) -> float:
    """``wl_log_llc``: log2 of the group's bytes over the last-level cache (< 0: its data fits)."""
    return math.log2(max(1.0, group.bytes) / max(1, llc_bytes))


def _characteristic_dims(group: Group) -> tuple[int, int, int]:
    try:
        anchor = group.anchor
        out = group.outputs[0].shape
        if group.kind == "contraction" and anchor is not None:
            if anchor.op == "conv2d":
                _o, cg, kh, kw = anchor.inputs[1].shape
                o = anchor.output.shape
                return o[0] * o[2] * o[3], o[1], cg * kh * kw
            a = anchor.inputs[0].shape
            k = a[-2] if anchor.attrs.get("transpose_a") else a[-1]
            o = anchor.output.shape
            return math.prod(o[:-1]), o[-1], k
        if group.kind == "reduction" and anchor is not None:
            shape, axes = anchor.inputs[0].shape, anchor.attrs.get("axes", ())
            row = math.prod(shape[a] for a in axes) if axes else 1
            n_red = sum(1 for n in group.nodes if n.op.startswith("reduce_"))
            return math.prod(shape) // max(1, row), row, n_red
        if out:
            return math.prod(out[:-1]), out[-1], 0
    except (AttributeError, IndexError, KeyError, TypeError):
        pass
    return 1, 1, 0


def extract(func: PrimFunc, group: Group, target: Target, registers: int | None = None) -> np.ndarray:
    """The feature vector (float32, ``N_FEATURES``) of a lowered function of ``group`` on ``target``.
    ``registers``: registers per thread reported by a CUDA build (also read from the function's
    ``launch["registers"]``); without it the count is estimated from the thread's local buffers."""
    m = Machine.of(target)
    info = collect_stores(func)
    streamed = streamed_fractions(func)
    rows, raws = [], []
    for s in info.stores:
        r, raw = store_row(s, m, streamed.get(s.store.buffer.name, 0.0))
        rows.append(r)
        raws.append(raw)
    total_cycles = sum(r["cycles"] for r in raws)

    local = sum(b.nbytes for b, _ in info.allocs if b.scope == "local")
    shared = sum(b.nbytes for b, _ in info.allocs if b.scope == "shared")
    scratch = [(b, n) for b, n in info.allocs if b.scope == "global"]
    stream_frac = sum(r["streamed_bytes"] for r in raws) / max(1.0, sum(r["stored_bytes"] for r in raws))
    fn = [
        float(len(info.stores)),
        float(info.loops),
        float(info.max_depth),
        lg(info.loop_iters),
        lg(info.loop_iters_par),
        float(info.parallel_entries),
        lg(local),
        lg(shared),
        lg(sum(b.nbytes for b, _ in scratch)),
        lg(sum(n for _, n in scratch)),
        lg(info.barriers),
        float(sum(1 for s in info.stores if s.loops and s.loops[-1].kind == "vectorized")),
        stream_frac,
        stream_frac * log_llc(group, m.l3),
    ]
    gpu = _gpu_row(func, m, local, shared, raws, registers)

    def tot(key: str) -> float:
        return lg(sum(r[key] for r in raws))

    totals = [
        tot("trip"),
        tot("ops"),
        tot("bytes"),
        tot("traffic_l1"),
        tot("traffic_l2"),
        tot("traffic_l3"),
        tot("mem_instr"),
        tot("compute"),
        tot("latency"),
        tot("ldst"),
        tot("memory"),
    ]
    weight = max(total_cycles, 1e-9)

    def wmean(key: str, f=float) -> float:
        if not raws:
            return 0.0
        return sum(f(r[key]) * r["cycles"] for r in raws) / weight

    means = [wmean("vec_eff"), wmean("speedup"), wmean("chains", lg), wmean("contig"), wmean("gathers")]
    wl_flops, wl_bytes = max(1.0, group.flops), max(1.0, group.bytes)
    ratios = [
        math.log2(max(1.0, sum(r["flops"] for r in raws)) / wl_flops),
        math.log2(max(1.0, sum(r["traffic_l2"] for r in raws)) / wl_bytes),
        math.log2(max(1.0, sum(r["traffic_l3"] for r in raws)) / wl_bytes),
    ]
    overhead = (
        info.loop_iters + info.loop_iters_par / (m.cores if not m.gpu else 1.0)
        if not m.gpu
        else m.launch_cycles
    )
    overhead += m.fork_cycles * info.parallel_entries if not m.gpu else 0.0
    if m.gpu:
        g = dict(zip(GPU_FIELDS, gpu))
        # latency hiding needs resident warps; a grid smaller than the GPU leaves SMs idle
        est = total_cycles / max(g["gpu_occupancy"], 1.0 / 64) / max(g["gpu_sm_util"], 1.0 / m.cores)
        est += overhead
    else:
        est = total_cycles + overhead
    if m.gpu:
        ideal = max(wl_flops / (m.sm_lanes * m.cores), wl_bytes / m.dram_bw_gpu)
    else:
        ideal = max(wl_flops / (2 * m.lanes * m.ipc * m.cores), wl_bytes / (m.bw_dram * m.cores))
    est_row = [lg(est), lg(ideal), lg(est) - lg(ideal)]

    order = sorted(range(len(rows)), key=lambda k: (-raws[k]["cycles"], k))[:TOP_STORES]
    top: list[float] = []
    for k in order:
        top += rows[k]
    top += [0.0] * (TOP_STORES * len(STORE_FIELDS) - len(top))
    vec = np.asarray(
        [*workload_row(group, m.l3), *fn, *gpu, *totals, *means, *ratios, *est_row, *top], dtype=np.float64
    )
    vec = np.nan_to_num(vec, nan=0.0, posinf=1e6, neginf=-1e6)
    return vec.astype(np.float32)


def streamed_fractions(func: PrimFunc) -> dict[str, float]:
    """Buffer name -> fraction of its elements whose vector stores are non-temporal: 1 for a buffer in
    the function's ``STREAM_STORES``, the part from ``STREAM_FROM``'s first element on for a split one."""
    names = func.attrs.get(STREAM_STORES) or ()
    first = dict(func.attrs.get(STREAM_FROM, ()))
    out = {}
    for name in names:
        numel = next((p.numel for p in func.params if p.name == name), 0)
        start = first.get(name, 0)
        out[name] = 1.0 - min(start, numel) / numel if numel and start else 1.0
    return out


def _gpu_row(
    func: PrimFunc, m: Machine, local: int, shared: int, raws: list[dict[str, float]], registers: int | None
) -> list[float]:
    if not m.gpu:
        return [0.0] * len(GPU_FIELDS)
    launch: dict[str, Any] = func.attrs.get("launch") or {}
    grid = launch.get("grid") or [1]
    block = launch.get("block") or [1]
    blocks, threads = max(1, math.prod(grid)), max(1, math.prod(block))
    smem = int(launch.get("shared_bytes", shared) or shared)
    reported = registers if registers is not None else launch.get("registers")
    if reported is not None and int(reported) > 0:
        regs, known = float(min(int(reported), m.max_regs)), 1.0
    else:
        regs, known = min(float(m.max_regs), 24.0 + local / 4.0), 0.0
    occupancy, limiter, per_sm = occupancy_of(m, threads, smem, regs)
    waves = blocks / max(1, m.cores * max(1, per_sm))
    lane_util = threads / (m.warp * -(-threads // m.warp))
    sm_util = min(1.0, blocks / m.cores)
    weights = [r["n_global"] for r in raws]
    total = sum(weights)

    def mean(key: str, empty: float) -> float:
        return sum(r[key] * w for r, w in zip(raws, weights)) / total if total else empty

    return [
        lg(blocks),
        lg(threads),
        lg(smem),
        regs,
        known,
        occupancy,
        float(limiter),
        waves,
        lane_util,
        sm_util,
        mean("coalesced", 1.0),
        mean("bcast_gpu", 0.0),
        mean("strided_gpu", 0.0),
        mean("width_gpu", 1.0),
    ]


def occupancy_of(m: Machine, threads: int, smem: int, regs: float) -> tuple[float, int, int]:
    """(resident warps / the SM's maximum, limiter, resident blocks per SM) of blocks of ``threads`` threads
    using ``smem`` shared bytes and ``regs`` registers per thread, under the SM limits of ``m``
    (registers allocated per warp in units of 256; limiter 0 warps, 1 blocks, 2 shared, 3 registers)."""
    warps = -(-max(1, threads) // m.warp)
    max_warps = max(1, m.sm_threads // m.warp)
    regs_per_warp = 256 * -(-math.ceil(regs) * m.warp // 256)
    limits = (
        max_warps // warps,
        m.sm_blocks,
        m.sm_shared // smem if smem > 0 else m.sm_blocks,
        m.sm_regs // max(1, regs_per_warp * warps),
    )
    per_sm = max(0, min(limits))
    limiter = limits.index(per_sm)
    return min(1.0, per_sm * warps / max_warps), limiter, per_sm


def lower_candidate(group: Group, config: Config, target: Target, sketch_name: str | None = None) -> PrimFunc:
    """Schedule ``group`` with ``config`` (the sketch checks it) and lower it for feature extraction."""
    sketch = get_sketch(sketch_name, target) if sketch_name else sketch_for(group, target)
    return get_backend(target).lower(sketch.build(group, config, target).func, unroll=False)


class FeatureExtractor:
    """Memoized features of candidates: ``get(group, target, config, sketch)`` -> vector, or None when the
    config is invalid or cannot be scheduled (ScheduleError / KilnError). LRU of ``max_entries``."""

    def __init__(self, max_entries: int = 50_000) -> None:
        self.max_entries = max_entries
        self._memo: OrderedDict[tuple, np.ndarray | None] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def key(
        self,
        group: Group,
        target: Target,
        config: Config,
        sketch_name: str | None = None,
        registers: int | None = None,
    ) -> tuple:
        sketch = get_sketch(sketch_name, target) if sketch_name else sketch_for(group, target)
        k = (group.workload_key, sketch.name, sketch.version, target.key, canonical_json(config))
        return k if registers is None else (*k, int(registers))

    def get(
        self,
        group: Group,
        target: Target,
        config: Config,
        sketch_name: str | None = None,
        registers: int | None = None,
    ) -> np.ndarray | None:
        """``registers``: registers per thread a CUDA build reported for this candidate, when known."""
        k = self.key(group, target, config, sketch_name, registers)
        if k in self._memo:
            self.hits += 1
            self._memo.move_to_end(k)
            return self._memo[k]
        self.misses += 1
        try:
            func = lower_candidate(group, config, target, k[1])
            vec: np.ndarray | None = extract(func, group, target, registers)
        except (ScheduleError, KilnError):
            vec = None
        self.put(k, vec)
        return vec

    def put(self, key: tuple, vec: np.ndarray | None) -> None:
        self._memo[key] = vec
        self._memo.move_to_end(key)
        while len(self._memo) > self.max_entries:
            self._memo.popitem(last=False)

    def peek(self, key: tuple) -> tuple[bool, np.ndarray | None]:
        """(known, vector) without computing anything."""
        if key in self._memo:
            return True, self._memo[key]
        return False, None

    def for_task(self, task: Any, config: Config, registers: int | None = None) -> np.ndarray | None:
        """Features of ``config`` for a :class:`~tuner.task.Task`."""
        return self.get(task.group, task.target, config, task.sketch.name, registers)
