"""Exported patterns are recognized: after ``optimize`` the imported graph has the same structural hash as
the same computation built with GraphBuilder composites (so it fuses and tunes like the built-in one), and
it still matches onnxruntime."""

from __future__ import annotations

import math

import numpy as np
import pytest

from compiler.builder import GraphBuilder
from compiler.frontend.onnx import load_onnx
from compiler.passes import optimize
from tests.compiler.frontend import onnx_nets as L
from tests.compiler.frontend.onnx_util import Net, check_model

SHAPE = (2, 5, 16)


def same_after_optimize(model, built) -> None:
    imported = optimize(load_onnx(model))
    expected = optimize(built)
    assert imported.structural_hash() == expected.structural_hash(), (
        f"\n{imported}\n--- expected ---\n{expected}"
    )


def builder(fn) -> object:
    b = GraphBuilder("expected")
    x = b.input("x", SHAPE)
    return b.build([fn(b, x)])


_rng = np.random.default_rng(0)


def p(b: GraphBuilder, *shape: int, dtype=np.float32) -> object:
    """A param with distinct contents (CSE merges params with equal contents; weights never are)."""
    return b.param(
        "p", _rng.standard_normal(shape).astype(dtype) if dtype is not bool else _rng.random(shape) < 0.5
    )


@pytest.mark.parametrize("variant", [0, 1, 2])
def test_erf_gelu(variant):
    net = Net(0)
    model = net.model([("x", SHAPE)], [L.gelu_erf(net, "x", variant)])
    g = check_model(model)
    assert [n.op for n in g.nodes] == ["gelu"]
    same_after_optimize(model, builder(lambda b, x: b.gelu(x)))


def test_tanh_gelu():
    net = Net(0)
    model = net.model([("x", SHAPE)], [L.gelu_tanh(net, "x")])
    g = check_model(model)
    assert [n.op for n in g.nodes] == ["gelu"]
    same_after_optimize(model, builder(lambda b, x: b.gelu(x, approximate="tanh")))


@pytest.mark.parametrize("square", ["pow", "mul"])
@pytest.mark.parametrize("eps", [1e-5, 1e-12])
def test_decomposed_layer_norm(square, eps):
    net = Net(0)
    model = net.model([("x", SHAPE)], [L.layer_norm(net, "x", SHAPE[-1], eps, square=square)])
    g = check_model(model)
    assert [n.op for n in g.nodes] == ["layer_norm"] and g.nodes[0].attrs["eps"] == eps
    d = SHAPE[-1]
    same_after_optimize(model, builder(lambda b, x: b.layer_norm(x, p(b, d), p(b, d), eps=eps)))


def test_layer_norm_without_affine():
    net = Net(0)
    x = "x"
    mean = net.op("ReduceMean", x, axes=[-1])
    dev = net.op("Sub", x, mean)
    var = net.op("ReduceMean", net.op("Mul", dev, dev), axes=[-1])
    y = net.op("Div", dev, net.op("Sqrt", net.op("Add", var, net.const(np.float32(1e-5)))))
    model = net.model([("x", SHAPE)], [y])
    g = check_model(model)
    assert [n.op for n in g.nodes] == ["layer_norm"]


@pytest.mark.parametrize("style", ["reciprocal", "div", "mul"])
def test_decomposed_rms_norm(style):
    net = Net(0)
    model = net.model([("x", SHAPE)], [L.rms_norm(net, "x", SHAPE[-1], 1e-6, style=style)])
    g = check_model(model)
    assert [n.op for n in g.nodes] == ["rms_norm"]
    same_after_optimize(model, builder(lambda b, x: b.rms_norm(x, p(b, SHAPE[-1]), eps=1e-6)))


def test_silu():
    net = Net(0)
    model = net.model([("x", SHAPE)], [net.op("Mul", "x", net.op("Sigmoid", "x"))])
    assert [n.op for n in check_model(model).nodes] == ["silu"]
    same_after_optimize(model, builder(lambda b, x: b.silu(x)))


