"""The built-in model zoo. Every model is deterministic: params come from a seeded generator and are
scaled (N(0, 1/fan_in)) so activations stay near unit size."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import numpy as np

from compiler.builder import GraphBuilder
from compiler.errors import ModelError
from compiler.graph import Graph, Value


@dataclass(frozen=True)
class ModelSpec:
    """A built-in model. ``build(**dims)`` takes the model's sizes as keywords (defaults: the sizes the
    description names), so tests can build the same structure small."""

    name: str
    description: str
    build: Callable[..., Graph]

    def graph(self) -> Graph:
        return _build_cached(self.name)


class _Init:
    """Seeded parameter initializers."""

    def __init__(self, b: GraphBuilder, seed: int) -> None:
        self.b = b
        self.rng = np.random.default_rng(seed)

    def weight(self, name: str, shape: tuple[int, ...], fan_in: int | None = None) -> Value:
        fan_in = fan_in or shape[-1]
        data = self.rng.standard_normal(shape) / math.sqrt(fan_in)
        return self.b.param(name, data.astype(np.float32))

    def near(self, name: str, shape: tuple[int, ...], center: float, spread: float) -> Value:
        data = center + spread * self.rng.standard_normal(shape)
        return self.b.param(name, data.astype(np.float32))

    def uniform(self, name: str, shape: tuple[int, ...], lo: float, hi: float) -> Value:
        return self.b.param(name, self.rng.uniform(lo, hi, shape).astype(np.float32))

    def linear(self, name: str, x: Value, out: int, bias: bool = True) -> Value:
        w = self.weight(f"{name}.weight", (out, x.shape[-1]))
        bvec = self.near(f"{name}.bias", (out,), 0.0, 0.1) if bias else None
        return self.b.linear(x, w, bvec, name=name)

    def batch_norm(self, name: str, x: Value) -> Value:
        c = x.shape[1]
        return self.b.batch_norm(
            x,
            self.near(f"{name}.weight", (c,), 1.0, 0.1),
            self.near(f"{name}.bias", (c,), 0.0, 0.1),
            self.near(f"{name}.running_mean", (c,), 0.0, 0.1),
            self.uniform(f"{name}.running_var", (c,), 0.5, 1.5),
            name=name,
        )

    def conv(self, name: str, x: Value, out: int, k: int, stride: int = 1, pad: int = 0) -> Value:
        w = self.weight(f"{name}.weight", (out, x.shape[1], k, k), fan_in=x.shape[1] * k * k)
        return self.b.conv2d(x, w, strides=(stride, stride), padding=(pad, pad), name=name)


def _softmax(shape: tuple[int, ...], name: str) -> Callable[..., Graph]:
    def build(rows: int = shape[0], cols: int = shape[1]) -> Graph:
        b = GraphBuilder(name)
        return b.build([b.softmax(b.input("x", (rows, cols)), axis=-1)])

    return build


def _rmsnorm(rows: int = 2048, d: int = 768) -> Graph:
    b = GraphBuilder("rmsnorm")
    init = _Init(b, 3)
    x = b.input("x", (1, rows, d))
    return b.build([b.rms_norm(x, init.near("weight", (d,), 1.0, 0.1), eps=1e-6)])


def _layernorm(rows: int = 4096, d: int = 768) -> Graph:
    b = GraphBuilder("layernorm")
    init = _Init(b, 4)
    x = b.input("x", (rows, d))
    g, beta = init.near("gamma", (d,), 1.0, 0.1), init.near("beta", (d,), 0.0, 0.1)
    return b.build([b.layer_norm(x, g, beta, eps=1e-5)])


def _bias_gelu(rows: int = 4096, d: int = 3072) -> Graph:
    b = GraphBuilder("bias_gelu")
    init = _Init(b, 5)
    x = b.input("x", (rows, d))
    return b.build([b.gelu(b.add(x, init.near("bias", (d,), 0.0, 0.1)))])


def _matmul(n: int = 1024) -> Graph:
    b = GraphBuilder("matmul")
    return b.build([b.matmul(b.input("a", (n, n)), b.input("b", (n, n)))])


def _mlp(batch: int = 256, d_in: int = 784, hidden: int = 128, out: int = 10) -> Graph:
    b = GraphBuilder("mlp")
    init = _Init(b, 7)
    x = b.input("x", (batch, d_in))
    h = b.relu(init.linear("fc1", x, hidden))
    return b.build([init.linear("fc2", h, out)])


def _attention_block(b: GraphBuilder, init: _Init, x: Value, heads: int, prefix: str) -> Value:
    batch, seq, d = x.shape
    hd = d // heads

    def split_heads(v: Value) -> Value:
        return b.transpose(b.reshape(v, (batch, seq, heads, hd)), (0, 2, 1, 3))

    q = split_heads(init.linear(f"{prefix}.query", x, d))
    k = split_heads(init.linear(f"{prefix}.key", x, d))
    v = split_heads(init.linear(f"{prefix}.value", x, d))
    scores = b.multiply(b.batch_matmul(q, k, transpose_b=True), 1.0 / math.sqrt(hd))
    ctx = b.batch_matmul(b.softmax(scores, axis=-1), v)
    ctx = b.reshape(b.transpose(ctx, (0, 2, 1, 3)), (batch, seq, d))
    return init.linear(f"{prefix}.output", ctx, d)


def _attention(seq: int = 128, d: int = 768, heads: int = 12) -> Graph:
    b = GraphBuilder("attention")
    init = _Init(b, 8)
    x = b.input("x", (1, seq, d))
    return b.build([_attention_block(b, init, x, heads, "attn")])


def _encoder_layer(seq: int = 128, d: int = 768, ff: int = 3072, heads: int = 12) -> Graph:
    b = GraphBuilder("encoder_layer")
    init = _Init(b, 9)
    x = b.input("x", (1, seq, d))

    def ln(name: str, v: Value) -> Value:
        return b.layer_norm(
            v,
            init.near(f"{name}.weight", (d,), 1.0, 0.1),
            init.near(f"{name}.bias", (d,), 0.0, 0.1),
            eps=1e-12,
            name=name,
        )

    h = ln("attn_norm", b.add(x, _attention_block(b, init, x, heads, "attn")))
    inner = b.gelu(init.linear("ffn.intermediate", h, ff))
    return b.build([ln("ffn_norm", b.add(h, init.linear("ffn.output", inner, d)))])


def _convnet(batch: int = 8, hw: int = 32, c1: int = 16, c2: int = 32) -> Graph:
    b = GraphBuilder("convnet")
    init = _Init(b, 10)
    x = b.input("x", (batch, 3, hw, hw))
    h = b.relu(init.batch_norm("bn1", init.conv("conv1", x, c1, 3, pad=1)))
    h = b.max_pool2d(h, kernel=(2, 2))
    h = b.relu(init.conv("conv2", h, c2, 3, pad=1))
    h = b.reshape(b.global_avg_pool2d(h), (batch, c2))
    return b.build([init.linear("fc", h, 10)])


def _resblock(c: int = 64, hw: int = 56) -> Graph:
    b = GraphBuilder("resblock")
    init = _Init(b, 11)
    x = b.input("x", (1, c, hw, hw))
    h = b.relu(init.batch_norm("bn1", init.conv("conv1", x, c, 3, pad=1)))
    h = init.batch_norm("bn2", init.conv("conv2", h, c, 3, pad=1))
    return b.build([b.relu(b.add(h, x))])


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            "softmax",
            "softmax over the last axis of [64,128] (the CINN softmax example)",
            _softmax((64, 128), "softmax"),
        ),
        ModelSpec(
            "softmax_large",
            "softmax over the last axis of [4096,1024]",
            _softmax((4096, 1024), "softmax_large"),
        ),
        ModelSpec(
            "rmsnorm", "RMSNorm of [1,2048,768] with a learned scale (the CINN RMSNorm example)", _rmsnorm
        ),
        ModelSpec("layernorm", "LayerNorm of [4096,768] with scale and shift", _layernorm),
        ModelSpec("bias_gelu", "bias add + exact (erf) GELU on [4096,3072]", _bias_gelu),
        ModelSpec("matmul", "fp32 matrix product 1024x1024 @ 1024x1024", _matmul),
        ModelSpec("mlp", "784 -> 128 -> relu -> 10, batch 256 (the TVM relay.build example)", _mlp),
        ModelSpec("attention", "multi-head self-attention, seq 128, d 768, 12 heads", _attention),
        ModelSpec(
            "encoder_layer", "BERT-base encoder layer, seq 128 (attention, FFN 3072, post-LN)", _encoder_layer
        ),
        ModelSpec("convnet", "conv-bn-relu-pool, conv-relu, global pool, linear on [8,3,32,32]", _convnet),
        ModelSpec("resblock", "ResNet basic block on [1,64,56,56]", _resblock),
    )
}


@cache
def _build_cached(name: str) -> Graph:
    return MODELS[name].build()


def get_model(name: str) -> Graph:
    """The graph of a built-in model; ModelError lists the known names for an unknown one."""
    if name not in MODELS:
        raise ModelError(f"unknown model '{name}'; built-in models: {', '.join(MODELS)}")
    return MODELS[name].graph()
