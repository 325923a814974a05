"""The CUDA tensor-core contraction sketch: float16 / bfloat16 (and, opted in, TF32) GEMMs with ``mma.sync``.

Applies to matmul / batch_matmul / dense groups (a fused elementwise epilogue included) whose product is
``acc[.., m, n] += A[.., m|k, k|m] * B[.., k|n, n|k]`` of one input element type, on sm_80 or newer:

* ``float16`` inputs: ``mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32`` (float32 accumulators, the
  result cast to the epilogue's type where the graph's matmul result is read), fragments loaded from
  shared memory with ``ldmatrix.x4`` (``.trans`` for an operand stored M/N-major: A[k][m], B[k][n]);
* ``bfloat16`` inputs: ``mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32``, the same fragment layout
  and ldmatrix loads as float16;
* ``float32`` inputs when the target opts in to TF32 (``Target.tf32``: ``--tf32``, key suffix ``/tf32``):
  ``mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32``, fragments read element by element from shared
  memory and rounded with ``cvt.rna.tf32.f32`` (``tf32_round``).

The input element type is a parameter (:data:`MMA`: one entry per type).

Shape rule (otherwise the sketch does not apply and the SIMT contraction sketch schedules the group):
each operand's innermost (contiguous) extent is a multiple of one 16-byte chunk (8 float16 or bfloat16 /
4 float32 elements), so every ``cp.async`` copies a whole chunk that lies inside or outside the tensor.
M, N and K are otherwise free: chunks past the edge are zero-filled (``cp.async`` with ``src-size`` 0) and the
epilogue's stores are guarded.

How warp-level code is expressed in the loop IR. The block/primitive machinery schedules per-thread
computations; an ``mma`` is a collective of 32 lanes over fragments whose element-to-lane map is fixed by
the ISA, which no iteration-domain primitive describes. So this sketch writes the kernel's loop nest
directly (a template in loop IR, inside the usual root block) from the group's analysis:

* :class:`~compiler.loopir.stmt.Intrinsic` statements ``cp_async`` / ``cp_async_commit`` /
  ``cp_async_wait``, ``ldmatrix``, ``mma_m16n8k16`` / ``mma_m16n8k8_tf32``: named operations on buffer
  elements (each operand a buffer and the flat element offset the thread passes);
* fragments are ``local`` buffers (per thread, element by element in the ISA's order: an f16 register is
  two elements); shared tiles are flat ``shared`` buffers of ``stages`` tiles; ``__syncthreads()`` is an
  explicit ``Barrier``;
* the epilogue is the group's own epilogue block, its iteration variables replaced by each accumulator
  element's (m, n) and its read of the matmul result by that element (cast to the result's type).

Their semantics (fragment layouts included) are the SIMT interpreter's (``compiler.loopir.interp_simt_tc``),
so every config is checked against the numpy reference without a GPU; the CUDA printer turns them into
inline PTX (``compiler.backends.cuda.codegen``).

Kernel (block tile bm x bn, ``warps_m x warps_n`` warps, warp tile wm x wn, ``stages``-deep pipeline)::

    blockIdx.z  batch ; blockIdx.y / .x  tile (or one blockIdx.x in grouped order, ``group_m`` rows)
      shared As[stages][tile], Bs[stages][tile]          (padded rows or XOR-swizzled 16-byte chunks)
      threadIdx.y warp, threadIdx.x lane:
        acc[wm/16][wn/8][4] = 0                           (float32 registers)
        for s < stages-1: cp.async tile s ; commit
        for ko in K / bk:
          cp.async.wait_group(stages-2) ; __syncthreads()
          if ko + stages-1 < K/bk: cp.async tile ko+stages-1 into stage (ko-1) % stages
          commit
          for kk in bk / 16:  ldmatrix A, B fragments ; mma for each (mi, ni)
        epilogue per accumulator element: out[m, n] = epi(acc)  (guarded at the M/N edges)

Knobs: ``bm``, ``bn``, ``bk``, ``warps_m``, ``warps_n``, ``stages`` (2..4), ``smem_layout`` (``pad``:
rows padded by 16 bytes, ``xor``: chunk index XOR row; both keep ``ldmatrix`` phases bank-conflict-free,
``xor`` also the cp.async chunk stores, ``pad`` leaves them up to 2-way), ``group_m`` (grouped block
order), ``min_blocks`` (``__launch_bounds__``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from compiler import dtypes
from compiler.backends import group_analysis as G
from compiler.backends.cuda.sketches.contraction import threads_per_sm
from compiler.backends.sketch import Config, Knob, Sketch, contraction_stages, prepare
from compiler.errors import ScheduleError
from compiler.fusion import Group
from compiler.loopir import analysis as A
from compiler.loopir.expr import (
    Binary,
    Call,
    Cast,
    Const,
    Expr,
    IterVar,
    Load,
    Var,
    const,
    logical_and,
    replace_buffer_loads,
    select,
    substitute,
    walk,
)
from compiler.loopir.schedule import Schedule
from compiler.loopir.stmt import (
    Allocate,
    Barrier,
    Block,
    Buffer,
    BufferStore,
    For,
    IfThenElse,
    Intrinsic,
    PrimFunc,
    SeqStmt,
    Stmt,
    seq,
)
from compiler.target import Target

WARP = 32
CHUNK_BYTES = 16
MAX_ACC_PER_THREAD = 128  # float32 accumulators per thread (a 64x64 warp tile)


@dataclass(frozen=True)
class MmaKind:
    """One mma.sync instruction shape for an input element type."""

    dtype: str
    intrinsic: str  # Intrinsic name (interp_simt_tc.MMA_SHAPES)
    k: int  # K of one mma
    a_elems: int  # A fragment elements per lane
    b_elems: int  # B fragment elements per lane
    ldmatrix: bool  # fragments loaded with ldmatrix (b16 types); else element by element


MMA = {
    "float16": MmaKind("float16", "mma_m16n8k16", 16, 8, 4, True),
    "bfloat16": MmaKind("bfloat16", "mma_m16n8k16_bf16", 16, 8, 4, True),
    "float32": MmaKind("float32", "mma_m16n8k8_tf32", 8, 4, 2, False),  # TF32, opt-in only
}


def min_arch(target: Target) -> bool:
    try:
        return target.kind == "cuda" and int(target.arch.split("_")[1].rstrip("a")) >= 80
    except (IndexError, ValueError):
        return False


@dataclass
class Operand:
    """A GEMM operand: ``roles[d]`` says what indexes axis d ('mn', 'k', ('b', j) or a constant)."""

    buf: Buffer
    roles: list
    k_contig: bool  # the innermost axis is K (A row-major / B "transposed", e.g. a dense weight)

    def offset(self, batch: list[Expr], mn: Expr, k: Expr) -> Expr:
        off: Expr = const(0)
        for role, stride in zip(self.roles, self.buf.strides):
            if role == "mn":
                v = mn
            elif role == "k":
                v = k
            elif isinstance(role, tuple):
                v = batch[role[1]]
            else:
                v = const(int(role))
            off = off + v * stride
        return off


@dataclass
class GemmForm:
    """What the sketch needs of a group: extents, operands, the epilogue."""

    M: int
    N: int
    K: int
    batch: list[int]
    a: Operand
    b: Operand
    mma: MmaKind
    acc_roles: list  # per axis of the matmul result: 'm', 'n' or ('b', j)
    epi: BufferStore  # the epilogue's store (indices and value over epi_vars)
    epi_vars: list[Var]  # per result axis: the epilogue's iteration variable
    acc: Buffer  # the matmul result the epilogue reads
    func: PrimFunc


def gemm_form(group: Group, tf32: bool = False) -> GemmForm:
    """The group as a tensor-core GEMM, or ScheduleError saying why it is not one."""
    if group.kind != "contraction" or G.is_conv(group):
        raise ScheduleError(f"tensorcore: group {group.name} is not a matmul / batch_matmul / dense")
    sch, blocks = prepare(group)
    mm, epi = contraction_stages(sch, blocks)
    if len(sch.blocks()) != 2:
        raise ScheduleError(f"tensorcore: group {group.name} has stages besides the product and its epilogue")
    view = G.gemm_view(sch, mm)
    if len(view.m) != 1 or len(view.n) != 1 or len(view.k) != 1 or view.a is view.b:
        raise ScheduleError(f"tensorcore: group {group.name} is not a plain GEMM (one M, N and K loop)")
    role: dict[int, object] = {}
    ext: dict[object, int] = {}
    batch_ext: list[int] = []
    for iv, bnd in zip(mm.iter_vars, mm.bindings):
        lp = next((x for x in (*view.m, *view.n, *view.k, *view.batch) if x.var is bnd), None)
        if lp is None:
            raise ScheduleError(f"tensorcore: {mm.name}'s iteration variables are not plain loops")
        r: object
        if lp in view.m:
            r = "m"
        elif lp in view.n:
            r = "n"
        elif lp in view.k:
            r = "k"
        else:
            r = ("b", len(batch_ext))
            batch_ext.append(iv.extent)
        role[iv.var.uid] = r
        ext[r] = iv.extent
    (st,) = A.block_stores(mm)
    acc = st.buffer
    v = st.value
    if not (
        isinstance(v, Binary)
        and v.op == "+"
        and isinstance(v.a, Load)
        and v.a.buffer is acc
        and isinstance(v.b, Binary)
        and v.b.op == "*"
        and isinstance(v.b.a, Load)
        and isinstance(v.b.b, Load)
    ):
        raise ScheduleError(f"tensorcore: {mm.name} is not acc + A * B")
    acc_roles = [role.get(i.uid) if isinstance(i, Var) else None for i in st.indices]
    if None in acc_roles:
        raise ScheduleError(f"tensorcore: {mm.name} does not store its result at plain iteration variables")
    dtype = v.b.a.buffer.dtype
    if v.b.b.buffer.dtype != dtype or dtype not in MMA or (dtype == "float32" and not tf32):
        raise ScheduleError(
            f"tensorcore: operands of {dtype} (float16, bfloat16, or float32 with TF32 opted in) are needed"
        )
    mma = MMA[dtype]
    ops = []
    for ld, side in ((v.b.a, "m"), (v.b.b, "n")):
        roles: list = []
        for i in ld.indices:
            if isinstance(i, Var) and i.uid in role:
                r = role[i.uid]
                roles.append("mn" if r == side else r)
            elif isinstance(i, Const):
                roles.append(int(i.value))
            else:
                raise ScheduleError(f"tensorcore: {ld.buffer.name} is read at a computed index")
        if roles.count("mn") != 1 or roles.count("k") != 1 or roles[-1] not in ("mn", "k"):
            raise ScheduleError(f"tensorcore: {ld.buffer.name} is not a matrix over its M/N and K axes")
        op = Operand(ld.buffer, roles, roles[-1] == "k")
        elems = CHUNK_BYTES // (ld.buffer.nbytes // ld.buffer.numel)
        if ld.buffer.shape[-1] % elems:
            raise ScheduleError(
                f"tensorcore: the innermost extent {ld.buffer.shape[-1]} of {ld.buffer.name} is not a "
                f"multiple of {elems} (16-byte cp.async chunks)"
            )
        ops.append(op)
    a, b = ops if view.a is ops[0].buf else ops[::-1]
    (est,) = A.block_stores(epi)
    loads = [x for x in _walk_loads(est.value) if x.buffer is acc]
    if not loads or any(
        len(x.indices) != len(acc_roles) or not all(isinstance(i, Var) for i in x.indices) for x in loads
    ):
        raise ScheduleError(f"tensorcore: the epilogue {epi.name} does not read the result elementwise")
    epi_vars = list(loads[0].indices)  # type: ignore[arg-type]
    if any(list(x.indices) != epi_vars for x in loads) or len(set(epi_vars)) != len(epi_vars):
        raise ScheduleError(f"tensorcore: the epilogue {epi.name} reads the result at several indices")
    ivs = {iv.var for iv in epi.iter_vars}
    if set(epi_vars) != ivs or epi.is_reduction or epi.predicate is not None:
        raise ScheduleError(f"tensorcore: the epilogue {epi.name} is not elementwise over the result")
    return GemmForm(
        ext["m"], ext["n"], ext["k"], batch_ext, a, b, mma, acc_roles, est, epi_vars, acc, sch.func
    )


def _walk_loads(e: Expr) -> list[Load]:
    return [x for x in walk(e) if isinstance(x, Load)]


class CudaTensorCoreSketch(Sketch):
    """GEMM groups on tensor cores (see the module docstring)."""

    name = "tensorcore"
    version = 1
    kinds = ("contraction",)

    def __init__(self) -> None:
        self._shapes: dict[tuple[str, bool], _Shape] = {}

    def applies(self, group: Group) -> bool:
        return self.applies_to(group, None)

    def applies_to(self, group: Group, target: Target | None) -> bool:
        if group.kind not in self.kinds:
            return False
        if target is not None and not min_arch(target):
            return False
        try:
            gemm_form(group, tf32=bool(target is not None and target.tf32))
        except ScheduleError:
            return False
        return True

    def _shape(self, group: Group, target: Target) -> _Shape:
        """The GEMM's extents and element type (memoized by workload key and math mode: ``check`` runs
        for every sampled config)."""
        key = (group.workload_key, target.tf32)
        if key not in self._shapes:
            if len(self._shapes) > 4096:
                self._shapes.clear()
            f = gemm_form(group, tf32=target.tf32)
            self._shapes[key] = _Shape(f.M, f.N, f.K, tuple(f.batch), f.mma.dtype, _smem_factors(f))
        return self._shapes[key]

    def space(self, group: Group, target: Target) -> list[Knob]:
        return [
            Knob("bm", (32, 64, 128, 256), "rows of C per thread block"),
            Knob("bn", (32, 64, 128, 256), "columns of C per thread block"),
            Knob("bk", (16, 32, 64), "K slice per pipeline stage"),
            Knob("warps_m", (1, 2, 4), "warps along M (warp tile bm / warps_m)"),
            Knob("warps_n", (1, 2, 4), "warps along N (warp tile bn / warps_n)"),
            Knob("stages", (2, 3, 4), "cp.async pipeline depth (shared-memory tiles in flight)"),
            Knob(
                "smem_layout", ("pad", "xor"), "shared tile rows padded by 16 bytes, or XOR-swizzled chunks"
            ),
            Knob("group_m", (1, 4, 8), "block rows per group of the grouped launch order"),
            Knob("min_blocks", (1, 2), "resident blocks per SM asked of ptxas (__launch_bounds__)"),
        ]

    def check_combination(self, group: Group, config: Config, target: Target) -> None:
        if not min_arch(target):
            raise ScheduleError(
                f"tensorcore: mma.sync with ldmatrix/cp.async needs sm_80 or newer, not {target.arch}"
            )
        form = self._shape(group, target)
        bm, bn = config["bm"], config["bn"]
        wm, wn = bm // config["warps_m"], bn // config["warps_n"]
        if bm % config["warps_m"] or wm % 16 or bn % config["warps_n"] or wn % 16:
            raise ScheduleError(
                f"tensorcore: warp tile {bm}/{config['warps_m']} x {bn}/{config['warps_n']} must be "
                "multiples of 16"
            )
        if (wm // 16) * (wn // 8) * 4 > MAX_ACC_PER_THREAD:
            raise ScheduleError(
                f"tensorcore: warp tile {wm}x{wn} needs {(wm // 16) * (wn // 8) * 4} accumulators per thread "
                f"(at most {MAX_ACC_PER_THREAD})"
            )
        for knob, tile, extent in (("bm", bm, form.M), ("bn", bn, form.N)):
            if tile > max(32, 1 << (extent - 1).bit_length()):
                raise ScheduleError(
                    f"tensorcore: {knob} {tile} exceeds the extent {extent}'s next power of two"
                )
        threads = WARP * config["warps_m"] * config["warps_n"]
        smem = _smem_bytes(form, config)
        if smem > target.max_shared_bytes_optin:
            raise ScheduleError(f"tensorcore: {smem} bytes of shared memory exceed the device limit")
        blocks = config["min_blocks"]
        if threads * blocks > threads_per_sm(target) or smem * blocks > target.max_shared_bytes_optin + 1024:
            raise ScheduleError(
                f"tensorcore: min_blocks {blocks} does not fit an SM ({threads} threads, {smem} B)"
            )
        g = config["group_m"]
        if g > 1 and -(-form.M // bm) % g:
            raise ScheduleError(f"tensorcore: group_m {g} does not divide the {-(-form.M // bm)} block rows")

    def default(self, group: Group, target: Target) -> Config:
        form = self._shape(group, target)
        big = form.M >= 1024 and form.N >= 1024
        # nvcc 13 -Xptxas -v (tests/compiler/backends/cuda/test_tensorcore.py -k nvcc -s): 128x128 with 2x4
        # warps (64x32 warp tiles) 96 registers, 48 KiB shared; with 2x2 warps 205 registers. 64x64 tiles:
        # padded rows (the XOR layout made ptxas spill 4 bytes on sm_80 at 3 stages)
        config = {
            "bm": 128 if big else 64,
            "bn": 128 if big else 64,
            "bk": 32,
            "warps_m": 2,
            "warps_n": 4 if big else 2,
            "stages": 3,
            "smem_layout": "xor" if big else "pad",
            "group_m": 8 if big and -(-form.M // 128) % 8 == 0 else 1,
            "min_blocks": 1,
        }
        for tile in ("bm", "bn"):  # small extents: shrink the tile (and its warps) to the cap
            ext = form.M if tile == "bm" else form.N
            while config[tile] > max(32, 1 << (ext - 1).bit_length()):
                config[tile] //= 2
        # small grids (BERT's 128 x 768 projections): halve the tiles until every SM gets a block
        batch = _prod(list(form.batch))
        while not big and batch * -(-form.M // config["bm"]) * -(-form.N // config["bn"]) < target.cores:
            tile = "bm" if config["bm"] >= config["bn"] else "bn"
            if config[tile] == 32:
                break
            config[tile] //= 2
        for tile, warps in (("bm", "warps_m"), ("bn", "warps_n")):
            while config[tile] // config[warps] < 16:
                config[warps] //= 2
        self.check(group, config, target)
        return config

    def build(self, group: Group, config: Config, target: Target) -> Schedule:
        self.check(group, config, target)
        form = gemm_form(group, tf32=target.tf32)
        body = _Kernel(form, config).build()
        f = form.func
        root = Block("root", [], [], SeqStmt([body]))
        func = PrimFunc(f.name, f.params, root, f.num_inputs, dict(f.attrs))
        if config["min_blocks"] > 1:
            func.attrs["min_blocks_per_sm"] = config["min_blocks"]
        return Schedule(func)


@dataclass(frozen=True)
class _Shape:
    M: int
    N: int
    K: int
    batch: tuple[int, ...]
    dtype: str
    k_contig: tuple[bool, bool]  # A's and B's innermost axis is K


def _smem_factors(form: GemmForm) -> tuple[bool, bool]:
    return form.a.k_contig, form.b.k_contig


def _tile_geometry(form: GemmForm, op: Operand, mn_tile: int, bk: int, layout: str) -> tuple[int, int, int]:
    """(rows, row length, padded row length) of an operand's shared tile, in elements."""
    elems = CHUNK_BYTES // _itemsize(form)
    rows, length = (mn_tile, bk) if op.k_contig else (bk, mn_tile)
    return rows, length, length + (elems if layout == "pad" else 0)


