"""bfloat16 end to end: the dtype (ml_dtypes in numpy), the reference, the cuda target (bfloat16 bits in
memory, floats in registers, every operation rounded to bfloat16 by bit arithmetic, sums in float32), the
SIMT interpreter, ONNX import, nvcc for sm_80/sm_90, and the cpu target's refusal naming the op."""

from __future__ import annotations

import ctypes
import subprocess
from functools import cache
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from compiler import dtypes
from compiler.backends.cuda.codegen import generate_cuda
from compiler.backends.cuda.nvrtc import nvcc_check
from compiler.backends.cuda.prelude import _BF16
from compiler.build import compile as kiln_compile
from compiler.builder import GraphBuilder
from compiler.errors import KilnError
from compiler.reference import run_reference
from tests.compiler.backends.cuda.util import CUDA, check_group, groups_of, lowered, need_nvcc, samples
from tuner.measure.check import RTOL, compare

BF16 = "bfloat16"


def bf16(a) -> np.ndarray:
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16)


def graphs() -> dict:
    out = {}
    b = GraphBuilder("b_softmax")
    out[b.name] = b.build([b.softmax(b.input("x", (5, 96), BF16), axis=-1)])
    b = GraphBuilder("b_layer_norm")
    x = b.input("x", (3, 64), BF16)
    g = b.param("g", bf16(np.linspace(0.5, 1.5, 64)))
    out[b.name] = b.build([b.layer_norm(x, g, b.param("bb", bf16(np.linspace(-1, 1, 64))))])
    b = GraphBuilder("b_bias_gelu")
    x = b.input("x", (7, 48), BF16)
    out[b.name] = b.build([b.gelu(b.add(x, b.param("bias", bf16(np.linspace(-1, 1, 48)))))])
    b = GraphBuilder("b_matmul")
    y = b.matmul(b.input("a", (40, 24), BF16), b.input("w", (24, 36), BF16))
    out[b.name] = b.build([b.relu(b.add(y, b.param("bias", bf16(np.linspace(-1, 1, 36)))))])
    return out


def test_bfloat16_is_a_dtype_backed_by_ml_dtypes():
    assert dtypes.normalize_dtype("bf16") == BF16 == dtypes.normalize_dtype(ml_dtypes.bfloat16)
    assert dtypes.to_numpy(BF16) == np.dtype(ml_dtypes.bfloat16) and dtypes.info(BF16).itemsize == 2
    assert dtypes.is_float(BF16) and dtypes.is_float_numpy(dtypes.to_numpy(BF16))
    assert dtypes.sum_accumulator(BF16) == "float32" == dtypes.sum_accumulator("float16")
    ref = np.full(8, 1.0, ml_dtypes.bfloat16)
    assert compare(ref + bf16(0.0625), ref, "y") is None  # within bfloat16's tolerance
    assert "exceeds" in compare(ref + bf16(0.25), ref, "y")  # compared as floats, not as bits
    assert RTOL[BF16] > RTOL["float16"]


def test_bfloat16_sums_accumulate_in_float32():
    b = GraphBuilder("b_sum")
    g = b.build([b.reduce_sum(b.input("x", (1, 4096), BF16), axes=[1])])
    x = np.full((1, 4096), 1.0, ml_dtypes.bfloat16)
    (y,) = run_reference(g, [x])
    # a bfloat16 running sum would stall at 256 (256 + 1 rounds back to 256)
    assert y.dtype == np.dtype(ml_dtypes.bfloat16) and float(y[0]) == 4096.0


@pytest.mark.parametrize("name", list(graphs()))
def test_bfloat16_groups_compute_the_reference(name):
    for group in groups_of(graphs()[name]):
        for config in samples(group, 2):
            check_group(group, config, tol=RTOL[BF16])


def test_bfloat16_memory_is_bits_and_registers_are_float():
    (group,) = groups_of(graphs()["b_softmax"])
    func = lowered(group)
    func.name = "b_softmax"
    text = generate_cuda([func], CUDA)
    assert "const kiln_bf16* __restrict__ in0, kiln_bf16* __restrict__ divide" in text
    assert "kiln_b2f((kiln_bf16)(v.x >> 16))" in text and "kiln_pack16(kiln_f2b(" in text
    assert "kiln_half" not in text
    assert "__bf16" not in text and "cuda_bf16.h" not in text


