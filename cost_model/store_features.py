"""One row of features per store, and the analytic (roofline) estimate of its cost.

The row describes the store in its loop nest in the spirit of TVM/Ansor's per-store features: loop extents
and annotations (vectorized lanes, unrolled product, parallel extent, thread and block bindings), the
arithmetic of the stored value, every access's stride along the innermost loop (contiguous / broadcast /
strided), bytes and cache lines touched, the traffic into L1, L2 and L3 found by placing each cache at
the outermost loop level whose footprint fits in it, reuse distance and count, and a cycle estimate split
into compute, dependency latency, load/store issue and memory parts. Everything is a float; quantities
that span orders of magnitude are ``log2(1 + x)``.

Non-temporal (streaming) stores (``stream``) are priced by cache residency: a streaming store never reads
its lines (no read-for-ownership); where the nest's data would stay in the last-level cache between calls
(at most half of it, the sketches' own rule for the default) its lines go to DRAM on every call instead,
where it would not they also skip the read-for-ownership from DRAM. Measured on one Zen 5 host, 1 thread,
streaming the output of a light pointwise group ran 0.62-1.36x the time of the cached store depending on
the group's size and arithmetic; where exactly the balance turns is the machine's (a last-level cache
shared with other tenants), which the learned model corrects from measurements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from compiler.backends.cpu.datapath import host_datapath_lanes
from compiler.target import Target
from cost_model.llc_probe import host_llc_bytes
from cost_model.loops import Access, StoreInfo, inner_loops

STORE_FIELDS = (
    "log_trip",  # executions of the store
    "ops",  # weighted float operations per execution (exp ~ 14, div ~ 5, add ~ 1)
    "flops",  # plain float operations per execution
    "special",  # transcendental calls per execution
    "divs",
    "n_reads",
    "n_reads_mem",  # reads that are not register tiles
    "vec_lanes",  # extent of the innermost vectorized loop (1 if none)
    "vec_eff",  # SIMD lanes the analytic model credits (fallbacks and gathers removed, auto-vectorization)
    "autovec",  # an innermost serial loop gcc can likely vectorize on its own
    "gathers",  # reads with a non-unit, non-zero stride inside a vectorized loop
    "vec_fallback",  # vectorized loop whose store is not contiguous (scalar fallback)
    "accumulate",  # the store updates the location it reads (reduction)
    "log_chains",  # independent accumulators of a reduction (dependency chains)
    "log_unroll",  # product of unrolled loop extents
    "log_parallel",  # extent of the outermost parallel loop
    "par_speedup",
    "log_serial",  # product of serial loop extents
    "log_inner_extent",
    "inner_kind",  # innermost loop: 0 none, 1 serial, 2 unrolled, 3 vectorized, 4 parallel, 5 thread
    "depth",
    "guards",
    "guard_on_inner",  # a guard depends on the innermost loop (a tail inside the vector loop)
    "log_bytes",  # bytes accessed, every execution counted
    "log_unique_bytes",  # distinct bytes over the whole nest
    "log_unique_lines",
    "log_traffic_l1",  # bytes brought into L1 (misses), by the cache placement rule
    "log_traffic_l2",
    "log_traffic_l3",
    "log_tlb_misses",  # first-level data TLB misses, by the same placement rule as the caches
    "log_intensity",  # flops per byte of L2 traffic
    "log_reuse_dist",  # bytes touched between two uses of the most reused read
    "log_reuse_ct",  # times that read is reused by its reuse loop
    "frac_contig",  # reads with stride 1 along the innermost loop
    "frac_bcast",  # reads invariant in the innermost loop
    "frac_strided",
    "store_contig",
    "log_mem_instr",  # load/store instructions issued (register reuse and SIMD width applied)
    "writes_register",
    "writes_param",
    "stream",  # fraction of the store's executions written non-temporally (the sketch's ``store`` knob)
    "log_cyc_compute",
    "log_cyc_latency",
    "log_cyc_ldst",
    "log_cyc_memory",
    "log_cyc_total",
    "log_threads",  # threads per block around the store (GPU)
    "log_blocks",  # thread blocks around the store (GPU)
    "coalesced_frac",  # global accesses whose threadIdx.x stride is one access width (GPU)
    "shared_reads",
    "log_shared_bytes",  # bytes of shared memory read by the store per block
    "bcast_frac_gpu",  # global accesses invariant in threadIdx.x (GPU)
    "strided_frac_gpu",  # global accesses with a larger (or unknown) threadIdx.x stride (GPU)
    "vec_width_gpu",  # mean vector width (elements per load/store instruction) of global accesses (GPU)
    "sector_eff_gpu",  # mean fraction of the fetched 32-byte sectors a warp uses (GPU)
)
KIND_CODE = {"serial": 1, "unrolled": 2, "vectorized": 3, "parallel": 4, "thread": 5}


def lg(x: float) -> float:
    return math.log2(1.0 + max(0.0, float(x)))


@dataclass(frozen=True)
class Machine:
    """The constants of the analytic model, from a target (per core; cycles)."""

    gpu: bool
    cores: int
    lanes: int  # float32 lanes of the widest vector register
    datapath: int  # float32 lanes one vector FMA processes per issue (measured, cpu/datapath.py)
    l1: int
    l2: int
    l3: int  # the last-level cache the kernels get (measured, llc_probe.py)
    ipc: float = 2.0  # vector ops issued per cycle
    load_ports: float = 2.0
    fp_latency: float = 4.0
    bw_l2: float = 64.0  # bytes per cycle into L1 (from L2)
    bw_l3: float = 32.0
    bw_dram: float = 8.0
    # first-level data TLB: entries (4 KiB pages) and the cycles a load waits when it misses it and hits the
    # second level (Zen 4: 72 entries, 7 cycles; Intel cores 64-96 entries, 7-9 cycles)
    dtlb_pages: int = 64
    tlb_cycles: float = 7.0
    fork_cycles: float = 3000.0  # one OpenMP parallel region
    launch_cycles: float = 6000.0  # one kernel launch (GPU)
    sm_lanes: float = 128.0
    dram_bw_gpu: float = 2000.0  # bytes per cycle, whole GPU
    # per-SM limits of a GPU (occupancy): threads, resident blocks, 32-bit registers, shared memory bytes
    warp: int = 32
    sm_threads: int = 2048
    sm_blocks: int = 32
    sm_regs: int = 65536
    sm_shared: int = 228 * 1024
    max_regs: int = 255

    @staticmethod
    def of(target: Target) -> Machine:
        if target.kind == "cuda":
            threads, blocks, shared = _sm_limits(target)
            return Machine(
                True,
                max(1, target.cores),
                1,
                1,
                256 * 1024,
                target.l2_bytes,
                target.l2_bytes,
                warp=max(1, target.warp_size),
                sm_threads=threads,
                sm_blocks=blocks,
                sm_shared=shared,
                max_regs=max(1, target.max_registers_per_thread),
            )
        return Machine(
            False,
            max(1, target.cores),
            target.vector_lanes_f32,
            host_datapath_lanes(target),
            target.l1_bytes,
            target.l2_bytes,
            host_llc_bytes(target),  # measured on this host (cost_model/llc_probe.py), else one CCD's L3
        )


# per-SM limits by compute capability (CUDA C Programming Guide, "Technical Specifications per Compute
# Capability"): max resident threads, max resident blocks, shared memory per SM in KiB
_SM_LIMITS = {
    (7, 0): (2048, 32, 96),
    (7, 5): (1024, 16, 64),
    (8, 0): (2048, 32, 164),
    (8, 6): (1536, 16, 100),
    (8, 7): (2048, 32, 164),
    (8, 9): (1536, 24, 100),
    (9, 0): (2048, 32, 228),
    (10, 0): (2048, 32, 228),
    (12, 0): (1536, 32, 100),
}


def _sm_limits(target: Target) -> tuple[int, int, int]:
    """(threads, blocks, shared bytes) one SM of ``target`` holds; the nearest older architecture's limits
    for an unlisted one, never less shared memory than one block may opt into."""
    digits = "".join(ch for ch in target.arch if ch.isdigit())
    cc = (int(digits[:-1]), int(digits[-1])) if len(digits) >= 2 else (9, 0)
    known = [k for k in _SM_LIMITS if k <= cc] or [min(_SM_LIMITS)]
    threads, blocks, kib = _SM_LIMITS[max(known)]
    return threads, blocks, max(kib * 1024, target.max_shared_bytes_optin + 1024)


def access_width(a: Access, inner) -> int:
    """Elements one load/store instruction moves for access ``a`` on the GPU: the innermost vectorized loop's
    extent when the access is contiguous along it (codegen's float2/float4 rewrite), at most 16 bytes."""
    if inner is None or inner.kind != "vectorized" or inner.extent < 2:
        return 1
    if a.stride(inner.var.uid) != 1:
        return 1
    width = min(inner.extent, max(1, 16 // a.itemsize))
    return 1 << (width.bit_length() - 1)  # float2/float4: a power of two


def thread_stride(a: Access, tx: int | None, width: int) -> int | None:
    """Stride between neighbouring threadIdx.x of access ``a``, in units of its access width: 0 broadcast,
    1 coalesced (consecutive threads touch consecutive vectors), > 1 strided, None unknown."""
    if tx is None:
        return 0
    s = a.stride(tx)
    if s is None:
        return None
    s = abs(s)
    return s // width if s % width == 0 else s


def sector_efficiency(a: Access, stride: int | None, width: int, warp: int = 32) -> float:
    """Fraction of the 32-byte sectors fetched for one warp's access that the warp uses."""
    if stride == 0:
        return 1.0
    chunk = width * a.itemsize  # bytes one thread moves
    if stride is None:
        return chunk / max(chunk, 32)
    step = stride * chunk  # bytes between neighbouring threads
    useful = warp * chunk
    fetched = warp * max(chunk, min(step, 32)) if step > chunk else useful
    return min(1.0, useful / fetched)


def _register(a: Access, kinds: dict[int, tuple[str, int]]) -> bool:
    """A small local buffer indexed only by unrolled/vector loops (or short serial ones) is promoted to
    registers by codegen (see docs/codegen.md, register promotion)."""
    if a.buffer.scope != "local" or a.buffer.numel > 1024 or a.nonlinear:
        return False
    for c in a.coeffs:
        for u in c:
            kind, ext = kinds.get(u, ("serial", 1 << 30))
            if kind not in ("unrolled", "vectorized", "thread") and not (kind == "serial" and ext <= 16):
                return False
    return True


def _distinct(accesses: list[Access]) -> list[Access]:
    """One access per (buffer, index pattern): reading ``x`` twice at the same index is one stream."""
    out, seen = [], set()
    for a in accesses:
        key = (a.buffer.uid, tuple(sorted(a.flat.items())), tuple(a.flat_atoms), a.write)
        if key not in seen:
            seen.add(key)
            out.append(a)
    return out


def _same_location(a: Access, b: Access) -> bool:
    return a.buffer is b.buffer and a.coeffs == b.coeffs and not a.nonlinear and not b.nonlinear


def store_row(s: StoreInfo, m: Machine, streamed: float = 0.0) -> tuple[list[float], dict[str, float]]:
    """The feature row of one store and its raw cycle estimates (``cycles`` is what the analytic model
    adds up; ``traffic_*`` in bytes). ``streamed``: the fraction of the stored buffer's elements whose
    full-vector stores the kernel writes non-temporally (codegen's ``STREAM_STORES`` / ``STREAM_FROM``);
    only a contiguous vector store of float32 streams."""
    loops = s.loops
    trip = s.trip
    kinds = {lp.var.uid: (lp.kind, lp.extent) for lp in loops}
    inner = loops[-1] if loops else None
    iu = inner.var.uid if inner is not None else -1
    w = s.write
    regs = [_register(a, kinds) for a in s.accesses]
    mem = _distinct([a for a, r in zip(s.accesses, regs) if not r])

    # SIMD: explicit vector loop, its fallbacks and gathers; gcc's own vectorization of simple loops
    vec_lanes = inner.extent if inner is not None and inner.kind == "vectorized" else 1
    accumulate = any(_same_location(w, r) for r in s.reads)
    strides = [a.flat_coeff(iu) if inner is not None else 0 for a in s.reads]
    contig = sum(1 for x in strides if x == 1)
    bcast = sum(1 for x in strides if x == 0)
    strided = len(strides) - contig - bcast
    store_stride = w.flat_coeff(iu) if inner is not None else 0
    guard_on_inner = float(iu in s.guard_vars)
    gathers = strided if vec_lanes > 1 else 0
    fallback = float(vec_lanes > 1 and store_stride != 1)
    stream = streamed if vec_lanes > 1 and not fallback and w.buffer.dtype == "float32" else 0.0
    autovec = float(
        not m.gpu
        and inner is not None
        and inner.kind == "serial"
        and inner.extent >= 4
        and store_stride == 1
        and strided == 0
        and not accumulate
        and not guard_on_inner
    )
    if vec_lanes > 1 and not fallback:
        vec_eff = float(min(vec_lanes, m.lanes))
        if gathers:
            vec_eff = max(1.0, vec_eff * (len(strides) - gathers) / max(1, len(strides)))
    elif autovec:
        vec_eff = max(1.0, m.lanes / 2)
    else:
        vec_eff = 1.0

    # dependency chains of a reduction: independent accumulators inside the reduce loop
    chains = 1.0
    if accumulate:
        for lp in reversed(loops):
            if not w.depends_on(lp.var.uid):
                break
            if lp.kind == "unrolled" or (lp.kind == "serial" and lp.extent <= 16 and regs[0]):
                chains *= lp.extent
    unroll = math.prod(lp.extent for lp in loops if lp.kind == "unrolled")
    serial = math.prod(lp.extent for lp in loops if lp.kind == "serial")
    par = next((lp.extent for lp in loops if lp.kind == "parallel"), 1)
    speedup = par / math.ceil(par / m.cores) if par > 1 and not m.gpu else 1.0
    threads = math.prod(lp.extent for lp in loops if lp.kind == "thread" and "threadIdx" in (lp.thread or ""))
    blocks = math.prod(lp.extent for lp in loops if lp.kind == "thread" and "blockIdx" in (lp.thread or ""))

    # load/store instructions: a read invariant in the innermost unrolled/vector loops stays in a register
    run: list = []
    for lp in reversed(loops):
        if lp.kind in ("unrolled", "vectorized"):
            run.append(lp)
        else:
            break
    mem_instr = 0.0
    for a in mem:
        reuse = math.prod(lp.extent for lp in run if lp.kind == "unrolled" and not a.depends_on(lp.var.uid))
        if m.gpu:
            per = float(access_width(a, inner)) if a.buffer.scope in ("global", "shared") else 1.0
        else:
            per = vec_eff if a.flat_coeff(iu) in (0, 1) else 1.0
        mem_instr += trip / max(1.0, per) / max(1, reuse)

    # cache placement: the outermost level whose footprint (all non-register accesses) fits the cache
    depth = len(loops)
    lines_at = []
    for level in range(depth + 1):
        inner_ext = inner_loops(loops, level)
        fp = [a.footprint(inner_ext) for a in mem]
        lines_at.append((sum(e * a.itemsize for (e, _), a in zip(fp, mem)), [ln for _, ln in fp]))

    def traffic(cap: float) -> float:
        # lines brought in: the per-iteration working set of the outermost fitting level stays cached, so
        # count the distinct lines over the loop just outside it (spatial and temporal reuse across it)
        fit = next((level for level in range(depth + 1) if lines_at[level][0] <= cap), depth)
        if fit == 0:
            return 0.0  # the whole nest fits: the timing loop finds it cached (no flush between calls)
        j = fit - 1
        outer = math.prod(lp.extent for lp in loops[:j])
        return 64.0 * sum(lines_at[j][1]) * outer

    t1, t2, t3 = traffic(m.l1 * 0.5), traffic(m.l2 * 0.5), traffic(m.l3 * 0.8)
    stream_bytes = stream * trip * w.itemsize  # bytes written non-temporally
    if stream_bytes and not m.gpu:
        # a streaming store never reads its lines (no read-for-ownership into L1 and L2), and its lines
        # leave the cache: where the nest's data would stay in the last-level cache between calls (at most
        # half of it, the sketches' rule for the default: compiler.backends.cpu.sketches.common.streams_pay)
        # they go to DRAM on every call instead; where it would not, they skip its read-for-ownership too
        t1, t2 = max(0.0, t1 - stream_bytes), max(0.0, t2 - stream_bytes)
        stays = (lines_at[0][0] if lines_at else 0) <= m.l3 // 2
        t3 = t3 + stream_bytes if stays else max(0.0, t3 - stream_bytes)
    # first-level TLB misses, placed like a cache: the pages of the outermost level that fits the TLB's
    # entries, counted over the loop just outside it. A B panel read in place from a wide matrix touches a
    # new page every row or two of K (a 768-column matrix: 3072-byte rows), so every step of the K loop
    # misses the TLB once K x 4 KiB exceeds its reach; the packed panel (NR x 4 bytes a row, back to back)
    # stays in a few pages.
    pages_at = [sum(a.pages(inner_loops(loops, level)) for a in mem) for level in range(depth + 1)]
    tlb_fit = next((level for level in range(depth + 1) if pages_at[level] <= m.dtlb_pages), depth)
    tlb = 0.0
    if tlb_fit > 0 and not m.gpu:
        tlb = float(pages_at[tlb_fit - 1] * math.prod(lp.extent for lp in loops[: tlb_fit - 1]))
    unique_bytes, unique_lines = lines_at[0][0] if lines_at else 0, sum(lines_at[0][1]) if lines_at else 0
    nbytes = trip * sum(a.itemsize for a in mem)

    # reuse of the most reused read: the innermost loop it does not depend on
    reuse_dist, reuse_ct = 0.0, 0.0
    for a in s.reads:
        for level in range(depth - 1, -1, -1):
            lp = loops[level]
            if lp.kind == "vectorized" or a.depends_on(lp.var.uid):
                continue
            if lp.extent > reuse_ct:
                reuse_ct = float(lp.extent)
                reuse_dist = float(lines_at[level + 1][0])
            break

    coalesced, shared_reads, shared_bytes = 1.0, 0, 0.0
    g_bcast, g_strided, g_width, g_eff = 0.0, 0.0, 1.0, 1.0
    lane_util = 1.0
    if m.gpu:
        tx = next((lp.var.uid for lp in loops if lp.thread == "threadIdx.x"), None)
        glob = [a for a in _distinct(s.accesses) if a.buffer.scope == "global"]
        if glob:
            widths = [access_width(a, inner) for a in glob]
            strides = [thread_stride(a, tx, wd) for a, wd in zip(glob, widths)]
            n = len(glob)
            coalesced = sum(1 for x in strides if x == 1) / n
            g_bcast = sum(1 for x in strides if x == 0) / n
            g_strided = 1.0 - coalesced - g_bcast
            if tx is None:  # no threadIdx.x: one thread per block does everything
                coalesced, g_bcast, g_strided = 0.0, 1.0, 0.0
            g_width = sum(widths) / n
            g_eff = sum(sector_efficiency(a, x, wd, m.warp) for a, x, wd in zip(glob, strides, widths)) / n
        # lanes a warp instruction keeps busy: a block of fewer threads than a warp leaves the rest idle
        lane_util = threads / (m.warp * -(-max(1, threads) // m.warp)) if threads else 1.0 / m.warp
        for a in s.reads:
            if a.buffer.scope == "shared":
                shared_reads += 1
                shared_bytes += trip / max(1, blocks) * a.itemsize

    # cycle estimate
    flop_work = trip * s.ops
    if m.gpu:
        width = m.sm_lanes * m.cores * lane_util
        compute = flop_work / width
        latency = 0.0
        if accumulate:
            latency = trip / max(1.0, chains) / max(1.0, threads * blocks) * m.fp_latency
        ldst = mem_instr / width * 4.0 / max(g_eff, 1.0 / 8)  # one replay per extra sector
        glob_bytes = t2 / max(g_eff, 1.0 / 8)
        memory = glob_bytes / m.dram_bw_gpu
    else:
        compute = flop_work / min(vec_eff, m.datapath) / m.ipc
        latency = trip / max(1.0, chains) / max(1.0, vec_eff) * m.fp_latency if accumulate else 0.0
        ldst = mem_instr * math.ceil(vec_eff / m.datapath) / m.load_ports
        memory = max(0.0, t1 - t2) / m.bw_l2 + max(0.0, t2 - t3) / m.bw_l3 + t3 / m.bw_dram
    # the core's own limits overlap almost fully; memory overlaps with them only partly
    core = max(compute, latency, ldst) + 0.1 * (compute + latency + ldst - max(compute, latency, ldst))
    # a load that misses the TLB delays the operations that wait for it: not overlapped with the core's limits
    core += tlb * m.tlb_cycles
    memory = max(0.0, memory)
    cycles = math.hypot(core, memory) / speedup

    row = [
        lg(trip),
        s.ops,
        float(s.flops),
        float(s.special),
        float(s.divs),
        float(len(s.reads)),
        float(sum(1 for a in mem if not a.write)),
        float(vec_lanes),
        vec_eff,
        autovec,
        float(gathers),
        fallback,
        float(accumulate),
        lg(chains),
        lg(unroll),
        lg(par),
        speedup,
        lg(serial),
        lg(inner.extent if inner is not None else 0),
        float(KIND_CODE.get(inner.kind, 1) if inner is not None else 0),
        float(depth),
        float(s.guards),
        guard_on_inner,
        lg(nbytes),
        lg(unique_bytes),
        lg(unique_lines),
        lg(t1),
        lg(t2),
        lg(t3),
        lg(tlb),
        lg(trip * s.flops / max(1.0, t2)),
        lg(reuse_dist),
        lg(reuse_ct),
        contig / max(1, len(strides)),
        bcast / max(1, len(strides)),
        strided / max(1, len(strides)),
        float(store_stride == 1),
        lg(mem_instr),
        float(regs[0]),
        float(w.buffer.scope == "global"),
        stream,
        lg(compute),
        lg(latency),
        lg(ldst),
        lg(memory),
        lg(cycles),
        lg(threads),
        lg(blocks),
        coalesced,
        float(shared_reads),
        lg(shared_bytes),
        g_bcast,
        g_strided,
        g_width,
        g_eff,
    ]
    raw = {
        "cycles": cycles,
        "compute": compute / speedup,
        "latency": latency / speedup,
        "ldst": ldst / speedup,
        "memory": memory / speedup,
        "traffic_l1": t1,
        "traffic_l2": t2,
        "traffic_l3": t3,
        "tlb_misses": tlb,
        "ops": flop_work,
        "flops": trip * s.flops,
        "bytes": nbytes,
        "stored_bytes": float(trip * w.itemsize) if w.buffer.scope == "global" else 0.0,
        "streamed_bytes": stream_bytes,
        "mem_instr": mem_instr,
        "vec_eff": vec_eff,
        "speedup": speedup,
        "chains": chains,
        "contig": contig / max(1, len(strides)),
        "gathers": float(gathers),
        "trip": float(trip),
        "n_global": float(len([a for a in _distinct(s.accesses) if a.buffer.scope == "global"])),
        "coalesced": coalesced,
        "bcast_gpu": g_bcast,
        "strided_gpu": g_strided,
        "width_gpu": g_width,
    }
    return row, raw
