"""Run 1x1 convolutions on the image as one row of pixels (MobileNet's pointwise convolutions).

A 1x1 convolution with stride 1, no padding and no dilation reads and writes every image [H, W] as one
contiguous run of H*W pixels, so it is the same convolution on the image viewed as [1, H*W]::

    conv2d(x[N, C, H, W], W[O, C, 1, 1])
      -> reshape(conv2d(reshape(x, [N, C, 1, H*W]), W), [N, O, H, W])

The reshapes are views (no kernel, no copy). What it buys is one long output row: the CPU conv sketch's
direct method vectorizes along the output row, and a 28x28 image gives rows of 28 pixels that no 16-lane
register tile divides, while a row of 784 pixels is 49 whole vectors (the row-major NCHW output is then
written with contiguous vector stores instead of a scatter from a GEMM tile).

The elementwise chain that follows the convolution (folded BatchNorm bias, ReLU / ReLU6, a residual add)
is moved into the flattened view with it, so it stays the convolution's fused epilogue: an elementwise
node whose output has the convolution's shape and reads a flattened value is rebuilt on [N, O, 1, H*W],
its other operands taken as they are when they broadcast per channel (trailing dimensions 1 x 1), through
a new ``broadcast_to`` when they are a broadcast of such a per-channel value, or reshaped (a view) when
they are full [N, O, H, W] tensors. Every value keeps a reshape back to [N, O, H, W] for its other
consumers; ``dce`` drops the ones nobody reads. A convolution whose chain ends in a graph output stays as
it is (the output would be a view of the flat value, which the runtime copies out on every call). Run it
after ``fold_conv_scale`` and before ``dce``.
"""

from __future__ import annotations

import math

from compiler.builder import GraphBuilder
from compiler.graph import Graph, Node, Value
from compiler.ops import PatternKind, get_op
from compiler.passes.rewrite import rewrite


def _pointwise_1x1(node: Node) -> bool:
    """A conv2d that reads and writes the image as one run of pixels (1x1, stride 1, no padding)."""
    if node.op != "conv2d" or node.inputs[1].kind != "param":
        return False
    _o, _cg, kh, kw = node.inputs[1].shape
    _n, _c, h, _w = node.inputs[0].shape
    a = node.attrs
    return (
        (kh, kw) == (1, 1)
        and tuple(a["strides"]) == (1, 1)
        and tuple(a["dilation"]) == (1, 1)
        and tuple(a["padding"]) == (0, 0, 0, 0)
        and h > 1
    )


def _per_channel(shape: tuple[int, ...]) -> bool:
    """Whether a value of ``shape`` broadcasts the same way against [N, O, H, W] and [N, O, 1, H*W]."""
    return math.prod(shape) == 1 or (len(shape) >= 2 and shape[-2:] == (1, 1))


def _elementwise(node: Node) -> bool:
    return get_op(node.op).kind in (PatternKind.ElementWise, PatternKind.Broadcast) and node.op not in (
        "broadcast_to",
        "reshape",
    )


def _reaches_output(graph: Graph, conv: Node, consumers: dict) -> bool:
    """Whether the convolution's elementwise chain (what this pass would move into the flat view) ends in
    a graph output: that output would be a reshape of the flat value, which the runtime copies out."""
    outputs = set(map(id, graph.outputs))
    stack, seen = [conv.output], set()
    while stack:
        v = stack.pop()
        if id(v) in outputs:
            return True
        if id(v) in seen:
            continue
        seen.add(id(v))
        stack += [c.output for c in consumers.get(v, []) if _elementwise(c) and c.output.shape == v.shape]
    return False


def flatten_pointwise_conv(graph: Graph) -> Graph:
    consumers = graph.consumers()
    skip = {id(n) for n in graph.nodes if _pointwise_1x1(n) and _reaches_output(graph, n, consumers)}
    flat: dict[Value, Value] = {}  # a value of the new graph (4-D) -> the same value as [N, O, 1, H*W]

    def flat_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
        n, c, h, w = shape
        return (n, c, 1, h * w)

    def operand(b: GraphBuilder, v: Value, shape: tuple[int, ...]) -> Value | None:
        """``v`` as an operand of an elementwise node computed on the flattened ``shape``."""
        if v in flat:
            return flat[v]
        if _per_channel(v.shape):
            return v  # a scalar or a per-channel value: broadcasts against [N, O, 1, H*W] as it is
        p = v.producer
        if p is not None and p.op == "broadcast_to" and _per_channel(p.inputs[0].shape):
            return b.broadcast_to(p.inputs[0], shape)
        if v.shape == (shape[0], shape[1], *unflat[shape]):
            return b.reshape(v, shape)
        return None

    unflat: dict[tuple[int, ...], tuple[int, int]] = {}  # flattened shape -> the image's (H, W)

    def rule(b: GraphBuilder, node: Node, inputs: list[Value]) -> Value | None:
        if _pointwise_1x1(node) and id(node) not in skip:
            x = inputs[0]
            n, c, h, w = x.shape
            xf = flat.get(x) or b.reshape(x, (n, c, 1, h * w))
            y = b.add_node("conv2d", [xf, inputs[1]], node.attrs, node.name)
            unflat[y.shape] = (h, w)
        elif _elementwise(node) and any(v in flat for v in inputs):
            shape = flat[next(v for v in inputs if v in flat)].shape
            if node.output.shape != (shape[0], shape[1], *unflat[shape]):
                return None
            ops = [operand(b, v, shape) for v in inputs]
            if any(o is None for o in ops):
                return None
            y = b.add_node(node.op, ops, node.attrs, node.name)  # type: ignore[arg-type]
        else:
            return None
        out = b.reshape(y, node.output.shape)
        flat[out] = y
        return out

    return rewrite(graph, rule)
