"""Printing the tensor-core intrinsics (``compiler.loopir.stmt.Intrinsic``) as inline PTX for the CUDA
printer (``compiler.backends.cuda.codegen.CudaPrinter`` calls :func:`emit_intrinsic`).

* float16 and bfloat16 fragments (local 16-bit buffers an intrinsic uses) are ``unsigned`` arrays of
  32-bit registers, two 16-bit elements each (element ``e`` is half ``e % 2`` of word ``e / 2``);
  float32 (TF32) fragments stay ``float`` arrays, passed to ``mma`` as their bits (``__float_as_uint``);
* ``cp_async`` -> ``cp.async.cg.shared.global [dst], [src], 16, src_size`` (``src_size`` 0 zero-fills:
  the predicate); 4- and 8-byte copies (an optional second argument) use ``cp.async.ca`` (``.cg``, which
  bypasses L1, takes only 16 bytes), ``cp_async_commit`` -> ``cp.async.commit_group``, ``cp_async_wait`` ->
  ``cp.async.wait_group N``;
* ``ldmatrix`` -> ``ldmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16`` into fragment words;
* ``mma_m16n8k16`` -> ``mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32``, ``mma_m16n8k16_bf16`` ->
  the same with ``.bf16.bf16``, ``mma_m16n8k8_tf32`` ->
  ``mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32``;
* ``tf32_round(x)`` -> ``kiln_tf32(x)`` (``cvt.rna.tf32.f32``), ``xor(a, b)`` -> ``(a ^ b)``.

Shared addresses are ``__cvta_generic_to_shared`` of the element's address. Every asm is ``volatile`` with
a ``"memory"`` clobber where it touches memory, so nvcc keeps the program order the IR gives."""

from __future__ import annotations

from typing import TYPE_CHECKING

from compiler.errors import CompileError
from compiler.loopir.expr import Const, Expr, const
from compiler.loopir.stmt import Buffer, Intrinsic, Stmt, walk_stmts

if TYPE_CHECKING:
    from compiler.backends.cuda.codegen import CudaPrinter

B16 = ("float16", "bfloat16")  # 16-bit element types: two per 32-bit fragment register

MMA_PTX = {
    "mma_m16n8k16": ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", 8, 4),
    "mma_m16n8k16_bf16": ("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", 8, 4),
    "mma_m16n8k8_tf32": ("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", 4, 2),
}

TF32_HELPER = """__device__ __forceinline__ float kiln_tf32(float x) {
  unsigned r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return __uint_as_float(r);
}"""


def is_fragment(buf: Buffer, body: Stmt) -> bool:
    """A local 16-bit float buffer an intrinsic under ``body`` uses: printed as 32-bit registers."""
    return (
        buf.scope == "local"
        and buf.dtype in B16
        and any(isinstance(x, Intrinsic) and buf in x.buffers for x in walk_stmts(body))
    )


def fragment_decl(buf: Buffer, name: str) -> str:
    if buf.numel % 2:
        raise CompileError(f"fragment {buf.name} has an odd number of 16-bit elements ({buf.numel})")
    return f"unsigned {name}[{buf.numel // 2}];"


def _word(p: CudaPrinter, buf: Buffer, off: Expr, k: int) -> str:
    """Register ``k`` of the fragment starting at element ``off``."""
    name = p.buf_name(buf)
    if buf.dtype in B16:
        return f"{name}[{p.top(p.simplified(off // 2 + k))}]"
    return f"{name}[{p.top(p.simplified(off + k))}]"


def _addr(p: CudaPrinter, buf: Buffer, off: Expr) -> str:
    return f"&{p.buf_name(buf)}[{p.top(p.simplified(off))}]"


def emit_intrinsic(p: CudaPrinter, s: Intrinsic) -> None:
    if s.name == "cp_async":
        dst, src = s.buffers
        valid = p.simplified(s.args[0])
        nbytes = int(s.args[1].value) if len(s.args) > 1 and isinstance(s.args[1], Const) else 16
        if nbytes not in (4, 8, 16):
            raise CompileError(f"cp_async copies 4, 8 or 16 bytes, not {nbytes}")
        cache = "cg" if nbytes == 16 else "ca"
        size = str(nbytes) if isinstance(valid, Const) and valid.value else f"({p.top(valid)} ? {nbytes} : 0)"
        p.line(
            f'asm volatile("cp.async.{cache}.shared.global [%0], [%1], {nbytes}, %2;\\n" :: '
            f'"r"((unsigned)__cvta_generic_to_shared({_addr(p, dst, s.offsets[0])})), '
            f'"l"({_addr(p, src, s.offsets[1])}), "r"({size}) : "memory");'
        )
    elif s.name == "cp_async_commit":
        p.line('asm volatile("cp.async.commit_group;\\n" ::: "memory");')
    elif s.name == "cp_async_wait":
        n = s.args[0]
        if not isinstance(n, Const):
            raise CompileError("cp_async_wait needs a constant number of groups")
        p.line(f'asm volatile("cp.async.wait_group {int(n.value)};\\n" ::: "memory");')
    elif s.name == "ldmatrix":
        frag, src = s.buffers
        num, trans = (int(a.value) for a in s.args if isinstance(a, Const))
        regs = ", ".join(f"%{k}" for k in range(num))
        outs = ", ".join(f'"=r"({_word(p, frag, s.offsets[0], k)})' for k in range(num))
        p.line(
            f'asm volatile("ldmatrix.sync.aligned.m8n8.x{num}{".trans" if trans else ""}.shared.b16 '
            f'{{{regs}}}, [%{num}];\\n" : {outs} : '
            f'"r"((unsigned)__cvta_generic_to_shared({_addr(p, src, s.offsets[1])})) : "memory");'
        )
    elif s.name in MMA_PTX:
        ptx, na, nb = MMA_PTX[s.name]
        d, a, b, c = s.buffers
        od, oa, ob, oc = s.offsets
        bits = (lambda w: f"__float_as_uint({w})") if a.dtype == "float32" else (lambda w: w)
        outs = [f'"=f"({_word(p, d, od, k)})' for k in range(4)]
        ins = [f'"r"({bits(_frag_reg(p, a, oa, k))})' for k in range(_regs(a, na))]
        ins += [f'"r"({bits(_frag_reg(p, b, ob, k))})' for k in range(_regs(b, nb))]
        ins += [f'"f"({_word(p, c, oc, k)})' for k in range(4)]
        ra, rb = _regs(a, na), _regs(b, nb)
        grp = [list(range(0, 4)), list(range(4, 4 + ra)), list(range(4 + ra, 4 + ra + rb))]
        grp.append(list(range(4 + ra + rb, 8 + ra + rb)))
        ops = ", ".join("{" + ", ".join(f"%{k}" for k in g) + "}" for g in grp)
        p.line(f'asm volatile("{ptx} {ops};\\n" : {", ".join(outs)} : {", ".join(ins)});')
    else:
        raise CompileError(f"the CUDA target cannot print intrinsic {s.name}")


def _regs(buf: Buffer, elems: int) -> int:
    return elems // 2 if buf.dtype in B16 else elems


def _frag_reg(p: CudaPrinter, buf: Buffer, off: Expr, k: int) -> str:
    if buf.dtype in B16:
        return _word(p, buf, off, k)
    return f"{p.buf_name(buf)}[{p.top(p.simplified(off + const(k)))}]"
