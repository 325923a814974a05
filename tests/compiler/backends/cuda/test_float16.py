"""float16 on the cuda target: binary16 in memory, floats in registers, every float16 operation rounded
to binary16 (the IR's semantics, which the SIMT interpreter runs with numpy float16). Every sketch's
default and sampled configs of float16 groups compute the reference within float16's tolerance; an fp16
ONNX model imports and compiles; the kernels compile with nvcc for sm_80 and sm_90."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from compiler.backends.cuda.codegen import generate_cuda
from compiler.backends.cuda.nvrtc import nvcc_check
from compiler.builder import GraphBuilder
from tests.compiler.backends.cuda.util import CUDA, check_group, groups_of, lowered, need_nvcc, samples
from tuner.measure.check import RTOL

F16 = "float16"


def graphs() -> dict:
    out = {}
    b = GraphBuilder("h_softmax")
    out[b.name] = b.build([b.softmax(b.input("x", (5, 96), F16), axis=-1)])
    b = GraphBuilder("h_layer_norm")
    x = b.input("x", (3, 64), F16)
    g = b.param("g", np.linspace(0.5, 1.5, 64).astype(np.float16))
    out[b.name] = b.build([b.layer_norm(x, g, b.param("bb", np.linspace(-1, 1, 64).astype(np.float16)))])
    b = GraphBuilder("h_bias_gelu")
    x = b.input("x", (7, 48), F16)
    out[b.name] = b.build([b.gelu(b.add(x, b.param("bias", np.linspace(-1, 1, 48).astype(np.float16))))])
    b = GraphBuilder("h_matmul")
    y = b.matmul(b.input("a", (40, 24), F16), b.input("w", (24, 36), F16))
    out[b.name] = b.build([b.relu(b.add(y, b.param("bias", np.linspace(-1, 1, 36).astype(np.float16))))])
    return out


@pytest.mark.parametrize("name", list(graphs()))
def test_float16_groups_compute_the_reference(name):
    for group in groups_of(graphs()[name]):
        for config in samples(group, 3):
            check_group(group, config, tol=RTOL[F16])


def test_float16_memory_is_binary16_and_registers_are_float():
    (group,) = groups_of(graphs()["h_softmax"])
    func = lowered(group)
    func.name = "h_softmax"
    text = generate_cuda([func], CUDA)
    assert "const kiln_half* __restrict__ in0, kiln_half* __restrict__ divide" in text
    # rows of 96 halves: 8-byte row loads (uint2: 4 halves), lanes widened from the words' halves
    assert "const uint2 v = *reinterpret_cast<const uint2*>(&in0[" in text
    assert "kiln_h2f((kiln_half)(v.x >> 16))" in text and "make_uint2(kiln_pack16(kiln_f2h(" in text
    assert "_Float16" not in text and "cvt.rn.f16.f32" in text


def test_an_fp16_onnx_model_imports_and_compiles_for_cuda():
    onnx = pytest.importorskip("onnx", reason="the ONNX import test needs the onnx package (extra 'onnx')")
    from onnx import TensorProto, helper, numpy_helper

    from compiler.build import compile as kiln_compile
    from compiler.frontend.onnx import load_onnx

    w = numpy_helper.from_array(np.linspace(-1, 1, 32 * 16).astype(np.float16).reshape(32, 16), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Softmax", ["h"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "fp16",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [4, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [4, 16])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model)
    g = load_onnx(model)
    assert g.inputs[0].dtype == F16 and g.outputs[0].dtype == F16
    for group in groups_of(g):
        check_group(group, tol=RTOL[F16])
    compiled = kiln_compile(g, "cuda")
    assert "kiln_half" in compiled.source


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
def test_float16_kernels_compile_with_nvcc(arch):
    need_nvcc()
    res = nvcc_resources(arch)
    assert {n.rsplit("_", 1)[0] for n in res} == set(graphs())
    assert all(r.spill_stores == 0 for r in res.values())