def _host_bf16_rounding(tmp_path: Path) -> ctypes.CDLL:
    """The prelude's kiln_f2b / kiln_b2f built for the host with gcc (CUDA's bit casts as memcpy)."""
    shim = (
        "#include <string.h>\n#define __device__\n#define __forceinline__ static inline\n"
        "static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }\n"
        "static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }\n"
    )
    main = (
        "void round_all(const float* x, unsigned short* bits, float* back, int n) {\n"
        "  for (int i = 0; i < n; ++i) { bits[i] = kiln_f2b(x[i]); back[i] = kiln_b(x[i]); }\n}\n"
    )
    src, lib = tmp_path / "bf16.c", tmp_path / "bf16.so"
    src.write_text(shim + _BF16 + main)
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return ctypes.CDLL(str(lib))


def test_the_printed_bfloat16_rounding_is_round_to_nearest_even(tmp_path):
    rng = np.random.default_rng(0)
    ties = (np.arange(1, 4096, dtype=np.uint32) << 16 | 0x8000).view(np.float32)  # exact halfway cases
    x = np.concatenate(
        [
            rng.standard_normal(4096).astype(np.float32) * np.float32(1e3),
            rng.integers(0, 2**32, 8192, dtype=np.uint64).astype(np.uint32).view(np.float32),
            ties,
            -ties,
            np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3.4e38, -3.4e38, 1e-40, -1e-45], np.float32),
        ]
    ).astype(np.float32)
    bits, back = np.zeros(x.size, np.uint16), np.zeros(x.size, np.float32)
    lib = _host_bf16_rounding(tmp_path)
    ptr = np.ctypeslib.as_ctypes
    lib.round_all(ptr(x), ptr(bits), ptr(back), ctypes.c_int(x.size))
    with np.errstate(invalid="ignore"):  # the NaN input
        want = x.astype(ml_dtypes.bfloat16)
    nan = np.isnan(x)
    assert np.array_equal(bits[~nan], want[~nan].view(np.uint16))
    assert np.isnan(bits[nan].view(ml_dtypes.bfloat16).astype(np.float32)).all()
    assert np.array_equal(back[~nan], want[~nan].astype(np.float32))


def test_the_cpu_target_refuses_bfloat16_naming_the_op():
    b = GraphBuilder("b_cpu")
    g = b.build([b.relu(b.input("x", (4, 8), BF16))])
    with pytest.raises(KilnError, match=r"node relu \(relu\).*'x'.*cpu target does not support bfloat16"):
        kiln_compile(g, "cpu")


def test_a_bfloat16_onnx_model_imports_and_compiles_for_cuda():
    onnx = pytest.importorskip("onnx", reason="the ONNX import test needs the onnx package (extra 'onnx')")
    from onnx import TensorProto, helper, numpy_helper

    from compiler.frontend.onnx import load_onnx

    w = numpy_helper.from_array(bf16(np.linspace(-1, 1, 32 * 16)).reshape(32, 16), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Softmax", ["h"], ["s"], axis=-1),
        helper.make_node("Cast", ["s"], ["y"], to=TensorProto.FLOAT16),
    ]
    graph = helper.make_graph(
        nodes,
        "bf16",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [4, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [4, 16])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model)
    g = load_onnx(model)
    assert g.inputs[0].dtype == BF16 and g.outputs[0].dtype == "float16"
    for group in groups_of(g):
        check_group(group, tol=RTOL[BF16])
    compiled = kiln_compile(g, "cuda")
    assert "kiln_bf16" in compiled.source and "kiln_half" in compiled.source


@cache
def nvcc_resources(arch: str) -> dict:
    funcs = []
    for name, graph in graphs().items():
        for k, group in enumerate(groups_of(graph)):
            func = lowered(group)
            func.name = f"{name}_{k}"
            funcs.append(func)
    return nvcc_check(generate_cuda(funcs, CUDA), arch)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_bfloat16_kernels_compile_with_nvcc(arch):
    need_nvcc()
    res = nvcc_resources(arch)
    assert {n.rsplit("_", 1)[0] for n in res} == set(graphs())
    assert all(r.spill_stores == 0 for r in res.values())
