"""Layers written the way exporters (torch.onnx at opset 13..17) emit them, for the net and pattern
tests: shape arithmetic for head splits, decomposed LayerNorm/RMSNorm/GELU, MatMul + Add linears; and
the whole nets built from them (``NETS``: a small size for the tests, a larger one for
``scripts/bench_onnx.py``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from tests.compiler.frontend.onnx_util import Net

I64 = np.int64


def linear(net: Net, x: str, din: int, dout: int, bias: bool = True, gemm: bool = False) -> str:
    """torch.nn.Linear: Gemm(transB=1) on 2-D inputs, MatMul with the transposed weight + Add otherwise."""
    if gemm:
        inputs = [x, net.weight(dout, din, scale=1 / math.sqrt(din))]
        if bias:
            inputs.append(net.weight(dout, scale=0.1))
        return net.op("Gemm", *inputs, transB=1)
    y = net.op("MatMul", x, net.weight(din, dout, scale=1 / math.sqrt(din)))
    return net.op("Add", y, net.weight(dout, scale=0.1)) if bias else y


def layer_norm(net: Net, x: str, d: int, eps: float = 1e-5, square: str = "pow", fused: bool = False) -> str:
    """LayerNorm over the last axis: the LayerNormalization op (opset 17+) or the opset-13 decomposition."""
    gamma, beta = net.weight(d, scale=0.1, center=1.0), net.weight(d, scale=0.1)
    if fused:
        return net.op("LayerNormalization", x, gamma, beta, axis=-1, epsilon=eps)
    axes = {"axes": [-1]}
    mean = net.op("ReduceMean", x, **axes)
    dev = net.op("Sub", x, mean)
    sq = net.op("Pow", dev, net.const(np.float32(2.0))) if square == "pow" else net.op("Mul", dev, dev)
    var = net.op("ReduceMean", sq, **axes)
    std = net.op("Sqrt", net.op("Add", var, net.const(np.float32(eps))))
    if square == "pow":
        normed = net.op("Div", dev, std)
    else:
        normed = net.op("Mul", dev, net.op("Reciprocal", std))
    return net.op("Add", net.op("Mul", normed, gamma), beta)


def rms_norm(net: Net, x: str, d: int, eps: float = 1e-6, style: str = "reciprocal") -> str:
    """LLaMA-style RMSNorm: x * rsqrt(mean(x^2) + eps) * weight, in the exported spellings."""
    weight = net.weight(d, scale=0.1, center=1.0)
    sq = net.op("Pow", x, net.const(np.float32(2.0))) if style != "mul" else net.op("Mul", x, x)
    ms = net.op("ReduceMean", sq, axes=[-1])
    root = net.op("Sqrt", net.op("Add", ms, net.const(np.float32(eps))))
    if style == "div":
        normed = net.op("Div", x, root)
    else:
        normed = net.op("Mul", x, net.op("Reciprocal", root))
    return net.op("Mul", weight, normed)


def gelu_erf(net: Net, x: str, variant: int = 0) -> str:
    """The erf GELU as torch exports it (variant 0) and two other spellings."""
    half, one = net.const(np.float32(0.5)), net.const(np.float32(1.0))
    if variant == 0:  # x * 0.5 * (1 + erf(x / sqrt2)) with torch's association
        e = net.op("Erf", net.op("Div", x, net.const(np.float32(math.sqrt(2)))))
        return net.op("Mul", net.op("Mul", x, net.op("Add", e, one)), half)
    if variant == 1:  # 0.5 * x * (1 + erf(x * (1/sqrt2)))
        e = net.op("Erf", net.op("Mul", x, net.const(np.float32(1 / math.sqrt(2)))))
        return net.op("Mul", net.op("Mul", half, x), net.op("Add", one, e))
    e = net.op("Erf", net.op("Div", x, net.const(np.float32(math.sqrt(2)))))  # x * (1 + erf) / 2
    return net.op("Div", net.op("Mul", x, net.op("Add", e, one)), net.const(np.float32(2.0)))


def gelu_tanh(net: Net, x: str) -> str:
    """HF 'gelu_new': 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))."""
    cube = net.op("Pow", x, net.const(np.float32(3.0)))
    inner = net.op("Add", x, net.op("Mul", net.const(np.float32(0.044715)), cube))
    t = net.op("Tanh", net.op("Mul", net.const(np.float32(math.sqrt(2 / math.pi))), inner))
    return net.op(
        "Mul", net.op("Mul", net.const(np.float32(0.5)), x), net.op("Add", net.const(np.float32(1.0)), t)
    )


def _dims(net: Net, x: str, heads: int, hd: int) -> str:
    """The [B, S, heads, hd] shape computed from Shape(x), as torch exports view() on dynamic axes."""
    shape = net.op("Shape", x)
    b = net.op(
        "Unsqueeze",
        net.op("Gather", shape, net.const(np.array(0, I64)), axis=0),
        net.const(np.array([0], I64)),
    )
    s = net.op(
        "Unsqueeze",
        net.op("Gather", shape, net.const(np.array(1, I64)), axis=0),
        net.const(np.array([0], I64)),
    )
    return net.op("Concat", b, s, net.const(np.array([heads], I64)), net.const(np.array([hd], I64)), axis=0)


def attention(
    net: Net,
    x: str,
    seq: int,
    d: int,
    heads: int,
    causal: str | None = None,
    scale_style: str = "div",
) -> str:
    """Multi-head self-attention as torch exports it: MatMul+Add projections, Reshape by computed shapes,
    Transpose, MatMul q k^T, scaling, optional causal mask (``causal`` = 'where' (Trilu mask + Where),
    'add' (an additive -inf mask) or 'bias_slice' (a GPT-2 style buffer sliced by shapes)), Softmax."""
    hd = d // heads
    q, k, v = (linear(net, x, d, d) for _ in range(3))
    qh = net.op("Transpose", net.op("Reshape", q, _dims(net, q, heads, hd)), perm=[0, 2, 1, 3])
    kt = net.op("Transpose", net.op("Reshape", k, _dims(net, k, heads, hd)), perm=[0, 2, 3, 1])
    vh = net.op("Transpose", net.op("Reshape", v, _dims(net, v, heads, hd)), perm=[0, 2, 1, 3])
    if scale_style == "split":  # torch's scaled_dot_product_attention: sqrt(scale) on q and on k^T
        s = net.const(np.float32(math.sqrt(1 / math.sqrt(hd))))
        scores = net.op("MatMul", net.op("Mul", qh, s), net.op("Mul", kt, s))
    else:
        scores = net.op("MatMul", qh, kt)
        if scale_style == "div":
            scores = net.op("Div", scores, net.const(np.float32(math.sqrt(hd))))
        else:
            scores = net.op("Mul", scores, net.const(np.float32(1 / math.sqrt(hd))))
    if causal == "where":
        ones = net.op("ConstantOfShape", net.const(np.array([seq, seq], I64)), value=_tensor(1.0))
        keep = net.op("Cast", net.op("Trilu", ones, upper=0), to=9)  # bool
        scores = net.op("Where", keep, scores, net.const(np.float32(-np.inf)))
    elif causal == "add":
        mask = np.triu(np.full((seq, seq), -np.inf, np.float32), 1)
        scores = net.op("Add", scores, net.const(mask))
    elif causal == "bias_slice":
        buf = net.const(np.tril(np.ones((1, 1, 2 * seq, 2 * seq), bool)))
        n = net.op("Gather", net.op("Shape", scores), net.const(np.array(2, I64)), axis=0)
        n1 = net.op("Unsqueeze", n, net.const(np.array([0], I64)))
        zero = net.const(np.array([0], I64))
        rows = net.op("Slice", buf, zero, n1, net.const(np.array([2], I64)))
        mask = net.op("Slice", rows, zero, n1, net.const(np.array([3], I64)))
        scores = net.op("Where", mask, scores, net.const(np.float32(np.finfo(np.float32).min)))
    probs = net.op("Softmax", scores, axis=-1)
    ctx = net.op("Transpose", net.op("MatMul", probs, vh), perm=[0, 2, 1, 3])
    shape = net.op(
        "Concat",
        net.op("Slice", net.op("Shape", ctx), net.const(np.array([0], I64)), net.const(np.array([2], I64))),
        net.const(np.array([d], I64)),
        axis=0,
    )
    return linear(net, net.op("Reshape", ctx, shape), d, d)


def _tensor(value: float):
    from onnx import TensorProto, helper

    return helper.make_tensor("value", TensorProto.FLOAT, [1], [value])


def encoder_layer(net: Net, x: str, seq: int, d: int, heads: int, ff: int, eps: float = 1e-12) -> str:
    """BERT-style post-LN encoder layer (as the zoo's encoder_layer)."""
    h = layer_norm(net, net.op("Add", x, attention(net, x, seq, d, heads)), d, eps)
    inner = gelu_erf(net, linear(net, h, d, ff))
    return layer_norm(net, net.op("Add", h, linear(net, inner, ff, d)), d, eps)


def gpt_block(net: Net, x: str, seq: int, d: int, heads: int, fused_ln: bool, mask: str) -> str:
    """GPT-2 style pre-LN block with causal attention and tanh GELU."""
    h = net.op("Add", x, attention(net, layer_norm(net, x, d, fused=fused_ln), seq, d, heads, causal=mask))
    inner = gelu_tanh(net, linear(net, layer_norm(net, h, d, fused=fused_ln), d, 4 * d))
    return net.op("Add", h, linear(net, inner, 4 * d, d))


def swiglu_block(net: Net, x: str, d: int, ff: int, rms_style: str = "reciprocal") -> str:
    """RMSNorm then a LLaMA SwiGLU MLP (silu(x W1) * (x W3)) W2, with SiLU as x * sigmoid(x)."""
    h = rms_norm(net, x, d, style=rms_style)
    gate = linear(net, h, d, ff, bias=False)
    up = linear(net, h, d, ff, bias=False)
    act = net.op("Mul", gate, net.op("Sigmoid", gate))
    return net.op("Add", x, linear(net, net.op("Mul", act, up), ff, d, bias=False))


def conv_bn(
    net: Net, x: str, cin: int, cout: int, k: int, pad: int, stride: int = 1, bias: bool = False
) -> str:
    inputs = [x, net.weight(cout, cin, k, k, scale=1 / math.sqrt(cin * k * k))]
    if bias:
        inputs.append(net.weight(cout, scale=0.1))
    y = net.op("Conv", *inputs, pads=[pad] * 4, strides=[stride, stride], kernel_shape=[k, k])
    stats = [
        net.weight(cout, scale=0.1, center=1.0),
        net.weight(cout, scale=0.1),
        net.weight(cout, scale=0.1),
        net.const(net.rng.uniform(0.5, 1.5, cout).astype(np.float32)),
    ]
    return net.op("BatchNormalization", y, *stats, epsilon=1e-5)


def resnet_block(net: Net, x: str, c: int) -> str:
    h = net.op("Relu", conv_bn(net, x, c, c, 3, 1))
    h = conv_bn(net, h, c, c, 3, 1)
    return net.op("Relu", net.op("Add", h, x))


# ------------------------------------------------------------------------------ whole test models
def mlp_model(batch: int, din: int, hidden: int, dout: int) -> Any:
    """Linear-ReLU-Linear as Gemm nodes (torch.onnx's spelling of nn.Linear on 2-D inputs)."""
    net = Net(1)
    h = net.op("Relu", linear(net, "x", din, hidden, gemm=True))
    return net.model([("x", [batch, din])], [linear(net, h, hidden, dout, gemm=True)])


def convnet_model(batch: int, hw: int) -> Any:
    """Conv-BN-ReLU-MaxPool, Conv-ReLU, GlobalAveragePool, Flatten, Gemm."""
    net = Net(2)
    h = net.op("Relu", conv_bn(net, "x", 3, 16, 3, 1))
    h = net.op("MaxPool", h, kernel_shape=[2, 2], strides=[2, 2])
    h = net.op("Relu", net.op("Conv", h, net.weight(32, 16, 3, 3, scale=1 / 12), pads=[1, 1, 1, 1]))
    h = net.op("Flatten", net.op("GlobalAveragePool", h), axis=1)
    return net.model([("x", [batch, 3, hw, hw])], [linear(net, h, 32, 10, gemm=True)])


def resblock_model(c: int, hw: int) -> Any:
    net = Net(3)
    return net.model([("x", [1, c, hw, hw])], [resnet_block(net, "x", c)])


def encoder_model(seq: int, d: int, heads: int, ff: int) -> Any:
    net = Net(4)
    return net.model([("x", [1, seq, d])], [encoder_layer(net, "x", seq, d, heads, ff)])


def attention_model(seq: int, d: int, heads: int) -> Any:
    net = Net(5)
    return net.model([("x", [1, seq, d])], [attention(net, "x", seq, d, heads, scale_style="mul")])


def gpt_model(
    batch: int, seq: int, d: int, heads: int, fused_ln: bool = True, mask: str = "where", opset: int = 17
) -> Any:
    net = Net(6)
    y = gpt_block(net, "x", seq, d, heads, fused_ln, mask)
    return net.model([("x", [batch, seq, d])], [y], opset=opset)


def swiglu_model(batch: int, seq: int, d: int, ff: int, rms_style: str = "reciprocal") -> Any:
    net = Net(7)
    return net.model([("x", [batch, seq, d])], [swiglu_block(net, "x", d, ff, rms_style=rms_style)])


# name -> (the small model the tests compile, the larger one scripts/bench_onnx.py times)
NETS: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
    "mlp": (lambda: mlp_model(8, 32, 16, 10), lambda: mlp_model(256, 784, 128, 10)),
    "conv_bn_relu_pool": (lambda: convnet_model(2, 16), lambda: convnet_model(8, 32)),
    "resnet_block": (lambda: resblock_model(8, 10), lambda: resblock_model(64, 56)),
    "encoder_layer": (lambda: encoder_model(16, 32, 4, 64), lambda: encoder_model(128, 256, 4, 1024)),
    "gpt_block": (lambda: gpt_model(2, 12, 32, 4), lambda: gpt_model(1, 128, 256, 4)),
    "rmsnorm_swiglu": (lambda: swiglu_model(2, 6, 32, 64), lambda: swiglu_model(1, 128, 512, 1536)),
}
