"""Small nets written as exporters emit them, imported and compared end to end with onnxruntime; the
ones that mirror built-in zoo models must give the zoo's canonical graph after optimize."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.frontend.models import get_model
from compiler.passes import optimize
from tests.compiler.frontend import onnx_nets as L
from tests.compiler.frontend.onnx_util import NEWEST, Net, check_model


def ops_of(graph) -> set[str]:
    return {n.op for n in graph.nodes}


def mlp(batch: int, din: int, hidden: int, dout: int) -> object:
    net = Net(1)
    h = net.op("Relu", L.linear(net, "x", din, hidden, gemm=True))
    y = L.linear(net, h, hidden, dout, gemm=True)
    return net.model([("x", [batch, din])], [y])


def convnet(batch: int, hw: int) -> object:
    net = Net(2)
    h = net.op("Relu", L.conv_bn(net, "x", 3, 16, 3, 1))
    h = net.op("MaxPool", h, kernel_shape=[2, 2], strides=[2, 2])
    h = net.op("Relu", net.op("Conv", h, net.weight(32, 16, 3, 3, scale=1 / 12), pads=[1, 1, 1, 1]))
    h = net.op("Flatten", net.op("GlobalAveragePool", h), axis=1)
    y = L.linear(net, h, 32, 10, gemm=True)
    return net.model([("x", [batch, 3, hw, hw])], [y])


def resblock(c: int, hw: int) -> object:
    net = Net(3)
    return net.model([("x", [1, c, hw, hw])], [L.resnet_block(net, "x", c)])


def encoder(seq: int, d: int, heads: int, ff: int) -> object:
    net = Net(4)
    return net.model([("x", [1, seq, d])], [L.encoder_layer(net, "x", seq, d, heads, ff)])


def attention(seq: int, d: int, heads: int) -> object:
    net = Net(5)
    return net.model([("x", [1, seq, d])], [L.attention(net, "x", seq, d, heads, scale_style="mul")])


def test_mlp():
    g = check_model(mlp(8, 32, 16, 10))
    assert ops_of(g) == {"linear", "relu"}


def test_conv_bn_relu_pool():
    g = check_model(convnet(2, 16))
    assert {"conv2d", "batch_norm", "max_pool2d", "global_avg_pool2d", "linear"} <= ops_of(g)


def test_resnet_basic_block():
    check_model(resblock(8, 10))


def test_transformer_encoder_layer():
    g = check_model(encoder(16, 32, 4, 64))
    assert ops_of(g) >= {"layer_norm", "gelu", "linear", "batch_matmul", "softmax"}
    assert not ops_of(g) & {"erf", "sqrt", "reduce_mean"}


@pytest.mark.parametrize(
    "fused_ln,mask,opset",
    [(False, "where", 14), (False, "bias_slice", 13), (True, "where", 17), (True, "add", NEWEST)],
)
def test_gpt_block_causal(fused_ln, mask, opset):
    net = Net(6)
    y = L.gpt_block(net, "x", 12, 32, 4, fused_ln, mask)
    g = check_model(net.model([("x", [2, 12, 32])], [y], opset=opset))
    assert ops_of(g) >= {"layer_norm", "gelu", "softmax", "batch_matmul"}
    assert "tanh" not in ops_of(g)


@pytest.mark.parametrize("style", ["reciprocal", "div", "mul"])
def test_rmsnorm_swiglu(style):
    net = Net(7)
    y = L.swiglu_block(net, "x", 32, 64, rms_style=style)
    g = check_model(net.model([("x", [2, 6, 32])], [y]))
    assert ops_of(g) >= {"rms_norm", "silu", "linear"} and "sigmoid" not in ops_of(g)


def test_dynamic_batch_and_sequence_with_input_shapes():
    net = Net(8)
    y = L.attention(net, "x", 10, 16, 2)
    model = net.model([("x", ["batch", "seq", 16])], [y])
    g = check_model(model, input_shapes={"x": (3, 10, 16)})
    assert g.inputs[0].shape == (3, 10, 16)


# ------------------------------------------------- the same canonical graph as the zoo
ZOO_EQUIVALENTS = {
    "mlp": lambda: mlp(256, 784, 128, 10),
    "convnet": lambda: convnet(8, 32),
    "resblock": lambda: resblock(64, 56),
    "attention": lambda: attention(128, 768, 12),
    "encoder_layer": lambda: encoder(128, 768, 12, 3072),
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