def test_matmul_add_is_linear_with_bias():
    net = Net(0)
    model = net.model([("x", SHAPE)], [L.linear(net, "x", SHAPE[-1], 24)])
    assert [n.op for n in check_model(model).nodes] == ["linear"]
    same_after_optimize(model, builder(lambda b, x: b.linear(x, p(b, 24, SHAPE[-1]), p(b, 24))))


B, H, T, D = 2, 3, 6, 16


def sdpa_onnx(mask: str, scale: str) -> object:
    """q, k, v inputs [B, H, T, D]: MatMul(q, k^T), scale, causal mask, Softmax, MatMul(v)."""
    net = Net(1)
    kt = net.op("Transpose", "k", perm=[0, 1, 3, 2])
    if scale == "split":
        s = net.const(np.float32(math.sqrt(1 / math.sqrt(D))))
        scores = net.op("MatMul", net.op("Mul", "q", s), net.op("Mul", kt, s))
    elif scale == "div":
        scores = net.op("Div", net.op("MatMul", "q", kt), net.const(np.float32(math.sqrt(D))))
    else:
        scores = net.op("Mul", net.op("MatMul", "q", kt), net.const(np.float32(1 / math.sqrt(D))))
    if mask == "where_trilu":
        ones = net.op("ConstantOfShape", net.const(np.array([T, T], np.int64)), value=L._tensor(1.0))
        keep = net.op("Cast", net.op("Trilu", ones, upper=0), to=9)
        scores = net.op("Where", keep, scores, net.const(np.float32(-np.inf)))
    elif mask == "where_masked_fill":  # masked_fill(mask == 0, -inf)
        drop = net.op("Equal", net.const(np.tril(np.ones((T, T), np.float32))), net.const(np.float32(0)))
        scores = net.op("Where", drop, net.const(np.float32(-np.inf)), scores)
    else:
        scores = net.op("Add", scores, net.const(np.triu(np.full((T, T), -np.inf, np.float32), 1)))
    y = net.op("MatMul", net.op("Softmax", scores, axis=-1), "v")
    return net.model([(n, (B, H, T, D)) for n in "qkv"], [y], opset=14)


def sdpa_builder(mask: str) -> object:
    b = GraphBuilder("sdpa")
    q, k, v = (b.input(n, (B, H, T, D)) for n in "qkv")
    s = b.multiply(b.batch_matmul(q, k, transpose_b=True), 1 / math.sqrt(D))
    if mask == "where_trilu":
        s = b.where(p(b, T, T, dtype=bool), s, -np.inf)
    elif mask == "where_masked_fill":
        s = b.where(p(b, T, T, dtype=bool), -np.inf, s)
    else:
        s = b.add(s, p(b, T, T))
    return b.build([b.batch_matmul(b.softmax(s, axis=-1), v)])


@pytest.mark.parametrize("mask", ["where_trilu", "where_masked_fill", "add"])
@pytest.mark.parametrize("scale", ["div", "mul", "split"])
def test_causal_attention(mask, scale):
    model = sdpa_onnx(mask, scale)
    g = check_model(model)
    assert [n.op for n in g.nodes if n.op != "constant"].count("transpose") == 0
    same_after_optimize(model, sdpa_builder(mask))


def test_patterns_can_be_turned_off():
    net = Net(0)
    model = net.model([("x", SHAPE)], [L.gelu_erf(net, "x")])
    g = check_model(model, patterns=False)
    assert "gelu" not in {n.op for n in g.nodes} and "erf" in {n.op for n in g.nodes}


def test_shared_intermediate_blocks_the_pattern():
    """A GELU whose erf is also a graph output must not be collapsed (the erf would be lost)."""
    net = Net(0)
    e = net.op("Erf", net.op("Div", "x", net.const(np.float32(math.sqrt(2)))))
    y = net.op(
        "Mul", net.op("Mul", "x", net.op("Add", e, net.const(np.float32(1)))), net.const(np.float32(0.5))
    )
    g = check_model(net.model([("x", SHAPE)], [y, e]))
    assert "gelu" not in {n.op for n in g.nodes}
