"""A Kiln graph as a torch function: the torch eager / torch.compile contenders of `kiln bench`.

Composite ops map to torch's own fused ops (softmax, layer_norm, gelu, linear), so torch is measured at its
best. :func:`params_as_inputs` turns a graph's params into inputs (so torch gets them as device tensors on
a GPU)."""

from __future__ import annotations

import math

import numpy as np


def params_as_inputs(graph):  # type: ignore[no-untyped-def]
    """The same graph with its params turned into inputs (after the original inputs)."""
    from compiler.builder import GraphBuilder

    b = GraphBuilder(graph.name)
    env = {}
    for v in [*graph.inputs, *graph.params]:
        env[v] = b.input(v.name or f"v{len(env)}", v.shape, v.dtype)
    for n in graph.nodes:
        env[n.output] = b.add_node(n.op, [env[v] for v in n.inputs], n.attrs, n.name)
    return b.build([env[v] for v in graph.outputs])


def graph_to_torch(graph):  # type: ignore[no-untyped-def]
    """``fn(*inputs)`` computing ``graph`` with torch ops (params become constant tensors). A graph with
    ops the peer has no torch mapping for (it maps the built-in zoo's ops, not every ONNX import) is refused
    here with a KilnError naming them, before anything is timed."""
    import torch
    import torch.nn.functional as F

    params = {p: torch.from_numpy(np.ascontiguousarray(p.data)) for p in graph.params}
    T = torch

    def rms(x, w, axis, eps):
        dims = tuple(range(axis, x.dim()))
        return x * torch.rsqrt(x.pow(2).mean(dim=dims, keepdim=True) + eps) * w

    def mm(a, b, transpose_a, transpose_b):
        return T.matmul(a.transpose(-1, -2) if transpose_a else a, b.transpose(-1, -2) if transpose_b else b)

    ops = {
        "add": T.add,
        "subtract": T.sub,
        "multiply": T.mul,
        "divide": T.div,
        "power": T.pow,
        "maximum": T.maximum,
        "minimum": T.minimum,
        "exp": T.exp,
        "log": T.log,
        "sqrt": T.sqrt,
        "rsqrt": T.rsqrt,
        "tanh": T.tanh,
        "erf": T.erf,
        "sigmoid": T.sigmoid,
        "relu": F.relu,
        "neg": T.neg,
        "abs": T.abs,
        "reciprocal": T.reciprocal,
        "silu": F.silu,
        "softmax": lambda x, axis: T.softmax(x, axis),
        "log_softmax": lambda x, axis: T.log_softmax(x, axis),
        "layer_norm": lambda x, g, b, axis, eps: F.layer_norm(x, x.shape[axis:], g, b, eps),
        "rms_norm": rms,
        "gelu": lambda x, approximate: F.gelu(x, approximate=approximate),
        "linear": lambda x, w, b=None: F.linear(x, w, b),
        "matmul": mm,
        "batch_matmul": mm,
        "reshape": lambda x, shape: x.reshape(shape),
        "transpose": lambda x, perm: x.permute(perm),
        "broadcast_to": lambda x, shape: x.expand(shape),
        "reduce_sum": lambda x, axes, keepdims: x.sum(dim=axes, keepdim=keepdims),
        "reduce_mean": lambda x, axes, keepdims: x.mean(dim=axes, keepdim=keepdims),
        "reduce_max": lambda x, axes, keepdims: x.amax(dim=axes, keepdim=keepdims),
        "conv2d": lambda x, w, strides, padding, dilation, groups: F.conv2d(
            F.pad(x, (padding[1], padding[3], padding[0], padding[2])), w, None, strides, 0, dilation, groups
        ),
        "batch_norm": lambda x, g, b, m, v, axis, eps: F.batch_norm(x, m, v, g, b, False, 0.0, eps),
        "max_pool2d": lambda x, kernel, strides, padding: F.max_pool2d(
            F.pad(x, (padding[1], padding[3], padding[0], padding[2]), value=-math.inf), kernel, strides
        ),
        "global_avg_pool2d": lambda x: x.mean(dim=(2, 3), keepdim=True),
        "constant": lambda value, dtype: T.tensor(value, dtype=getattr(T, dtype)),
    }

    missing = sorted({n.op for n in graph.nodes} - ops.keys())
    if missing:
        from compiler.errors import KilnError

        raise KilnError(
            f"the torch peer has no torch mapping for op(s) {', '.join(missing)} of {graph.name}: "
            "torch contenders time the built-in models' ops only"
        )

    def fn(*inputs):
        env = dict(zip(graph.inputs, inputs))
        env.update(params)
        for n in graph.nodes:
            attrs = {k: v for k, v in n.attrs.items() if v is not None}
            env[n.output] = ops[n.op](*(env[v] for v in n.inputs), **attrs)
        outs = [env[v] for v in graph.outputs]
        return outs[0] if len(outs) == 1 else tuple(outs)

    return fn
