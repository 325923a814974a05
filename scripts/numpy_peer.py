"""Straightforward float32 numpy implementations of the benchmark workloads (the 'numpy' peer)."""

from __future__ import annotations

import math

import numpy as np


def _erf(x):
    from scipy.special import erf

    return erf(x)


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def rmsnorm(x, w):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + np.float32(1e-6)) * w


def layernorm(x, g, b):
    m = x.mean(axis=-1, keepdims=True)
    d = x - m
    return d / np.sqrt((d * d).mean(axis=-1, keepdims=True) + np.float32(1e-5)) * g + b


def bias_gelu(x, b):
    y = x + b
    return np.float32(0.5) * y * (np.float32(1) + _erf(y * np.float32(1 / math.sqrt(2))))


def matmul(a, b):
    return a @ b


def mlp(x, w1, b1, w2, b2):
    return np.maximum(x @ w1.T + b1, 0) @ w2.T + b2


def encoder_layer(x, p):
    """BERT-base post-LN layer with the zoo's parameter names (p: name -> array)."""
    s, d, h = x.shape[1], x.shape[2], 12
    hd = d // h
    x2 = x.reshape(s, d)

    def lin(v, name):
        return v @ p[f"{name}.weight"].T + p[f"{name}.bias"]

    def heads(v):
        return v.reshape(s, h, hd).transpose(1, 0, 2)

    q, k, v = heads(lin(x2, "attn.query")), heads(lin(x2, "attn.key")), heads(lin(x2, "attn.value"))
    att = softmax(q @ k.transpose(0, 2, 1) * np.float32(1 / math.sqrt(hd)))
    ctx = (att @ v).transpose(1, 0, 2).reshape(s, d)
    h1 = layernorm(x2 + lin(ctx, "attn.output"), p["attn_norm.weight"], p["attn_norm.bias"])
    ff = lin(bias_gelu(lin(h1, "ffn.intermediate"), np.float32(0)), "ffn.output")
    m = h1 + ff
    mu = m.mean(-1, keepdims=True)
    dd = m - mu
    out = dd / np.sqrt((dd * dd).mean(-1, keepdims=True) + np.float32(1e-12)) * p["ffn_norm.weight"]
    return (out + p["ffn_norm.bias"]).reshape(1, s, d)


def peer_for(name: str, graph, inputs):
    """A zero-argument callable computing model ``name`` with numpy, or None if there is none."""
    p = {v.name: v.data for v in graph.params}
    if name in ("softmax", "softmax_large"):
        return lambda: softmax(inputs[0])
    if name == "rmsnorm":
        return lambda: rmsnorm(inputs[0], p["weight"])
    if name == "layernorm":
        return lambda: layernorm(inputs[0], p["gamma"], p["beta"])
    if name == "bias_gelu":
        return lambda: bias_gelu(inputs[0], p["bias"])
    if name == "matmul":
        return lambda: matmul(*inputs)
    if name == "mlp":
        return lambda: mlp(inputs[0], p["fc1.weight"], p["fc1.bias"], p["fc2.weight"], p["fc2.bias"])
    if name == "encoder_layer":
        return lambda: encoder_layer(inputs[0], p)
    return None
