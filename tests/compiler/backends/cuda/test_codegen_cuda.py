"""The CUDA printer: kernel signatures, thread bindings and guards, shared memory, barriers, warp
shuffles, float4 accesses, exact math; errors for IR the GPU cannot run. All generated kernels of this
module compile together with nvcc (one call)."""

from __future__ import annotations

import re
from functools import cache

import numpy as np
import pytest

from compiler.backends.cuda.codegen import generate_cuda, kernel_launches, kernel_names
from compiler.backends.cuda.nvrtc import nvcc_available, nvcc_check
from compiler.builder import GraphBuilder
from compiler.errors import CompileError
from compiler.fusion import fuse
from compiler.loopir.expr import Load, Var, const
from compiler.loopir.stmt import Allocate, Buffer, BufferStore, For, PrimFunc, seq
from compiler.passes import optimize
from tests.compiler.backends.cuda.util import CUDA, PLAIN, lowered


def group_of(graph, kind=None):
    groups = [g for g in fuse(optimize(graph)).groups if not g.is_view and (kind is None or g.kind == kind)]
    return groups[0]


@cache
def funcs() -> dict[str, PrimFunc]:
    out = {}
    b = GraphBuilder("sm")
    sm = group_of(b.build([b.softmax(b.input("x", (64, 1024)))]))
    out["softmax_warp"] = lowered(
        sm,
        {
            "threads_per_row": 32,
            "rows_per_block": 4,
            "vector": 4,
            "keep_row": "registers",
            "unroll": 1,
            "fast_math": 0,
        },
    )
    out["softmax_block"] = lowered(
        sm,
        {
            "threads_per_row": 256,
            "rows_per_block": 1,
            "vector": 4,
            "keep_row": "reread",
            "unroll": 4,
            "fast_math": 0,
        },
    )
    b = GraphBuilder("gelu")
    x = b.input("x", (256, 3072))
    pw = group_of(b.build([b.gelu(b.add(x, b.param("bias", np.zeros(3072, np.float32))))]))
    out["bias_gelu"] = lowered(pw, {"threads": 256, "elems": 8, "vector": 4})
    b = GraphBuilder("tail")
    out["tail"] = lowered(
        group_of(b.build([b.tanh(b.input("x", (3, 1001)))])), {"threads": 128, "elems": 4, "vector": 4}
    )
    b = GraphBuilder("mm")
    mm = group_of(b.build([b.relu(b.matmul(b.input("a", (512, 512)), b.input("w", (512, 512))))]))
    out["gemm_db"] = lowered(
        mm, {"bm": 128, "bn": 128, "bk": 16, "tm": 8, "tn": 8, "vector": 4, "double_buffer": 1, **PLAIN}
    )
    out["gemm_dynamic"] = lowered(
        mm, {"bm": 256, "bn": 128, "bk": 64, "tm": 8, "tn": 8, "vector": 4, "double_buffer": 0, **PLAIN}
    )
    for name, f in out.items():
        f.name = name
    return out


def src(name: str, **kw) -> str:
    return generate_cuda([funcs()[name]], CUDA, **kw)


def test_kernel_signature_and_bindings():
    text = src("softmax_warp")
    assert re.search(
        r'extern "C" __global__ void __launch_bounds__\(128\) softmax_warp\(const float\* __restrict__ in0, '
        r"float\* __restrict__ divide\)",
        text,
    )
    assert "const int32_t tx = (int32_t)threadIdx.x;" in text and "(int32_t)threadIdx.y" in text
    assert "(int32_t)blockIdx.x" in text
    assert "__shfl_xor_sync" in text and "kiln_warp_reduce_max_f32" in text
    assert "__syncthreads" not in text  # one warp per row: no shared memory
    assert kernel_launches(funcs()["softmax_warp"])[0]["grid"] == [16, 1, 1]


def test_block_reduce_uses_shared_memory_and_barriers():
    text = src("softmax_block")
    assert text.count("__syncthreads();") == 4
    assert re.search(r"__shared__ __align__\(16\) float \w+\[8\];", text)
    assert "#pragma unroll" not in text or "for (" in text


def test_vector_loads_and_stores():
    text = src("bias_gelu")
    assert text.count("*reinterpret_cast<const float4*>") >= 2  # x and the broadcast bias
    assert "*reinterpret_cast<float4*>" in text and "make_float4" in text
    assert "erff(" in text and "__expf" not in text


