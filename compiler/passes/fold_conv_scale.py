"""Fold a per-output-channel constant scale into the convolution before it (BatchNorm folding).

An inference BatchNorm decomposes to ``x * scale + shift`` with per-channel constants; after a conv2d
with constant weights, ``conv2d(x, W) * scale`` is ``conv2d(x, W * scale[o])``: the multiply disappears
from every output element and the convolution's epilogue keeps only the ``+ shift`` (a bias). The rule
applies when the convolution's output feeds only that multiply, its weight is a model constant and the
scale is a constant of shape [O, 1, 1] or [1, O, 1, 1] (or a broadcast of one), or a scalar.

Run it after ``fold_constants`` (which turns the BatchNorm parameters into one constant scale) and
before ``dce`` (which drops the unscaled convolution this pass leaves behind)."""

from __future__ import annotations

import numpy as np

from compiler.builder import GraphBuilder
from compiler.graph import Graph, Node, Value
from compiler.ops import get_op
from compiler.passes.rewrite import rewrite


def _constant(v: Value) -> np.ndarray | None:
    """The value of a model constant (a param, a scalar literal, or a broadcast_to / reshape of one)."""
    if v.kind == "param":
        return v.data
    p = v.producer
    if p is None:
        return None
    if p.op == "constant":
        return np.asarray(get_op("constant").reference(**p.attrs))
    if p.op in ("broadcast_to", "reshape", "expand_dims") and len(p.inputs) == 1:
        inner = _constant(p.inputs[0])
        if inner is not None and p.op == "broadcast_to":
            return inner  # the per-channel shape is checked against the convolution below
        return None if inner is None else inner.reshape(v.shape)
    return None


def _per_channel(scale: np.ndarray, channels: int) -> np.ndarray | None:
    """``scale`` as [O] when it varies only along axis 1 of an NCHW output (or is a scalar)."""
    if scale.size == 1:
        return np.full(channels, scale.reshape(()).item(), dtype=scale.dtype)
    shape = scale.shape
    if shape in ((channels, 1, 1), (1, channels, 1, 1)):
        return scale.reshape(channels)
    return None


def fold_conv_scale(graph: Graph) -> Graph:
    consumers = graph.consumers()

    def rule(b: GraphBuilder, node: Node, inputs: list[Value]) -> Value | None:
        if node.op != "multiply":
            return None
        for side in (0, 1):
            conv = node.inputs[side].producer
            if conv is None or conv.op != "conv2d" or len(consumers.get(conv.output, [])) != 1:
                continue
            if node.output.shape != conv.output.shape or node.inputs[side] in graph.outputs:
                continue
            weight = conv.inputs[1]
            scale = _constant(node.inputs[1 - side])
            if weight.kind != "param" or scale is None:
                continue
            per = _per_channel(scale, weight.shape[0])
            if per is None or per.dtype != weight.data.dtype:
                continue
            new_conv = inputs[side].producer  # the copy of the convolution in the graph being built
            folded = (weight.data * per.reshape(-1, 1, 1, 1)).astype(weight.data.dtype)
            w = b.param(f"{weight.name or 'weight'}_scaled", folded)
            return b.add_node("conv2d", [new_conv.inputs[0], w], conv.attrs, f"{conv.name}_scaled")
        return None

    return rewrite(graph, rule)
