"""Pattern rules for normalizations exporters decompose: LayerNorm and RMSNorm (see ``onnx_patterns``)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from compiler.builder import GraphBuilder
from compiler.frontend.onnx_common import f32_value
from compiler.frontend.onnx_match import Match, Matcher
from compiler.graph import Node, Value


def _trailing_axes(node: Node, rank: int) -> int | None:
    """The first axis if ``node`` reduces a trailing range of axes with keepdims, else None."""
    axes = tuple(node.attrs["axes"])
    if not node.attrs["keepdims"] or not axes or axes != tuple(range(axes[0], rank)):
        return None
    return axes[0]


def _square_of(m: Matcher, v: Value) -> tuple[Value, Node] | None:
    n = m.node(v, "multiply", "power")
    if n is None:
        return None
    if n.op == "multiply" and n.inputs[0] is n.inputs[1]:
        return n.inputs[0], n
    if n.op == "power" and m.is_scalar(n.inputs[1], 2.0):
        return n.inputs[0], n
    return None


def _mean_of_square(m: Matcher, v: Value) -> tuple[Value, int, float, list[Node]] | None:
    """v = reduce_mean(square(z)) + eps -> (z, axis, eps, nodes)."""
    add = m.node(v, "add")
    if add is None:
        return None
    for ms, eps in m.pairs(add):
        mean = m.node(ms, "reduce_mean")
        e = m.scalar(eps)
        e = None if e is None else f32_value(e) if eps.dtype == "float32" else e
        if mean is None or e is None:
            continue
        sq = _square_of(m, mean.inputs[0])
        if sq is None:
            continue
        axis = _trailing_axes(mean, len(mean.inputs[0].shape))
        if axis is not None:
            return sq[0], axis, e, [add, mean, sq[1]]
    return None


def _inv_root(m: Matcher, v: Value) -> tuple[Value, list[Node]] | None:
    """v = 1 / sqrt(a) (reciprocal(sqrt), rsqrt, 1 / sqrt) -> (a, nodes)."""
    n = m.node(v, "reciprocal", "rsqrt", "divide")
    if n is None:
        return None
    if n.op == "rsqrt":
        return n.inputs[0], [n]
    if n.op == "divide" and not m.is_scalar(n.inputs[0], 1.0):
        return None
    s = m.node(n.inputs[-1], "sqrt")
    return (s.inputs[0], [n, s]) if s is not None else None


def _normalized(m: Matcher, v: Value) -> tuple[Value, Value, list[Node]] | None:
    """v = z / sqrt(a) or z * rsqrt(a) -> (z, a, nodes)."""
    n = m.node(v, "divide", "multiply")
    if n is None:
        return None
    if n.op == "divide":
        s = m.node(n.inputs[1], "sqrt")
        return (n.inputs[0], s.inputs[0], [n, s]) if s is not None else None
    for z, r in m.pairs(n):
        inv = _inv_root(m, r)
        if inv is not None:
            return z, inv[0], [n, *inv[1]]
    return None


def _ln_core(m: Matcher, v: Value) -> tuple[Value, int, float, list[Node]] | None:
    norm = _normalized(m, v)
    if norm is None:
        return None
    d, a, nodes = norm
    var = _mean_of_square(m, a)
    sub = m.node(d, "subtract")
    if var is None or sub is None or var[0] is not d:
        return None
    x, mu = sub.inputs
    mean = m.node(mu, "reduce_mean")
    if mean is None or mean.inputs[0] is not x or tuple(mean.attrs["axes"]) != tuple(var[3][1].attrs["axes"]):
        return None
    if _trailing_axes(mean, len(x.shape)) != var[1] or x.shape != v.shape:
        return None
    return x, var[1], var[2], [*nodes, *var[3], sub, mean]


def _rms_core(m: Matcher, v: Value) -> tuple[Value, int, float, list[Node]] | None:
    norm = _normalized(m, v)
    if norm is None:
        return None
    x, a, nodes = norm
    ms = _mean_of_square(m, a)
    if ms is None or ms[0] is not x or x.shape != v.shape:
        return None
    return x, ms[1], ms[2], [*nodes, *ms[3]]


def _affine_ok(v: Value, x: Value, axis: int) -> bool:
    """v broadcasts over the normalized axes only (its shape fits x.shape[axis:] after leading 1s)."""
    shape = list(v.shape)
    while len(shape) > len(x.shape) - axis and shape and shape[0] == 1:
        shape.pop(0)
    inner = x.shape[axis:]
    if len(shape) > len(inner):
        return False
    return all(s in (1, d) for s, d in zip(shape[::-1], inner[::-1]))


def _as_shape(b: GraphBuilder, v: Value | None, shape: tuple[int, ...], fill: float, dtype: str) -> Value:
    """A scale/shift operand as a tensor of exactly ``shape`` (params are reshaped at import time)."""
    if v is None:
        return b.param(f"norm_{'scale' if fill else 'bias'}", np.full(shape, fill, dtype))
    if v.shape == shape:
        return v
    if v.producer is not None and v.producer.op == "constant":
        return b.param(
            f"norm_{'scale' if fill else 'bias'}", np.full(shape, v.producer.attrs["value"], dtype)
        )
    if v.kind == "param":
        data = np.asarray(v.data).reshape(v.shape[-len(shape) :] if len(v.shape) > len(shape) else v.shape)
        return b.param(v.name or "norm_param", np.ascontiguousarray(np.broadcast_to(data, shape)))
    squeezed = tuple(v.shape[-len(shape) :]) if len(v.shape) > len(shape) else v.shape
    if squeezed != v.shape:
        v = b.reshape(v, squeezed)
    return v if v.shape == shape else b.broadcast_to(v, shape)


def _affine_split(m: Matcher, root: Node, core: Callable) -> tuple | None:
    """root = core * gamma + beta, core * gamma, core + beta or core alone (largest first); returns
    (x, axis, eps, gamma, beta, interior nodes)."""
    tries: list[tuple[Value, Value | None, Value | None, list[Node]]] = []
    if root.op == "add":
        for y, beta in m.pairs(root):
            mul = m.node(y, "multiply")
            if mul is not None:
                tries.extend((c, gamma, beta, [mul]) for c, gamma in m.pairs(mul))
        tries.extend((y, None, beta, []) for y, beta in m.pairs(root))
    elif root.op == "multiply":
        tries.extend((c, gamma, None, []) for c, gamma in m.pairs(root))
    tries.append((root.output, None, None, []))
    for v, gamma, beta, extra in tries:
        found = core(m, v)
        if found is None:
            continue
        x, axis, eps, nodes = found
        if all(p is None or _affine_ok(p, x, axis) for p in (gamma, beta)):
            return x, axis, eps, gamma, beta, [n for n in [*nodes, *extra] if n is not root]
    return None


def layer_norm_rule(m: Matcher, root: Node) -> Match | None:
    if root.op not in ("add", "multiply", "divide"):
        return None
    found = _affine_split(m, root, _ln_core)
    if found is None:
        return None
    x, axis, eps, gamma, beta, inner = found
    inner_shape = x.shape[axis:]

    def build(b: GraphBuilder, xv: Value, *rest: Value) -> Value:
        it = iter(rest)
        g = _as_shape(b, next(it) if gamma is not None else None, inner_shape, 1.0, xv.dtype)
        bt = _as_shape(b, next(it) if beta is not None else None, inner_shape, 0.0, xv.dtype)
        return b.layer_norm(xv, g, bt, axis=axis, eps=eps)

    leaves = [x, *(p for p in (gamma, beta) if p is not None)]
    return Match(inner, leaves, build)


def rms_norm_rule(m: Matcher, root: Node) -> Match | None:
    if root.op not in ("multiply", "divide"):
        return None
    candidates: list[tuple[Value, Value | None, list[Node]]] = []
    if root.op == "multiply":
        factors, inner = m.product(root)
        if len(factors) == 3:  # weight * x * rsqrt(..) in any association: regroup
            for r in factors:
                inv = _inv_root(m, r)
                if inv is None:
                    continue
                others = [f for f in factors if f is not r]
                for x, w in (others, others[::-1]):
                    ms = _mean_of_square(m, inv[0])
                    ok = ms is not None and ms[0] is x and x.shape == root.output.shape
                    if ok and _affine_ok(w, x, ms[1]):
                        return _rms_match(x, w, ms[1], ms[2], [*inner, *inv[1], *ms[3]])
        for c, w in m.pairs(root):
            candidates.append((c, w, []))
    candidates.append((root.output, None, []))
    for v, w, _ in candidates:
        found = _rms_core(m, v)
        if found is None:
            continue
        x, axis, eps, nodes = found
        if w is not None and not _affine_ok(w, x, axis):
            continue
        return _rms_match(x, w, axis, eps, [n for n in nodes if n is not root])
    return None


def _rms_match(x: Value, w: Value | None, axis: int, eps: float, nodes: list[Node]) -> Match:
    shape = x.shape[axis:]

    def build(b: GraphBuilder, xv: Value, *rest: Value) -> Value:
        weight = _as_shape(b, rest[0] if rest else None, shape, 1.0, xv.dtype)
        return b.rms_norm(xv, weight, axis=axis, eps=eps)

    return Match(nodes, [x] if w is None else [x, w], build)