def _itemsize(form: GemmForm) -> int:
    return dtypes.info(form.mma.dtype).itemsize


def _smem_bytes(shape: _Shape, config: Config) -> int:
    item = dtypes.info(shape.dtype).itemsize
    total = 0
    for k_contig, tile in zip(shape.k_contig, (config["bm"], config["bn"])):
        rows, length = (tile, config["bk"]) if k_contig else (config["bk"], tile)
        total += rows * (length + (CHUNK_BYTES // item if config["smem_layout"] == "pad" else 0))
    return total * config["stages"] * item


class _Kernel:
    """The loop IR of one tensor-core kernel for a form and a config."""

    def __init__(self, form: GemmForm, config: Config) -> None:
        self.f, self.c = form, config
        self.mma = form.mma
        self.E = CHUNK_BYTES // _itemsize(form)
        self.bm, self.bn, self.bk = config["bm"], config["bn"], config["bk"]
        self.wm, self.wn = self.bm // config["warps_m"], self.bn // config["warps_n"]
        self.MI, self.NI = self.wm // 16, self.wn // 8
        self.S = config["stages"]
        self.KT = -(-form.K // self.bk)
        self.MT, self.NT = -(-form.M // self.bm), -(-form.N // self.bn)
        self.W = config["warps_m"] * config["warps_n"]
        self.tx, self.ty = Var("lane"), Var("warp")
        dt = self.mma.dtype
        self.geo = {}
        self.smem = {}
        for key, op, tile in (("a", form.a, self.bm), ("b", form.b, self.bn)):
            rows, length, padded = _tile_geometry(form, op, tile, self.bk, config["smem_layout"])
            self.geo[key] = (rows, length, padded)
            self.smem[key] = Buffer(f"{key.upper()}s", (self.S * rows * padded,), dt, "shared")
        self.acc = Buffer("acc", (self.MI * self.NI * 4,), "float32", "local")
        self.afrag = Buffer("afrag", (self.MI * self.mma.a_elems,), dt, "local")
        self.bfrag = Buffer("bfrag", (self.NI * self.mma.b_elems,), dt, "local")

    # ------------------------------------------------------------------ addresses
    def phys(self, key: str, row: Expr, col: Expr) -> Expr:
        """Flat element offset of (row, col) in one stage of a shared tile (padded or XOR-swizzled)."""
        _, length, padded = self.geo[key]
        if self.c["smem_layout"] == "pad":
            return row * padded + col
        chunks = length // self.E
        per = max(1, 8 // chunks)
        swz = (row // per) % min(chunks, 8)
        chunk = Call("xor", (col // self.E, swz), "int32")
        return row * length + chunk * self.E + col % self.E

    def stage_base(self, key: str, stage: Expr) -> Expr:
        rows, _, padded = self.geo[key]
        return stage * (rows * padded)

    # ------------------------------------------------------------------ pieces
    def load_tile(self, key: str, stage: Expr, ko: Expr, tile_mn: Expr, batch: list[Expr]) -> Stmt:
        op = self.f.a if key == "a" else self.f.b
        mn_ext = self.f.M if key == "a" else self.f.N
        mn_tile = self.bm if key == "a" else self.bn
        rows, length, _ = self.geo[key]
        per_row = length // self.E
        chunks = rows * per_row
        T = WARP * self.W
        tid = self.ty * WARP + self.tx
        out = []
        it = Var(f"{key}_it")
        c = it * T + tid
        row, cc = c // per_row, c % per_row
        mn_l, k_l = (row, cc * self.E) if op.k_contig else (cc * self.E, row)
        mn = tile_mn * mn_tile + mn_l
        k = ko * self.bk + k_l
        conds = []
        if mn_ext % mn_tile:
            conds.append(mn.lt(mn_ext))
        if self.f.K % self.bk:
            conds.append(k.lt(self.f.K))
        src = op.offset(batch, mn, k)
        valid: Expr = logical_and(*conds) if conds else const(True, "bool")
        if conds:
            src = select(valid, src, const(0))
        dst = self.stage_base(key, stage) + self.phys(key, row, cc * self.E)
        copy: Stmt = Intrinsic("cp_async", (self.smem[key], op.buf), (dst, src), (valid,))
        if chunks % T:
            copy = IfThenElse(c.lt(chunks), copy)
        out.append(For(it, -(-chunks // T), copy, "unrolled"))
        return seq(*out)

    def load_all(self, stage: Expr, ko: Expr, tm: Expr, tn: Expr, batch: list[Expr]) -> Stmt:
        return seq(self.load_tile("a", stage, ko, tm, batch), self.load_tile("b", stage, ko, tn, batch))

    def fragments(self, stage: Expr, kk: Var, wmi: Expr, wni: Expr) -> Stmt:
        """Load the A and B fragments of the kk-th mma K step from the stage's tiles."""
        lane = self.tx
        out: list[Stmt] = []
        if self.mma.ldmatrix:
            j, r = lane // 8, lane % 8
            mi, nj = Var("mi"), Var("nj")
            for key, op, frag, base, blocks, count, size in (
                ("a", self.f.a, self.afrag, wmi * self.wm + mi * 16, (j % 2, j // 2), self.MI, 8),
                ("b", self.f.b, self.bfrag, wni * self.wn + nj * 16, (j // 2, j % 2), self.NI // 2, 8),
            ):
                mn_blk, k_blk = blocks
                if op.k_contig:
                    row, col, trans = base + mn_blk * 8 + r, kk * 16 + k_blk * 8, 0
                else:
                    row, col, trans = kk * 16 + k_blk * 8 + r, base + mn_blk * 8, 1
                loop_var = mi if key == "a" else nj
                ld = Intrinsic(
                    "ldmatrix",
                    (frag, self.smem[key]),
                    (loop_var * size, self.stage_base(key, stage) + self.phys(key, row, col)),
                    (const(4), const(trans)),
                )
                out.append(For(loop_var, count, ld, "unrolled"))
            return seq(*out)
        # TF32: each lane reads its fragment elements (PTX m16n8k8 layouts) and rounds them
        g, t = lane // 4, lane % 4
        mi, ni, i = Var("mi"), Var("ni"), Var("i")
        m = wmi * self.wm + mi * 16 + g + 8 * (i % 2)
        k = kk * 8 + t + 4 * (i // 2)
        out.append(
            For(
                mi,
                self.MI,
                For(i, 4, self._frag_store("a", self.afrag, mi * 4 + i, m, k, stage), "unrolled"),
                "unrolled",
            )
        )
        n = wni * self.wn + ni * 8 + g
        k = kk * 8 + t + 4 * i
        out.append(
            For(
                ni,
                self.NI,
                For(i, 2, self._frag_store("b", self.bfrag, ni * 2 + i, n, k, stage), "unrolled"),
                "unrolled",
            )
        )
        return seq(*out)

    def _frag_store(self, key: str, frag: Buffer, at: Expr, mn: Expr, k: Expr, stage: Expr) -> Stmt:
        op = self.f.a if key == "a" else self.f.b
        row, col = (mn, k) if op.k_contig else (k, mn)
        value = Load(self.smem[key], (self.stage_base(key, stage) + self.phys(key, row, col),))
        return BufferStore(frag, (at,), Call("tf32_round", (value,), "float32"))

    def mmas(self) -> Stmt:
        mi, ni = Var("mi"), Var("ni")
        at = (mi * self.NI + ni) * 4
        op = Intrinsic(
            self.mma.intrinsic,
            (self.acc, self.afrag, self.bfrag, self.acc),
            (at, mi * self.mma.a_elems, ni * self.mma.b_elems, at),
        )
        return For(mi, self.MI, For(ni, self.NI, op, "unrolled"), "unrolled")

    def epilogue(self, tm: Expr, tn: Expr, wmi: Expr, wni: Expr, batch: list[Expr]) -> Stmt:
        f = self.f
        g, t = self.tx // 4, self.tx % 4
        mi, ni, i = Var("mi"), Var("ni"), Var("i")
        m = tm * self.bm + wmi * self.wm + mi * 16 + g + 8 * (i // 2)
        n = tn * self.bn + wni * self.wn + ni * 8 + 2 * t + i % 2
        coord = {"m": m, "n": n}
        mapping = {}
        for v, r in zip(f.epi_vars, f.acc_roles):
            mapping[v] = batch[r[1]] if isinstance(r, tuple) else coord[r]
        elem: Expr = Load(self.acc, ((mi * self.NI + ni) * 4 + i,))
        if f.acc.dtype != "float32":
            elem = Cast(elem, f.acc.dtype)
        value = replace_buffer_loads(f.epi.value, lambda ld: elem if ld.buffer is f.acc else None)
        value = substitute(value, mapping)
        idx = tuple(substitute(x, mapping) for x in f.epi.indices)
        st: Stmt = BufferStore(f.epi.buffer, idx, value)
        conds = []
        if f.M % self.bm:
            conds.append(m.lt(f.M))
        if f.N % self.bn:
            conds.append(n.lt(f.N))
        if conds:
            st = IfThenElse(logical_and(*conds), st)
        return For(mi, self.MI, For(ni, self.NI, For(i, 4, st, "unrolled"), "unrolled"), "unrolled")

    # ------------------------------------------------------------------ kernel
    def build(self) -> Stmt:
        f, S = self.f, self.S
        wmi, wni = self.ty // self.c["warps_n"], self.ty % self.c["warps_n"]
        # block indices
        g = self.c["group_m"]
        outer: list[tuple[Var, int, str]] = []
        if g > 1 and g < self.MT:
            pid = Var("pid")
            width = g * self.NT
            tm = (pid // width) * g + pid % g
            tn = (pid % width) // g
            outer.append((pid, self.MT * self.NT, "blockIdx.x"))
        else:
            by, bx = Var("tile_m"), Var("tile_n")
            tm, tn = by, bx
            outer += [(by, self.MT, "blockIdx.y"), (bx, self.NT, "blockIdx.x")]
        batch: list[Expr] = []
        if f.batch:
            bz = Var("batch")
            rest: Expr = bz
            for extent in reversed(f.batch):  # row-major decomposition of the fused batch index
                batch.insert(0, rest % extent if len(batch) + 1 < len(f.batch) else rest)
                rest = rest // extent
            outer.insert(0, (bz, _prod(f.batch), "blockIdx.z"))
        ko, kk, zero = Var("ko"), Var("kk"), Var("z")
        init = For(zero, self.acc.numel, BufferStore(self.acc, (zero,), const(0.0, "float32")), "unrolled")
        prologue = [
            seq(self.load_all(const(p), const(p), tm, tn, batch) if p < self.KT else None, _commit())
            for p in range(S - 1)
        ]
        nxt = ko + (S - 1)
        steps = self.bk // self.mma.k
        stage = ko % S
        main = For(
            ko,
            self.KT,
            seq(
                Intrinsic("cp_async_wait", (), (), (const(S - 2),)),
                Barrier(),
                IfThenElse(nxt.lt(self.KT), self.load_all(nxt % S, nxt, tm, tn, batch)),
                _commit(),
                For(kk, steps, seq(self.fragments(stage, kk, wmi, wni), self.mmas()), "unrolled"),
            ),
        )
        threads_body: Stmt = seq(init, *prologue, main, self.epilogue(tm, tn, wmi, wni, batch))
        for buf in (self.bfrag, self.afrag, self.acc):
            threads_body = Allocate(buf, threads_body)
        # one block over (block indices, warp, lane) bound to the loops: lowering substitutes the loops'
        # (unified) thread variables for its iteration variables
        axes = [*outer, (self.ty, self.W, "threadIdx.y"), (self.tx, WARP, "threadIdx.x")]
        loops = {var: Var(f"{var.name}_l") for var, _, _ in axes}
        block = Block(
            "tensorcore",
            [IterVar(var, extent) for var, extent, _ in axes],
            [loops[var] for var, _, _ in axes],
            threads_body,
        )
        body: Stmt = For(
            loops[self.ty],
            self.W,
            For(loops[self.tx], WARP, block, "thread", "threadIdx.x"),
            "thread",
            "threadIdx.y",
        )
        for buf in (self.smem["b"], self.smem["a"]):
            body = Allocate(buf, body)
        for var, extent, tag in reversed(outer):
            body = For(loops[var], extent, body, "thread", tag)
        return body


def _commit() -> Stmt:
    return Intrinsic("cp_async_commit", (), ())


def _prod(xs: list[int]) -> int:
    return math.prod(xs)


__all__ = ["CudaTensorCoreSketch", "GemmForm", "MMA", "gemm_form", "min_arch"]