def test_guarded_tail_keeps_a_vector_path():
    text = src("tail")
    assert "float4" in text  # full vectors
    assert re.search(r"if \(.*< 3003\) \{", text)  # the tail guard
    assert "tanhf(" in text


def test_fast_math_only_when_asked():
    assert "expf(" in src("softmax_warp") and "__expf" not in src("softmax_warp")
    assert "__expf(" in src("softmax_warp", fast_math=True)


def test_gemm_double_buffer_and_register_tile():
    text = src("gemm_db")
    assert text.count("__syncthreads();") == 2  # after the prologue, once per K tile
    assert "float4" in text and "fmaxf" in text  # shared-memory float4 reads; relu epilogue
    launch = kernel_launches(funcs()["gemm_db"])[0]
    assert launch["block"] == [16, 16, 1] and launch["shared_bytes"] == 2 * 2 * 16 * 128 * 4


def test_large_shared_memory_is_dynamic():
    text = src("gemm_dynamic")
    launch = kernel_launches(funcs()["gemm_dynamic"])[0]
    assert launch["dynamic_shared_bytes"] == launch["shared_bytes"] == (256 + 128) * 64 * 4
    assert "extern __shared__ __align__(16) unsigned char kiln_smem[];" in text
    assert "__shared__ __align__(16) float" not in text


def test_errors_for_ir_the_gpu_cannot_run():
    x, y = Buffer("x", (8,), "float32"), Buffer("y", (8,), "float32")
    i = Var("i")
    par = PrimFunc("par", [x, y], For(i, 8, BufferStore(y, (i,), Load(x, (i,))), "parallel"), 1)
    with pytest.raises(CompileError, match="'parallel'"):
        generate_cuda([par])
    tmp = Buffer("tmp", (8,), "float32", "global")
    scratch = PrimFunc(
        "scratch",
        [x, y],
        Allocate(
            tmp,
            seq(
                For(i, 8, BufferStore(tmp, (i,), Load(x, (i,)))),
                For(Var("j"), 8, BufferStore(y, (const(0),), const(1.0))),
            ),
        ),
        1,
    )
    with pytest.raises(CompileError, match="global scratch"):
        generate_cuda([scratch])
    bx, tx = Var("bx"), Var("tx")
    inner = For(
        tx,
        8,
        For(bx, 2, BufferStore(y, (tx,), Load(x, (tx,))), "thread", "blockIdx.x"),
        "thread",
        "threadIdx.x",
    )
    with pytest.raises(CompileError, match="must enclose the whole kernel"):
        generate_cuda([PrimFunc("inside", [x, y], inner, 1)])


def test_sibling_nests_become_separate_kernels():
    x, y, z = Buffer("x", (8,), "float32"), Buffer("y", (8,), "float32"), Buffer("z", (8,), "float32")
    a, b = Var("a"), Var("b")
    body = seq(
        For(a, 8, BufferStore(y, (a,), Load(x, (a,))), "thread", "threadIdx.x"),
        For(b, 8, BufferStore(z, (b,), Load(x, (b,)) * 2.0), "thread", "threadIdx.x"),
    )
    f = PrimFunc("two", [x, y, z], body, 1)
    assert kernel_names(f) == ["two_k0", "two_k1"]
    text = generate_cuda([f])
    assert "void __launch_bounds__(8) two_k0(" in text and "void __launch_bounds__(8) two_k1(" in text


@pytest.mark.skipif(not nvcc_available(), reason="nvcc is not installed (CUDA toolkit needed for this check)")
def test_everything_here_compiles_with_nvcc():
    res = nvcc_check(generate_cuda(list(funcs().values()), CUDA))
    assert set(funcs()) <= set(res)
    for name, r in res.items():
        assert r.spill_stores == 0, f"{name} spills"
    assert res["gemm_db"].registers <= 255


@pytest.mark.skipif(not nvcc_available(), reason="nvcc is not installed (CUDA toolkit needed for this check)")
def test_nvcc_errors_name_the_kernel():
    text = src("softmax_warp").replace("const float4", "const flot4", 1)
    with pytest.raises(
        CompileError, match=r"nvcc failed to compile kernel\(s\) softmax_warp \(sm_90\):\n.*error"
    ):
        nvcc_check(text)
