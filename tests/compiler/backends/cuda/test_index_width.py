"""64-bit index arithmetic on the CUDA target: a kernel whose indices can pass 2^31 - 1 reads its block
and thread indices as ``int64_t`` (so ``bx * 256 + tx`` and every offset built on them is 64-bit) and uses
the 64-bit helpers; a kernel whose indices fit keeps ``int32_t``; a grid over the hardware limit is a clear
CompileError. Huge tensors are only generated (and compiled with nvcc when it is installed), never
allocated."""

from __future__ import annotations

import re

import pytest

from compiler.backends.cuda.codegen import generate_cuda, kernel_launches
from compiler.backends.cuda.nvrtc import nvcc_available, nvcc_check
from compiler.builder import GraphBuilder
from compiler.errors import CompileError
from compiler.fusion import fuse
from compiler.loopir.expr import Load, Var, const, maximum, minimum
from compiler.loopir.index_width import index_overflow
from compiler.loopir.stmt import Buffer, BufferStore, For, PrimFunc
from compiler.passes import optimize
from tests.compiler.backends.cuda.util import CUDA, lowered

BIG = (3, 1 << 30)  # 3 * 2^30 elements: flat offsets up to 3.2e9
needs_nvcc = pytest.mark.skipif(not nvcc_available(), reason="nvcc is not installed (CUDA toolkit needed)")


def gpu_func(graph) -> PrimFunc:
    return lowered(next(g for g in fuse(optimize(graph)).groups if not g.is_view))


def index_decls(text: str) -> set[str]:
    """The types of the block/thread index variables a kernel declares."""
    return set(re.findall(r"const (\w+) \w+ = \(\w+\)(?:blockIdx|threadIdx)\.[xyz];", text))


def kernel_body(src: str, name: str) -> str:
    start = src.index(f" {name}(")
    return src[start : src.index("\n}\n", start) + 3]


def big_relu() -> PrimFunc:
    b = GraphBuilder("big_relu")
    return gpu_func(b.build([b.relu(b.input("x", BIG))]))


def big_add() -> PrimFunc:
    b = GraphBuilder("big_add")
    return gpu_func(b.build([b.add(b.input("x", BIG), b.input("y", (1 << 30,)))]))


def big_gather() -> PrimFunc:
    b = GraphBuilder("big_gather")
    return gpu_func(b.build([b.gather(b.input("table", (1 << 22, 1024)), b.input("ids", (8, 16), "int64"))]))


def intermediate() -> PrimFunc:
    """out[f] = x[min((f * 3000000) // 3000001, 1023)] + x[max((f * -3) // 7 + 1023, 0)]: offsets stay
    small, the product reaches 3.1e12 and the floor division has a negative operand."""
    x, out = Buffer("x", (1024,), "float32"), Buffer("out", (1 << 20,), "float32")
    bx, tx = Var("bx"), Var("tx")
    f = bx * 256 + tx
    a = minimum((f * 3000000) // 3000001, const(1023))
    b = maximum((f * -3) // 7 + 1023, const(0))
    body = BufferStore(out, (f,), Load(x, (a,)) + Load(x, (b,)))
    nest = For(bx, 4096, For(tx, 256, body, "thread", "threadIdx.x"), "thread", "blockIdx.x")
    return PrimFunc("mid_overflow", [x, out], nest, 1)


def test_relu_over_more_than_2_31_elements_uses_64_bit_indices():
    func = big_relu()
    src = generate_cuda([func], CUDA)
    text = kernel_body(src, func.name)
    assert index_decls(text) == {"int64_t"}, text
    assert "(int64_t)blockIdx.x" in text and "(int64_t)threadIdx.x" in text
    assert "int32_t" not in text


def test_broadcast_add_over_more_than_2_31_elements_uses_64_bit_indices():
    func = big_add()
    text = kernel_body(generate_cuda([func], CUDA), func.name)
    assert index_decls(text) == {"int64_t"}, text


def test_gather_from_a_table_of_more_than_2_31_elements_scales_ids_in_64_bits():
    func = big_gather()
    text = kernel_body(generate_cuda([func], CUDA), func.name)
    assert index_decls(text) == {"int64_t"}, text
    assert "(int64_t)in1[" in text and "int32_t" not in text  # id * 1024 must not wrap at 2^31


def test_intermediate_product_overflow_uses_64_bit_helpers():
    func = intermediate()
    assert "can reach (0, 3145725000000)" in index_overflow(func), index_overflow(func)
    text = kernel_body(generate_cuda([func], CUDA), func.name)
    assert index_decls(text) == {"int64_t"}, text
    assert "kiln_floordiv_i64(" in generate_cuda([func], CUDA)
    assert "min((long long)(" in text


def test_small_kernel_stays_32_bit():
    b = GraphBuilder("small_relu")
    func = gpu_func(b.build([b.relu(b.add(b.input("x", (64, 1000)), b.input("y", (1000,))))]))
    assert index_overflow(func) is None
    text = kernel_body(generate_cuda([func], CUDA), func.name)
    assert index_decls(text) == {"int32_t"}, text
    assert "int64_t" not in text


@needs_nvcc
def test_64_bit_kernels_compile_with_nvcc():
    funcs = [big_relu(), big_add(), big_gather(), intermediate()]
    res = nvcc_check(generate_cuda(funcs, CUDA))
    for f in funcs:
        for launch in kernel_launches(f):
            assert launch["name"] in res, f"nvcc produced no kernel {launch['name']}"


def test_grid_over_the_hardware_limit_names_kernel_buffer_and_size():
    x, y = Buffer("x", (70000, 32), "float32"), Buffer("y", (70000, 32), "float32")
    by, tx = Var("by"), Var("tx")
    body = BufferStore(y, (by, tx), Load(x, (by, tx)) * 2.0)
    nest = For(by, 70000, For(tx, 32, body, "thread", "threadIdx.x"), "thread", "blockIdx.y")
    with pytest.raises(
        CompileError,
        match=r"kernel rows: grid y of 70000 blocks exceeds the limit 65535 \(buffer x: 2240000 elements\)",
    ):
        generate_cuda([PrimFunc("rows", [x, y], nest, 1)], CUDA)
