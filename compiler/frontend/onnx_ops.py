"""ONNX converters for elementwise math, logic, casts and layout/shape ops (contractions, convolution,
pooling, normalization and reductions live in ``onnx_nn``).

Each converter gets the :class:`~compiler.frontend.onnx.Importer` and the node and returns one entry per
ONNX output. Nodes whose inputs are all known at import time never reach a converter: they are folded.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from compiler.frontend.onnx_common import OnnxNode, converter, ints, norm_axis, onnx_dtype

if TYPE_CHECKING:
    from compiler.frontend.onnx import Importer
    from compiler.graph import Value

# ------------------------------------------------------------------ elementwise
UNARY = {
    "Neg": "neg",
    "Abs": "abs",
    "Exp": "exp",
    "Log": "log",
    "Sqrt": "sqrt",
    "Reciprocal": "reciprocal",
    "Tanh": "tanh",
    "Erf": "erf",
    "Sigmoid": "sigmoid",
    "Relu": "relu",
    "Not": "logical_not",
    "HardSwish": "hard_swish",
}
BINARY = {
    "Add": "add",
    "Sub": "subtract",
    "Mul": "multiply",
    "Div": "divide",
    "Equal": "equal",
    "Less": "less",
    "LessOrEqual": "less_equal",
    "Greater": "greater",
    "GreaterOrEqual": "greater_equal",
    "And": "logical_and",
    "Or": "logical_or",
    "Xor": "not_equal",
}
VARIADIC = {"Max": "maximum", "Min": "minimum", "Sum": "add", "Mean": "add"}


@converter(*UNARY)
def _unary(ctx: Importer, node: OnnxNode) -> list[Value]:
    return [ctx.b.apply(UNARY[node.op], ctx.value(node.inputs[0]))]


@converter(*BINARY)
def _binary(ctx: Importer, node: OnnxNode) -> list[Value]:
    a, b = ctx.operands(node.inputs[0], node.inputs[1])
    return [ctx.b.apply(BINARY[node.op], a, b)]


@converter(*VARIADIC)
def _variadic(ctx: Importer, node: OnnxNode) -> list[Value]:
    vals = ctx.operands(*node.inputs)
    out = vals[0]
    for v in vals[1:]:
        out = ctx.b.apply(VARIADIC[node.op], out, v)
    if node.op == "Mean" and len(vals) > 1:
        out = ctx.b.divide(out, ctx.b.constant(float(len(vals)), out.dtype))
    return [out]


@converter("Pow")
def _pow(ctx: Importer, node: OnnxNode) -> list[Value]:
    x = ctx.value(node.inputs[0])
    e = ctx.const(node.inputs[1])
    if e is not None and e.size == 1 and e.ndim <= x.type.rank:
        p = float(e.reshape(()))
        if p == 1.0:
            return [x]
        if p == 2.0:
            return [ctx.b.multiply(x, x)]
        if p == 3.0:
            return [ctx.b.multiply(ctx.b.multiply(x, x), x)]
        if p == 0.5:
            return [ctx.b.sqrt(x)]
        return [ctx.b.power(x, ctx.b.constant(p, x.dtype))]
    (xv, ev) = ctx.operands(node.inputs[0], node.inputs[1])
    if ev.dtype != xv.dtype:
        ev = ctx.b.cast(ev, xv.dtype)
    return [ctx.b.power(xv, ev)]


@converter("LeakyRelu")
def _leaky_relu(ctx: Importer, node: OnnxNode) -> list[Value]:
    return [ctx.b.leaky_relu(ctx.value(node.inputs[0]), alpha=node.attr("alpha", 0.01))]


@converter("HardSigmoid")
def _hard_sigmoid(ctx: Importer, node: OnnxNode) -> list[Value]:
    x = ctx.value(node.inputs[0])
    return [ctx.b.hard_sigmoid(x, alpha=node.attr("alpha", 0.2), beta=node.attr("beta", 0.5))]


@converter("Gelu")
def _gelu(ctx: Importer, node: OnnxNode) -> list[Value]:
    approximate = node.attr("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise ctx.error(node, f"approximate={approximate!r} is not 'none' or 'tanh'")
    return [ctx.b.gelu(ctx.value(node.inputs[0]), approximate=approximate)]


def _scalar(ctx: Importer, value: float, like: Value) -> Value:
    return ctx.b.constant(value, like.dtype)


@converter("Elu", "Selu")
def _elu(ctx: Importer, node: OnnxNode) -> list[Value]:
    b, x = ctx.b, ctx.value(node.inputs[0])
    if node.op == "Elu":
        alpha, gamma = node.attr("alpha", 1.0), 1.0
    else:
        alpha, gamma = node.attr("alpha", 1.6732632423543772), node.attr("gamma", 1.0507009873554805)
    neg = b.multiply(b.subtract(b.exp(x), _scalar(ctx, 1.0, x)), _scalar(ctx, alpha, x))
    y = b.where(b.greater(x, _scalar(ctx, 0.0, x)), x, neg)
    return [y if gamma == 1.0 else b.multiply(y, _scalar(ctx, gamma, x))]


@converter("Softplus")
def _softplus(ctx: Importer, node: OnnxNode) -> list[Value]:
    b, x = ctx.b, ctx.value(node.inputs[0])
    soft = b.log(b.add(b.exp(x), _scalar(ctx, 1.0, x)))
    return [b.where(b.greater(x, _scalar(ctx, 20.0, x)), x, soft)]  # exp overflows long before 20 matters


@converter("Softsign")
def _softsign(ctx: Importer, node: OnnxNode) -> list[Value]:
    b, x = ctx.b, ctx.value(node.inputs[0])
    return [b.divide(x, b.add(b.abs(x), _scalar(ctx, 1.0, x)))]


@converter("PRelu")
def _prelu(ctx: Importer, node: OnnxNode) -> list[Value]:
    b = ctx.b
    x, slope = ctx.operands(node.inputs[0], node.inputs[1])
    return [b.where(b.less(x, _scalar(ctx, 0.0, x)), b.multiply(x, slope), x)]


@converter("Clip")
def _clip(ctx: Importer, node: OnnxNode) -> list[Value]:
    x = ctx.value(node.inputs[0])
    for i, op in ((1, "maximum"), (2, "minimum")):
        if node.input(i):
            (bound,) = ctx.operands(node.input(i))
            x = ctx.b.apply(op, x, bound)
    return [x]


@converter("Where")
def _where(ctx: Importer, node: OnnxNode) -> list[Value]:
    cond, a, b = ctx.operands(*node.inputs[:3])
    return [ctx.b.where(cond, a, b)]


@converter("Cast", "CastLike")
def _cast(ctx: Importer, node: OnnxNode) -> list[Value]:
    x = ctx.value(node.inputs[0])
    if node.op == "Cast":
        dtype = onnx_dtype(node.attr("to"), f"{ctx.label}: {node.describe()}")
    else:
        dtype = ctx.dtype(node.inputs[1])
    return [x if dtype == x.dtype else ctx.b.cast(x, dtype)]


@converter("Identity")
def _identity(ctx: Importer, node: OnnxNode) -> list[Value]:
    return [ctx.value(node.inputs[0])]


@converter("Dropout")
def _dropout(ctx: Importer, node: OnnxNode) -> list[Value | None]:
    training = ctx.const(node.input(2))
    if node.input(2) and (training is None or bool(training)):
        raise ctx.error(node, "training_mode must be a constant false (Kiln imports models for inference)")
    return [ctx.value(node.inputs[0]), None]


# ---------------------------------------------------------------- shape values
@converter("Shape")
def _shape(ctx: Importer, node: OnnxNode) -> list[np.ndarray]:
    shape = ctx.shape(node.inputs[0])
    rank = len(shape)
    start, end = node.attr("start", 0), node.attr("end", rank)
    start, end = (min(max(v + rank if v < 0 else v, 0), rank) for v in (start, end))
    return [np.array(shape[start:end], np.int64)]


@converter("Size")
def _size(ctx: Importer, node: OnnxNode) -> list[np.ndarray]:
    return [np.array(math.prod(ctx.shape(node.inputs[0])), np.int64)]


# ----------------------------------------------------------------------- layout
@converter("Reshape")
def _reshape(ctx: Importer, node: OnnxNode) -> list[Value]:
    x = ctx.value(node.inputs[0])
    target = ints(ctx.need_const(node, 1, "shape"))
    if not node.attr("allowzero", 0):
        if len(target) > x.type.rank and 0 in target[x.type.rank :]:
            raise ctx.error(node, f"shape {target} copies a dimension the input {x.type} does not have")
        target = [x.shape[i] if d == 0 else d for i, d in enumerate(target)]
    if tuple(target) == x.shape:
        return [x]
    return [ctx.b.reshape(x, target)]


@converter("Flatten")
def _flatten(ctx: Importer, node: OnnxNode) -> list[Value]:
    x = ctx.value(node.inputs[0])
    axis = node.attr("axis", 1)
    axis = axis + x.type.rank if axis < 0 else axis
    shape = (math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))
    return [x if shape == x.shape else ctx.b.reshape(x, shape)]


@converter("Transpose")
def _transpose(ctx: Importer, node: OnnxNode) -> list[Value]:
    x = ctx.value(node.inputs[0])
    perm = node.attr("perm") or list(reversed(range(x.type.rank)))
    if list(perm) == list(range(x.type.rank)):
        return [x]
    return [ctx.b.transpose(x, perm)]


def _axes(ctx: Importer, node: OnnxNode, index: int = 1) -> list[int] | None:
    """Axes from the attribute (older opsets) or the optional input (newer ones)."""
    if "axes" in node.attrs:
        return list(node.attrs["axes"])
    if node.input(index):
        return ints(ctx.need_const(node, index, "axes"))
    return None


@converter("Squeeze")
def _squeeze(ctx: Importer, node: OnnxNode) -> list[Value]:
    x = ctx.value(node.inputs[0])
    axes = _axes(ctx, node)
    if axes is None:
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    if not axes:
        return [x]
    return [ctx.b.squeeze(x, axes)]


@converter("Unsqueeze")
def _unsqueeze(ctx: Importer, node: OnnxNode) -> list[Value]:
    x = ctx.value(node.inputs[0])
    axes = _axes(ctx, node)
    if not axes:
        raise ctx.error(node, "Unsqueeze needs axes")
    return [ctx.b.expand_dims(x, axes)]


@converter("Concat")
def _concat(ctx: Importer, node: OnnxNode) -> list[Value]:
    vals = [ctx.value(n) for n in node.inputs if n]
    vals = [v for v in vals if v.type.numel > 0] or vals[:1]
    if len(vals) == 1:
        return vals
    return [ctx.b.concat(vals, axis=node.attr("axis"))]


@converter("Split")
def _split(ctx: Importer, node: OnnxNode) -> list[Value]:
    x = ctx.value(node.inputs[0])
    axis = norm_axis(node.attr("axis", 0), x.type.rank, node)
    dim, n = x.shape[axis], len(node.outputs)
    if node.input(1):
        sizes = ints(ctx.need_const(node, 1, "split"))
    elif "split" in node.attrs:
        sizes = list(node.attrs["split"])
    elif "num_outputs" in node.attrs:
        chunk = -(-dim // node.attrs["num_outputs"])
        sizes = [min(chunk, dim - i * chunk) for i in range(node.attrs["num_outputs"])]
    else:
        if dim % n:
            raise ctx.error(node, f"cannot split dimension {dim} into {n} equal parts")
        sizes = [dim // n] * n
    if sum(sizes) != dim or len(sizes) != n:
        raise ctx.error(node, f"split sizes {sizes} do not cover dimension {dim} with {n} outputs")
    outs, start = [], 0
    for size in sizes:
        outs.append(x if size == dim else ctx.b.slice(x, [start], [start + size], axes=[axis]))
        start += size
    return outs


@converter("Slice")
def _slice(ctx: Importer, node: OnnxNode) -> list[Value]:
    x = ctx.value(node.inputs[0])
    starts = ints(ctx.need_const(node, 1, "starts"))
    ends = ints(ctx.need_const(node, 2, "ends"))
    axes = ints(ctx.need_const(node, 3, "axes")) if node.input(3) else list(range(len(starts)))
    steps = ints(ctx.need_const(node, 4, "steps")) if node.input(4) else [1] * len(starts)
    out = ctx.b.slice(x, starts, ends, axes=axes, steps=steps)
    return [x if out.shape == x.shape and all(s == 1 for s in steps) else out]


@converter("Gather")
def _gather(ctx: Importer, node: OnnxNode) -> list[Value]:
    data = ctx.value(node.inputs[0])
    axis = norm_axis(node.attr("axis", 0), data.type.rank, node)
    idx = ctx.const(node.inputs[1])
    if idx is None:
        return [ctx.b.gather(data, ctx.value(node.inputs[1]), axis=axis)]
    n = data.shape[axis]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise ctx.error(node, f"index out of range for axis {axis} of size {n}")
    idx = np.where(idx < 0, idx + n, idx).astype(np.int64)
    if idx.ndim == 0:  # one index: a slice that drops the axis
        sliced = ctx.b.slice(data, [int(idx)], [int(idx) + 1], axes=[axis])
        return [ctx.b.squeeze(sliced, [axis])]
    return [ctx.b.gather(data, ctx.materialize(idx, node.inputs[1], from_weight=True), axis=axis)]


@converter("Expand")
def _expand(ctx: Importer, node: OnnxNode) -> list[Value]:
    x = ctx.value(node.inputs[0])
    target = ints(ctx.need_const(node, 1, "shape"))
    try:
        out = tuple(np.broadcast_shapes(x.shape, tuple(target)))
    except ValueError:
        raise ctx.error(node, f"cannot expand {x.type} to {target}") from None
    return [x if out == x.shape else ctx.b.broadcast_to(x, out)]


@converter("Tile")
def _tile(ctx: Importer, node: OnnxNode) -> list[Value]:
    x = ctx.value(node.inputs[0])
    reps = ints(ctx.need_const(node, 1, "repeats"))
    if len(reps) != x.type.rank:
        raise ctx.error(node, f"repeats {reps} must have one entry per axis of {x.type}")
    if all(r == 1 for r in reps):
        return [x]
    # tile = insert an axis before each, broadcast it to the repeat count, merge the pairs
    b = ctx.b
    y = b.expand_dims(x, list(range(0, 2 * x.type.rank, 2)))
    y = b.broadcast_to(y, [v for r, d in zip(reps, x.shape) for v in (r, d)])
    return [b.reshape(y, [r * d for r, d in zip(reps, x.shape)])]


@converter("Pad")
def _pad(ctx: Importer, node: OnnxNode) -> list[Value]:
    x = ctx.value(node.inputs[0])
    mode = node.attr("mode", "constant")
    if mode != "constant":
        raise ctx.error(node, f"mode '{mode}' is not supported (only constant padding)")
    pads = ints(ctx.need_const(node, 1, "pads"))
    value = ctx.const(node.input(2))
    if node.input(2) and value is None:
        raise ctx.error(node, "the pad value must be known at import time")
    axes = ints(ctx.need_const(node, 3, "axes")) if node.input(3) else list(range(x.type.rank))
    axes = [norm_axis(a, x.type.rank, node) for a in axes]
    full = [0] * (2 * x.type.rank)
    for i, a in enumerate(axes):
        full[a], full[a + x.type.rank] = pads[i], pads[i + len(axes)]
    if any(p < 0 for p in full):  # negative pads crop
        starts = [max(-full[a], 0) for a in range(x.type.rank)]
        ends = [x.shape[a] - max(-full[a + x.type.rank], 0) for a in range(x.type.rank)]
        x = ctx.b.slice(x, starts, ends)
        full = [max(p, 0) for p in full]
    if not any(full):
        return [x]
    fill = 0.0 if value is None or value.size == 0 else float(value.reshape(-1)[0])
    return [ctx.b.pad(x, full, value=fill)]


@converter("Trilu")
def _trilu(ctx: Importer, node: OnnxNode) -> list[Value]:
    x = ctx.value(node.inputs[0])
    if x.type.rank < 2:
        raise ctx.error(node, f"Trilu needs rank >= 2, got {x.type}")
    k = int(ctx.need_const(node, 1, "k").reshape(())) if node.input(1) else 0
    ones = np.ones(x.shape[-2:], bool)
    mask = np.triu(ones, k) if node.attr("upper", 1) else np.tril(ones, k)
    keep = ctx.materialize(mask, f"{node.outputs[0]}_mask", from_weight=True)
    return [ctx.b.where(keep, x, ctx.b.constant(0, x.dtype))]
