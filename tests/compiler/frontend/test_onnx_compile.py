"""Imported ONNX models through the whole compiler: the smallest models that showed the compiler bugs the
ONNX tests found (operands that are one tensor or slices of one tensor, reductions over outer axes), and a
compiled model's save/load round trip."""

from __future__ import annotations

import numpy as np

from tests.compiler.frontend import onnx_nets as L
from tests.compiler.frontend.onnx_util import (
    F32,
    assert_close,
    check_model,
    compiled_model,
    helper,
    init,
    make_model,
    ort_outputs,
    random_feeds,
    single_op,
    tinfo,
)


def test_batch_matmul_of_two_slices_of_one_tensor():
    """q and k split from one fused projection (what torch exports for a qkv Linear + chunk/split)."""
    m = make_model(
        [
            helper.make_node("Split", ["x", "sizes"], ["q", "k"], axis=2),
            helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
            helper.make_node("MatMul", ["q", "kt"], ["y"]),
        ],
        [tinfo("x", [2, 6, 16])],
        [tinfo("y", [2, 6, 6])],
        [init("sizes", np.array([8, 8], np.int64))],
    )
    check_model(m, compiled=True)


def test_batch_matmul_of_a_tensor_with_itself():
    check_model(single_op("MatMul", [("x", [2, 6, 6], F32)], extra_inputs=["x"]), compiled=True)


def test_reduce_sum_over_the_outer_axis():
    m = single_op(
        "ReduceSum",
        [("x", [4, 5], F32)],
        extra_inputs=["axes"],
        initializers=[init("axes", np.array([0], np.int64))],
        keepdims=0,
    )
    check_model(m, compiled=True)


def test_softmax_over_a_middle_axis():
    check_model(single_op("Softmax", [("x", [2, 5, 7], F32)], axis=1), compiled=True)


def test_compiled_onnx_model_saves_and_loads(tmp_path):
    from compiler.runtime.executor import CompiledModel
    from tests.compiler.frontend.onnx_util import load_onnx

    model = L.NETS["gpt_block"][0]()
    feeds = random_feeds(model, seed=3)
    compiled = compiled_model(load_onnx(model))
    compiled.save(tmp_path / "gpt")
    loaded = CompiledModel.load(tmp_path / "gpt")
    assert loaded.input_names == ["x"]
    for got, want in zip(loaded.run(feeds), ort_outputs(model, feeds)):
        assert_close(got, want, "loaded gpt_block")
