"""Tensor-core intrinsics in the SIMT interpreter (``compiler.loopir.interp_simt``): the semantics of the
:class:`~compiler.loopir.stmt.Intrinsic` statements the CUDA tensor-core sketch emits, per the PTX ISA.

Fragments are ``local`` buffers (one copy per thread) holding each lane's registers element by element:
an f16 / bf16 fragment register is two consecutive 16-bit elements, a tf32 one one float32 element.
``lane`` = linear thread index % 32, ``g`` = lane // 4 (groupID), ``t`` = lane % 4 (thread in group).

* ``mma_m16n8k16`` (buffers D, A, B, C; ``mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32``):
  A is 16x16 (8 elements per lane: ``a[i]`` is row ``g + 8*((i//2)%2)``, column ``2t + i%2 + 8*(i//4)``),
  B is 16x8 (4 per lane: ``b[i]`` is row (k) ``2t + i%2 + 8*(i//2)``, column ``g``), C and D are 16x8
  float32 (4 per lane: ``c[i]`` is row ``g + 8*(i//2)``, column ``2t + i%2``). D = A B + C, products exact,
  sums in float64 rounded once to float32 (the hardware's order is unspecified; it is at least this exact
  to within float32 accumulation).
* ``mma_m16n8k8_tf32`` (``mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32``): A 16x8 (``a[i]``: row
  ``g + 8*(i%2)``, column ``t + 4*(i//2)``), B 8x8 (``b[i]``: row ``t + 4*i``, column ``g``), C/D as above.
  The tensor core reads only the 19 high bits of each input (sign, exponent, 10 mantissa bits): inputs
  that were not converted with ``cvt.rna.tf32.f32`` (``tf32_round``) are truncated here as on hardware.
* ``ldmatrix`` (buffers fragment, shared tile; args ``num`` in 1/2/4, ``trans`` 0/1;
  ``ldmatrix.sync.aligned.m8n8.x{num}[.trans].shared.b16``): lane ``8j + r`` (j < num) gives the flat
  offset of row ``r`` of 8x8 matrix ``j`` (8 consecutive b16 elements, 16-byte aligned); every lane
  receives register ``j`` = elements ``M_j[g][2t], M_j[g][2t+1]`` (``.trans``: ``M_j[2t][g], M_j[2t+1][g]``)
  into fragment elements ``offset + 2j, offset + 2j + 1``.
* ``cp_async`` (buffers shared dst, global src; args ``valid`` and optionally ``bytes``, 4, 8 or 16, default
  16; ``cp.async.{cg,ca}.shared.global`` of that many bytes, ``src-size`` 0 when not valid; both addresses
  aligned to the size): the thread's bytes are read at issue and land in shared memory
  at the ``cp_async_wait`` that completes their group (zeros when not valid); reading them earlier reads
  what was there before. ``cp_async_commit`` closes the open group; ``cp_async_wait`` (arg ``n``) lands
  every group but the ``n`` most recent. Both must be executed by every thread of the block (the sketch's
  use; an InterpError otherwise). Issuing a copy over shared elements another thread read in the same
  barrier interval is a data race (write-after-read); the landed elements count as written by the issuing
  thread at the wait.

Warp-collective operations (``ldmatrix``, ``mma``) need all 32 lanes of each warp they run on active.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from compiler import dtypes
from compiler.loopir.interp_simt_expr import Fn, _err, _expr, _full
from compiler.loopir.stmt import Intrinsic

if TYPE_CHECKING:
    from compiler.loopir.interp_simt import _Ctx

WARP = 32
CP_ASYNC_BYTES = 16  # the size of a cp_async without a bytes argument
CP_ASYNC_SIZES = (4, 8, 16)


# --------------------------------------------------------------------------- fragment layouts (PTX ISA)
def a_coords(shape: str, i: int, lane: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row, column) of element ``i`` of the A fragment held by ``lane``."""
    g, t = lane // 4, lane % 4
    if shape == "m16n8k16":
        return g + 8 * ((i // 2) % 2), 2 * t + i % 2 + 8 * (i // 4)
    return g + 8 * (i % 2), t + 4 * (i // 2)  # m16n8k8 tf32


def b_coords(shape: str, i: int, lane: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row k, column n) of element ``i`` of the B fragment held by ``lane``."""
    g, t = lane // 4, lane % 4
    if shape == "m16n8k16":
        return 2 * t + i % 2 + 8 * (i // 2), g
    return t + 4 * i, g


def c_coords(i: int, lane: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row, column) of element ``i`` of the C/D fragment held by ``lane`` (both shapes)."""
    g, t = lane // 4, lane % 4
    return g + 8 * (i // 2), 2 * t + i % 2


MMA_SHAPES = {  # name -> (shape, K, A elements, B elements per lane)
    "mma_m16n8k16": ("m16n8k16", 16, 8, 4),
    "mma_m16n8k16_bf16": ("m16n8k16", 16, 8, 4),  # bfloat16 inputs: the f16 fragment layout
    "mma_m16n8k8_tf32": ("m16n8k8", 8, 4, 2),
}


def tf32_truncate(x: np.ndarray) -> np.ndarray:
    """What the tensor core reads of a float32: the low 13 mantissa bits dropped."""
    bits = np.asarray(x, np.float32).view(np.uint32) & np.uint32(0xFFFFE000)
    return bits.view(np.float32)


def tf32_round(x: np.ndarray) -> np.ndarray:
    """``cvt.rna.tf32.f32``: round to 10 mantissa bits, ties away from zero (NaN/inf unchanged)."""
    a = np.asarray(x, np.float32)
    bits = a.view(np.uint32)
    rounded = ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).astype(np.uint32)
    return np.where(np.isfinite(a), rounded.view(np.float32), a).astype(np.float32)


# --------------------------------------------------------------------------- statements
def compile_intrinsic(s: Intrinsic) -> Fn:
    offs = [_expr(o) for o in s.offsets]
    args = [_expr(a) for a in s.args]
    if s.name in MMA_SHAPES:
        return _mma(s, offs)
    if s.name == "ldmatrix":
        return _ldmatrix(s, offs)
    if s.name == "cp_async":
        return _cp_async(s, offs, args)
    if s.name == "cp_async_commit":
        return _cp_commit(s)
    if s.name == "cp_async_wait":
        return _cp_wait(s)
    raise _err(f"unknown intrinsic {s.name}")


def _warps(ctx: _Ctx, act: np.ndarray, name: str) -> None:
    warps, counts = np.unique(act // WARP, return_counts=True)
    if (counts != WARP).any():
        w = int(warps[np.argmax(counts != WARP)])
        raise _err(
            f"{name} in {ctx.where()}: lanes of warp {w} are not all active "
            "(a warp-collective operation needs all 32 lanes)"
        )


def _local(ctx: _Ctx, s: Intrinsic, k: int) -> np.ndarray:
    buf = s.buffers[k]
    if buf.uid not in ctx.local:
        raise _err(f"{s.name}: operand {buf.name} must be a local fragment allocated in the thread block")
    return ctx.bufs[buf.uid].reshape(ctx.n, -1)


def _offsets(fn: Fn, ctx: _Ctx, act: np.ndarray, width: int, size: int, s: Intrinsic, k: int) -> np.ndarray:
    o = _full(fn(ctx, act), len(act)).astype(np.int64)
    bad = (o < 0) | (o + width > size)
    if bad.any():
        j = int(np.argmax(bad))
        raise _err(
            f"out-of-bounds {s.name} operand {s.buffers[k].name}: elements "
            f"{int(o[j])}..{int(o[j]) + width - 1} by thread {int(act[j])} of {ctx.where()} (size {size})"
        )
    return o


def _mma(s: Intrinsic, offs: list[Fn]) -> Fn:
    shape, kdim, na, nb = MMA_SHAPES[s.name]
    tf32 = shape == "m16n8k8"
    if len(s.buffers) != 4:
        raise _err(f"{s.name} takes 4 buffers (D, A, B, C), got {len(s.buffers)}")

    def run(ctx: _Ctx, act: np.ndarray) -> None:
        if not len(act):
            return
        _warps(ctx, act, s.name)
        d, a, b, c = (_local(ctx, s, k) for k in range(4))
        od, oa, ob, oc = (
            _offsets(offs[k], ctx, act, w, arr.shape[1], s, k)
            for k, (w, arr) in enumerate(((4, d), (na, a), (nb, b), (4, c)))
        )
        order = np.argsort(act, kind="stable")
        act, od, oa, ob, oc = act[order], od[order], oa[order], ob[order], oc[order]
        for w0 in range(0, len(act), WARP):
            th = act[w0 : w0 + WARP]
            lane = th % WARP
            sl = slice(w0, w0 + WARP)
            A = np.zeros((16, kdim), np.float64)
            B = np.zeros((kdim, 8), np.float64)
            C = np.zeros((16, 8), np.float64)
            for i in range(na):
                r, col = a_coords(shape, i, lane)
                v = a[th, oa[sl] + i]
                A[r, col] = tf32_truncate(v) if tf32 else v
            for i in range(nb):
                r, col = b_coords(shape, i, lane)
                v = b[th, ob[sl] + i]
                B[r, col] = tf32_truncate(v) if tf32 else v
            for i in range(4):
                r, col = c_coords(i, lane)
                C[r, col] = c[th, oc[sl] + i]
            with np.errstate(all="ignore"):
                D = (A @ B + C).astype(np.float32)
            for i in range(4):
                r, col = c_coords(i, lane)
                d[th, od[sl] + i] = D[r, col]

    return run


def _ldmatrix(s: Intrinsic, offs: list[Fn]) -> Fn:
    num, trans = (int(getattr(a, "value", -1)) for a in s.args)
    if num not in (1, 2, 4) or trans not in (0, 1):
        raise _err(f"ldmatrix: num must be 1, 2 or 4 and trans 0 or 1 (constants), got {s.args}")
    src_buf = s.buffers[1]
    if dtypes.info(src_buf.dtype).itemsize != 2:
        raise _err(f"ldmatrix reads b16 elements; {src_buf.name} is {src_buf.dtype}")

    def run(ctx: _Ctx, act: np.ndarray) -> None:
        if not len(act):
            return
        _warps(ctx, act, "ldmatrix")
        frag = _local(ctx, s, 0)
        src = ctx.bufs[src_buf.uid].reshape(-1)
        of = _offsets(offs[0], ctx, act, 2 * num, frag.shape[1], s, 0)
        orow = _offsets(offs[1], ctx, act, 8, src.size, s, 1)
        if (orow % 8).any():
            j = int(np.argmax(orow % 8 != 0))
            raise _err(
                f"ldmatrix: row address {int(orow[j])} of {src_buf.name} by thread {int(act[j])} "
                "is not 16-byte aligned"
            )
        _shared_read(ctx, src_buf, orow, act, 8)
        order = np.argsort(act, kind="stable")
        act, of, orow = act[order], of[order], orow[order]
        for w0 in range(0, len(act), WARP):
            th = act[w0 : w0 + WARP]
            lane = th % WARP
            rows = orow[w0 : w0 + WARP]
            g, t = lane // 4, lane % 4
            for j in range(num):
                mat = src[rows[8 * j : 8 * j + 8, None] + np.arange(8)]  # [row r][col]
                for h in range(2):
                    v = mat[2 * t + h, g] if trans else mat[g, 2 * t + h]
                    frag[th, of[w0 : w0 + WARP] + 2 * j + h] = v

    return run


def _shared_read(ctx: _Ctx, buf, start: np.ndarray, act: np.ndarray, width: int) -> None:
    """Race checks and reader marks for ``width`` elements from each ``start`` (a read of shared memory)."""
    sh = ctx.shared.get(buf.uid)
    if sh is None:
        raise _err(f"{buf.name} is not a shared buffer of {ctx.where()}")
    flat = (start[:, None] + np.arange(width)).reshape(-1)
    who = np.repeat(act, width)
    w = np.where(sh.wepoch[flat] == ctx.epoch, sh.writer[flat], -1)
    bad = (w >= 0) & (w != who)
    if bad.any():
        j = int(np.argmax(bad))
        raise _err(
            f"data race on {buf.name}[{int(flat[j])}] in {ctx.where()}: thread {int(who[j])} reads what "
            f"thread {int(w[j])} wrote (or what its cp.async landed) with no barrier in between"
        )
    cur = np.where(sh.repoch[flat] == ctx.epoch, sh.reader[flat], -1)
    sh.reader[flat] = np.where((cur >= 0) & (cur != who), -2, who)
    sh.repoch[flat] = ctx.epoch


def _cp_async(s: Intrinsic, offs: list[Fn], args: list[Fn]) -> Fn:
    dst_buf, src_buf = s.buffers
    nbytes = int(getattr(s.args[1], "value", -1)) if len(s.args) > 1 else CP_ASYNC_BYTES
    itemsize = dtypes.info(dst_buf.dtype).itemsize
    if nbytes not in CP_ASYNC_SIZES or nbytes % itemsize:
        raise _err(
            f"cp_async copies 4, 8 or 16 bytes (a constant) of whole {dst_buf.dtype} elements, "
            f"got {s.args[1:]}"
        )
    width = nbytes // itemsize
    if dst_buf.scope != "shared" or src_buf.scope != "global" or dst_buf.dtype != src_buf.dtype:
        raise _err(f"cp_async copies global to shared memory of one dtype: {dst_buf!r} <- {src_buf!r}")

    def run(ctx: _Ctx, act: np.ndarray) -> None:
        if not len(act):
            return
        dst = ctx.bufs[dst_buf.uid].reshape(-1)
        src = ctx.bufs[src_buf.uid].reshape(-1)
        valid = _full(args[0](ctx, act), len(act)).astype(bool)
        od = _offsets(offs[0], ctx, act, width, dst.size, s, 0)
        os_ = np.where(valid, _full(offs[1](ctx, act), len(act)).astype(np.int64), 0)
        _offsets(lambda c, a: os_, ctx, act, width, src.size, s, 1)
        if (od % width).any() or (os_ % width).any():
            j = int(np.argmax((od % width != 0) | (os_ % width != 0)))
            raise _err(f"cp_async by thread {int(act[j])}: addresses are not {nbytes}-byte aligned")
        sh = ctx.shared[dst_buf.uid]
        flat = (od[:, None] + np.arange(width)).reshape(-1)
        who = np.repeat(act, width)
        r = np.where(sh.repoch[flat] == ctx.epoch, sh.reader[flat], -1)
        bad = (r != -1) & (r != who)
        if bad.any():
            j = int(np.argmax(bad))
            raise _err(
                f"data race on {dst_buf.name}[{int(flat[j])}] in {ctx.where()}: thread {int(who[j])}'s "
                "cp.async overwrites what another thread read with no barrier in between"
            )
        vals = np.where(valid[:, None], src[os_[:, None] + np.arange(width)], 0).astype(dst.dtype)
        ctx.cp_open.append((dst_buf.uid, flat, vals.reshape(-1), who))

    return run


def _cp_commit(s: Intrinsic) -> Fn:
    def run(ctx: _Ctx, act: np.ndarray) -> None:
        _uniform(ctx, act, s.name)
        ctx.cp_groups.append(ctx.cp_open)
        ctx.cp_open = []

    return run


def _cp_wait(s: Intrinsic) -> Fn:
    keep = int(getattr(s.args[0], "value", -1)) if s.args else -1
    if keep < 0:
        raise _err("cp_async_wait needs a constant number of groups left in flight")

    def run(ctx: _Ctx, act: np.ndarray) -> None:
        _uniform(ctx, act, s.name)
        n = max(0, len(ctx.cp_groups) - keep)
        done, ctx.cp_groups = ctx.cp_groups[:n], ctx.cp_groups[n:]
        for group in done:
            for uid, flat, vals, who in group:
                ctx.bufs[uid].reshape(-1)[flat] = vals
                sh = ctx.shared[uid]
                sh.writer[flat] = who
                sh.wepoch[flat] = ctx.epoch

    return run


def _uniform(ctx: _Ctx, act: np.ndarray, name: str) -> None:
    if len(act) != ctx.n:
        raise _err(
            f"{name} executed by {len(act)} of the {ctx.n} threads of {ctx.where()}: the interpreter "
            "models cp.async groups per block, so every thread must commit and wait together"
        )
