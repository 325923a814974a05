"""Small nets written as exporters emit them, imported, compiled for the CPU and compared end to end with
onnxruntime (numpy reference, optimized graph and compiled model); the ones that mirror built-in zoo
models must give the zoo's canonical graph after optimize."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.frontend.models import get_model
from compiler.passes import optimize
from tests.compiler.frontend import onnx_nets as L
from tests.compiler.frontend.onnx_util import NEWEST, Net, check_model


def ops_of(graph) -> set[str]:
    return {n.op for n in graph.nodes}


def test_mlp():
    g = check_model(L.NETS["mlp"][0](), compiled=True)
    assert ops_of(g) == {"linear", "relu"}


def test_conv_bn_relu_pool():
    g = check_model(L.NETS["conv_bn_relu_pool"][0](), compiled=True)
    assert {"conv2d", "batch_norm", "max_pool2d", "global_avg_pool2d", "linear"} <= ops_of(g)


def test_resnet_basic_block():
    check_model(L.NETS["resnet_block"][0](), compiled=True)


def test_transformer_encoder_layer():
    g = check_model(L.NETS["encoder_layer"][0](), compiled=True)
    assert ops_of(g) >= {"layer_norm", "gelu", "linear", "batch_matmul", "softmax"}
    assert not ops_of(g) & {"erf", "sqrt", "reduce_mean"}


def test_attention():
    g = check_model(L.attention_model(12, 32, 4), compiled=True)
    assert ops_of(g) >= {"linear", "batch_matmul", "softmax"}


@pytest.mark.parametrize(
    "fused_ln,mask,opset",
    [(False, "where", 14), (False, "bias_slice", 13), (True, "where", 17), (True, "add", NEWEST)],
)
def test_gpt_block_causal(fused_ln, mask, opset):
    g = check_model(L.gpt_model(2, 12, 32, 4, fused_ln, mask, opset), compiled=True)
    assert ops_of(g) >= {"layer_norm", "gelu", "softmax", "batch_matmul"}
    assert "tanh" not in ops_of(g)


@pytest.mark.parametrize("style", ["reciprocal", "div", "mul"])
def test_rmsnorm_swiglu(style):
    g = check_model(L.swiglu_model(2, 6, 32, 64, rms_style=style), compiled=True)
    assert ops_of(g) >= {"rms_norm", "silu", "linear"} and "sigmoid" not in ops_of(g)


def test_dynamic_batch_and_sequence_with_input_shapes():
    net = Net(8)
    y = L.attention(net, "x", 10, 16, 2)
    model = net.model([("x", ["batch", "seq", 16])], [y])
    g = check_model(model, input_shapes={"x": (3, 10, 16)}, compiled=True)
    assert g.inputs[0].shape == (3, 10, 16)


def test_compiled_nets_are_cached():
    """Each distinct net compiles once per session: the same graph gets the same compiled model."""
    from compiler.frontend.onnx import load_onnx
    from tests.compiler.frontend.onnx_util import compiled_model

    a, b = (load_onnx(L.NETS["mlp"][0]()) for _ in range(2))
    assert compiled_model(a) is compiled_model(b)


def test_graph_is_named_after_the_file(tmp_path):
    """Exporters' graph names are generic (torch: 'main_graph'); a file's graph is named by its stem,
    which is the model name kiln tune records the tasks under."""
    from compiler.frontend.onnx import load_onnx
    from tests.compiler.frontend.onnx_util import onnx

    model = L.NETS["mlp"][0]()
    model.graph.name = "main_graph"
    onnx.save(model, tmp_path / "my-mlp.v2.onnx")
    assert load_onnx(str(tmp_path / "my-mlp.v2.onnx")).name == "my_mlp.v2"
    assert load_onnx(tmp_path / "my-mlp.v2.onnx").name == "my_mlp.v2"
    assert load_onnx(model).name == "main_graph"


# ------------------------------------------------- the same canonical graph as the zoo
ZOO_EQUIVALENTS = {
    "mlp": lambda: L.mlp_model(256, 784, 128, 10),
    "convnet": lambda: L.convnet_model(8, 32),
    "resblock": lambda: L.resblock_model(64, 56),
    "attention": lambda: L.attention_model(128, 768, 12),
    "encoder_layer": lambda: L.encoder_model(128, 768, 12, 3072),
}


@pytest.mark.parametrize("name", sorted(ZOO_EQUIVALENTS))
def test_zoo_equivalent_has_zoo_workloads(name):
    """An exported version of a zoo model optimizes to exactly the zoo model's canonical graph (hence the
    same workload keys and tuning records), except where exporters fold ops (none of these)."""
    from compiler.frontend.onnx import load_onnx

    imported = optimize(load_onnx(ZOO_EQUIVALENTS[name]()))
    zoo = optimize(get_model(name))
    assert imported.structural_hash() == zoo.structural_hash(), (
        f"{name}: imported {imported.op_histogram()} vs zoo {zoo.op_histogram()}"
    )
    np.testing.assert_equal(len(imported.params), len(zoo.params))
