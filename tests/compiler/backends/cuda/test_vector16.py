"""16-bit float vector accesses on cuda: float16/bfloat16 loads and stores of 2, 4 or 8 consecutive
aligned elements become one 4-, 8- or 16-byte access (``unsigned``/``uint2``/``uint4`` bits; lanes widened
from the words' halves, stores narrowed and packed); the pointwise and reduction sketches offer vector 8
(16 bytes) for 16-bit groups only and take it by default; every such config computes the reference in the
SIMT interpreter; nvcc for sm_80 and sm_90."""

from __future__ import annotations

import pytest

from compiler.backends import sketch_for
from compiler.backends.cuda.codegen import generate_cuda
from compiler.backends.cuda.nvrtc import nvcc_check
from compiler.builder import GraphBuilder
from compiler.fusion import fuse
from compiler.passes import optimize
from tests.compiler.backends.cuda.util import CUDA, check_group, lowered, need_nvcc
from tuner.measure.check import RTOL

NARROW = ("float16", "bfloat16")
BITS = {"float16": ("kiln_half", "kiln_h2f", "kiln_f2h"), "bfloat16": ("kiln_bf16", "kiln_b2f", "kiln_f2b")}


def group_of(graph):
    return next(g for g in fuse(optimize(graph)).groups if not g.is_view)


def pointwise(dtype: str, shape=(4, 256)):
    b = GraphBuilder("pw16")
    return group_of(b.build([b.relu(b.add(b.input("x", shape, dtype), b.input("y", shape, dtype)))]))


def softmax(dtype: str, shape=(3, 512)):
    b = GraphBuilder("sm16")
    return group_of(b.build([b.softmax(b.input("x", shape, dtype), axis=-1)]))


def text_of(group, config=None, name="k") -> str:
    func = lowered(group, config)
    func.name = name
    return generate_cuda([func], CUDA)


@pytest.mark.parametrize("dtype", NARROW)
def test_16_byte_accesses_are_the_default_for_16_bit_groups(dtype):
    bits, widen, narrow = BITS[dtype]
    pw = pointwise(dtype)
    assert sketch_for(pw, CUDA).default(pw, CUDA)["vector"] == 8
    text = text_of(pw)
    assert "const uint4 v = *reinterpret_cast<const uint4*>(&in0[" in text
    assert f"{widen}(({bits})(v.w >> 16))" in text  # lane 7: the high half of the fourth word
    assert "*reinterpret_cast<uint4*>(&relu[" in text and f"make_uint4(kiln_pack16({narrow}(st)" in text
    sm = softmax(dtype)
    assert sketch_for(sm, CUDA).default(sm, CUDA)["vector"] == 8
    assert "*reinterpret_cast<const uint4*>(&in0[" in text_of(sm)


def test_float32_groups_keep_their_vector_knob():
    for group in (pointwise("float32"), softmax("float32")):
        knob = next(k for k in sketch_for(group, CUDA).space(group, CUDA) if k.name == "vector")
        assert knob.values == (1, 2, 4)


@pytest.mark.parametrize("dtype", NARROW)
@pytest.mark.parametrize("vector", [2, 4, 8])
def test_16_bit_vector_configs_compute_the_reference(dtype, vector):
    pw = pointwise(dtype, (3, 40))
    check_group(pw, {"threads": 64, "elems": 8, "vector": vector}, tol=RTOL[dtype])
    sm = softmax(dtype, (3, 96))
    config = {**sketch_for(sm, CUDA).default(sm, CUDA), "vector": vector, "threads_per_row": 32}
    check_group(sm, config, tol=RTOL[dtype])
    width = {2: "unsigned", 4: "uint2", 8: "uint4"}[vector]
    assert f"reinterpret_cast<const {width}*>(&in0[" in text_of(
        pw, {"threads": 64, "elems": 8, "vector": vector}
    )


@pytest.mark.parametrize("dtype", NARROW)
def test_16_bit_rows_in_shared_memory_or_reread_compute_the_reference(dtype):
    sm = softmax(dtype, (3, 256))
    for keep in ("shared", "reread"):
        for rows in (1, 2):
            config = {**sketch_for(sm, CUDA).default(sm, CUDA), "vector": 8, "keep_row": keep}
            config.update(threads_per_row=32, rows_per_block=rows, unroll=4)
            check_group(sm, config, tol=RTOL[dtype])


def test_misaligned_16_bit_runs_use_narrower_or_scalar_accesses():
    # rows of 6 halves: a row starts at 6*r, so only 2-lane (4-byte) words are provably aligned
    text = text_of(pointwise("float16", (5, 6)), {"threads": 64, "elems": 2, "vector": 2})
    assert "uint2" not in text and "uint4" not in text


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_16_bit_vector_kernels_compile_with_nvcc(arch):
    need_nvcc()
    funcs = []
    for dtype in NARROW:
        for k, group in enumerate((pointwise(dtype), softmax(dtype), softmax(dtype, (2, 8192)))):
            func = lowered(group)
            func.name = f"{dtype}_{k}"
            funcs.append(func)
    res = nvcc_check(generate_cuda(funcs, CUDA), arch)
    assert len(res) == 6 and all(r.spill_stores == 0 for r in res.values())
