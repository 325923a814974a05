"""Recognize the subgraphs exporters emit for common layers and replace them with the Kiln ops the
GraphBuilder uses, so imported models decompose, fuse and hash like the built-in ones.

Rules (each matched from its last node backwards, intermediates used only inside the pattern):

- erf GELU ``x * 0.5 * (1 + erf(x / sqrt2))`` (any association / commuted order, ``x * (1/sqrt2)``,
  ``... / 2``) and tanh GELU ``0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))`` -> ``gelu``
- decomposed LayerNorm (ReduceMean, Sub, square, ReduceMean, Add eps, Sqrt, Div or Mul by Reciprocal,
  optional Mul gamma / Add beta) -> ``layer_norm``
- decomposed RMSNorm (square, ReduceMean, Add eps, Sqrt + Div or Reciprocal + Mul, optional Mul weight)
  -> ``rms_norm``
- ``x * sigmoid(x)`` -> ``silu``
- ``linear(x, W) + bias`` -> ``linear(x, W, bias)``
- contractions: transposes of an operand's last two axes become transpose flags, scalar scales of
  float operands move after the product (torch's split sqrt(scale) on q and k), and dividing a product
  by a constant becomes multiplying by its reciprocal (the attention-score scaling the zoo uses).

Matching is greedy from the outputs back, so the largest pattern at a root wins.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from compiler.builder import GraphBuilder
from compiler.frontend.onnx_common import ImportBuilder, f32_value
from compiler.graph import Graph, Node, Value
from compiler.passes import dce

# A match: interior nodes (replaced), leaf values (inputs of the replacement) and a builder for it.
Build = Callable[..., Value]


@dataclass
class Match:
    interior: list[Node]
    leaves: list[Value]
    build: Build


class Matcher:
    """Read-only queries over the graph being matched."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.users = graph.consumers()
        self.outputs = set(graph.outputs)

    def node(self, v: Value, *ops: str) -> Node | None:
        n = v.producer
        return n if n is not None and n.op in ops else None

    def scalar(self, v: Value) -> float | None:
        """The value of a scalar literal or a size-1 param, else None."""
        n = v.producer
        if n is not None and n.op == "constant":
            return float(n.attrs["value"])
        if v.kind == "param" and v.data is not None and v.data.size == 1:
            return float(v.data.reshape(()))
        if n is not None and n.op == "broadcast_to":
            return self.scalar(n.inputs[0])
        return None

    def is_scalar(self, v: Value, target: float, rel: float = 1e-5) -> bool:
        s = self.scalar(v)
        return s is not None and math.isclose(s, target, rel_tol=rel, abs_tol=1e-12)

    def pairs(self, node: Node) -> list[tuple[Value, Value]]:
        """The two inputs of a commutative binary node in both orders."""
        a, b = node.inputs
        return [(a, b), (b, a)]

    def single_use(self, v: Value) -> bool:
        return len(self.users.get(v, [])) == 1 and v not in self.outputs

    def product(self, root: Node) -> tuple[list[Value], list[Node]]:
        """Flatten a tree of multiplies rooted at ``root`` into factors and the inner multiply nodes."""
        factors: list[Value] = []
        inner: list[Node] = []

        def walk(v: Value) -> None:
            n = self.node(v, "multiply")
            if n is not None and self.single_use(v) and v.shape == root.output.shape:
                inner.append(n)
                for x in n.inputs:
                    walk(x)
            else:
                factors.append(v)

        for x in root.inputs:
            walk(x)
        return factors, inner

    def private(self, interior: Sequence[Node], root: Node, claimed: set[int]) -> bool:
        """Interior nodes are unclaimed and their outputs feed only the pattern (never a graph output)."""
        inside = {id(n) for n in interior} | {id(root)}
        for n in interior:
            if id(n) in claimed:
                return False
            for v in n.outputs:
                if v in self.outputs or any(id(u) not in inside for u in self.users.get(v, [])):
                    return False
        return True


# ------------------------------------------------------------------------ gelu
SQRT2 = math.sqrt(2.0)


def _erf_arg(m: Matcher, t: Value, x: Value) -> list[Node] | None:
    """t = 1 + erf(x / sqrt2) (or x * (1/sqrt2)); the nodes, or None."""
    add = m.node(t, "add")
    if add is None:
        return None
    for e, one in m.pairs(add):
        erf = m.node(e, "erf")
        if erf is None or not m.is_scalar(one, 1.0):
            continue
        u = erf.inputs[0]
        scale = m.node(u, "divide", "multiply")
        if scale is None:
            continue
        if scale.op == "divide" and scale.inputs[0] is x and m.is_scalar(scale.inputs[1], SQRT2):
            return [add, erf, scale]
        if scale.op == "multiply":
            for a, c in m.pairs(scale):
                if a is x and m.is_scalar(c, 1 / SQRT2):
                    return [add, erf, scale]
    return None


def _tanh_arg(m: Matcher, t: Value, x: Value) -> list[Node] | None:
    """t = 1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)); the nodes, or None."""
    add = m.node(t, "add")
    if add is None:
        return None
    for th, one in m.pairs(add):
        tanh = m.node(th, "tanh")
        if tanh is None or not m.is_scalar(one, 1.0):
            continue
        scale = m.node(tanh.inputs[0], "multiply")
        if scale is None:
            continue
        for p, c in m.pairs(scale):
            poly = m.node(p, "add")
            if poly is None or not m.is_scalar(c, math.sqrt(2 / math.pi)):
                continue
            for xx, cubic in m.pairs(poly):
                cn = m.node(cubic, "multiply")
                if xx is not x or cn is None:
                    continue
                factors, inner = m.product(cn)
                consts = [f for f in factors if m.is_scalar(f, 0.044715)]
                xs = [f for f in factors if f is x]
                pw = [f for f in factors if m.node(f, "power") and m.node(f, "power").inputs[0] is x]
                if len(consts) == 1 and len(xs) == 3 and len(factors) == 4:
                    return [add, tanh, scale, poly, cn, *inner]
                if len(consts) == 1 and len(pw) == 1 and len(factors) == 2:
                    pn = pw[0].producer
                    if m.is_scalar(pn.inputs[1], 3.0):
                        return [add, tanh, scale, poly, cn, *inner, pn]
    return None


def gelu_rule(m: Matcher, root: Node) -> Match | None:
    if root.op == "multiply":
        factors, inner = m.product(root)
        halves = [f for f in factors if m.is_scalar(f, 0.5)]
        if len(factors) != 3 or len(halves) != 1:
            return None
        rest = [f for f in factors if f is not halves[0]]
    elif root.op == "divide" and m.is_scalar(root.inputs[1], 2.0):
        num = m.node(root.inputs[0], "multiply")
        if num is None or not m.single_use(root.inputs[0]):
            return None
        factors, inner = m.product(num)
        inner = [num, *inner]
        if len(factors) != 2:
            return None
        rest = factors
    else:
        return None
    for x, t in (rest, rest[::-1]):
        for approximate, arg in (("none", _erf_arg), ("tanh", _tanh_arg)):
            nodes = arg(m, t, x)
            if nodes is not None:
                return Match(inner + nodes, [x], lambda b, xv, a=approximate: b.gelu(xv, approximate=a))
    return None


def silu_rule(m: Matcher, root: Node) -> Match | None:
    if root.op != "multiply":
        return None
    for x, s in m.pairs(root):
        sig = m.node(s, "sigmoid")
        if sig is not None and sig.inputs[0] is x:
            return Match([sig], [x], lambda b, xv: b.silu(xv))
    return None


def hard_swish_rule(m: Matcher, root: Node) -> Match | None:
    """x * hard_sigmoid(x; 1/6, 1/2), how opsets before 14 spell HardSwish."""
    if root.op != "multiply":
        return None
    for x, s in m.pairs(root):
        hs = m.node(s, "hard_sigmoid")
        if hs is None or hs.inputs[0] is not x:
            continue
        if math.isclose(hs.attrs["alpha"], 1 / 6, rel_tol=1e-6) and math.isclose(hs.attrs["beta"], 0.5):
            return Match([hs], [x], lambda b, xv: b.hard_swish(xv))
    return None


# ------------------------------------------------------------------- norms
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


# ------------------------------------------------------------ linear / matmul
def linear_bias_rule(m: Matcher, root: Node) -> Match | None:
    if root.op != "add":
        return None
    for y, bias in m.pairs(root):
        lin = m.node(y, "linear")
        if lin is None or len(lin.inputs) != 2 or root.output.shape != y.shape:
            continue
        n = y.shape[-1]
        if bias.shape[-1:] != (n,) or math.prod(bias.shape) != n or bias.dtype != y.dtype:
            continue
        if bias.producer is not None and bias.producer.op != "constant" and bias.kind != "param":
            continue  # a runtime residual, not a bias

        def build(b: GraphBuilder, xv: Value, wv: Value, bv: Value, n: int = n) -> Value:
            if bv.shape != (n,):
                bv = (
                    b.param(bv.name or "bias", bv.data.reshape(n))
                    if bv.kind == "param"
                    else b.reshape(bv, (n,))
                )
            return b.linear(xv, wv, bv)

        return Match([lin], [lin.inputs[0], lin.inputs[1], bias], build)
    return None


@dataclass
class _Operand:
    """A contraction operand after peeling: the leaf, a transpose to re-create (or None), the scale
    taken off it, whether its last two axes flipped, and the nodes removed."""

    leaf: Value
    perm: tuple[int, ...] | None
    scale: float
    flip: bool
    nodes: list[Node]


def _peel(m: Matcher, v: Value) -> _Operand:
    """Strip single-use scalar multiplies (float only) and a last-two-axes transpose off an operand."""
    scale, nodes = 1.0, []
    while m.single_use(v) and v.dtype in ("float32", "float64"):
        mul = m.node(v, "multiply")
        found = mul and next(((a, m.scalar(c)) for a, c in m.pairs(mul) if m.scalar(c) is not None), None)
        if not found or found[0].shape != v.shape:
            break
        v, scale = found[0], scale * found[1]
        nodes.append(mul)
    tr = m.node(v, "transpose")
    if tr is not None and m.single_use(v) and len(v.shape) >= 2:
        perm = list(tr.attrs["perm"])
        rank = len(perm)
        q = (*perm[:-2], perm[-1], perm[-2])
        if q == tuple(range(rank)):
            return _Operand(tr.inputs[0], None, scale, True, [*nodes, tr])
        if q[-1] == rank - 1:  # keeps the innermost axis innermost: a head-split style transpose
            return _Operand(tr.inputs[0], q, scale, True, [*nodes, tr])
    return _Operand(v, None, scale, False, nodes)


def _snap_inverse_sqrt(scale: float) -> float:
    """sqrt(1/sqrt(d)) squared in float32 misses 1/sqrt(d) by an ulp; give the attention scale back
    exactly (it is an attribute of the workload, and the zoo writes 1/sqrt(d))."""
    if scale <= 0:
        return scale
    d = round(1 / scale**2)
    if d >= 1 and math.isclose(scale, 1 / math.sqrt(d), rel_tol=1e-6):
        return 1 / math.sqrt(d)
    return scale


def contraction_rule(m: Matcher, root: Node) -> Match | None:
    if root.op not in ("matmul", "batch_matmul"):
        return None
    a, c = _peel(m, root.inputs[0]), _peel(m, root.inputs[1])
    if not a.nodes and not c.nodes:
        return None
    ta = root.attrs["transpose_a"] != a.flip
    tb = root.attrs["transpose_b"] != c.flip
    scale = a.scale * c.scale
    if a.scale != 1.0 and c.scale != 1.0:
        scale = _snap_inverse_sqrt(scale)

    def build(b: GraphBuilder, av: Value, cv: Value) -> Value:
        if a.perm is not None:
            av = b.transpose(av, a.perm)
        if c.perm is not None:
            cv = b.transpose(cv, c.perm)
        out = b.apply(root.op, av, cv, transpose_a=ta, transpose_b=tb)
        return out if scale == 1.0 else b.multiply(out, b.constant(scale, out.dtype))

    return Match([*a.nodes, *c.nodes], [a.leaf, c.leaf], build)


def scale_division_rule(m: Matcher, root: Node) -> Match | None:
    if root.op != "divide" or root.output.dtype not in ("float32", "float64"):
        return None
    y, c = root.inputs
    s = m.scalar(c)
    if s in (None, 0.0) or m.node(y, "matmul", "batch_matmul") is None or c.shape != ():
        return None
    return Match([], [y], lambda b, yv, s=s: b.multiply(yv, b.constant(1.0 / s, yv.dtype)))


RULES = (
    layer_norm_rule,
    rms_norm_rule,
    gelu_rule,
    silu_rule,
    hard_swish_rule,
    linear_bias_rule,
    scale_division_rule,
)
# Contractions are canonicalized in a second round, after norms and activations claimed their nodes.
LATE_RULES = (contraction_rule,)


def apply_rules(graph: Graph, rules: Sequence[Callable[[Matcher, Node], Match | None]]) -> Graph:
    """One greedy round: match roots from the outputs back, then rebuild the graph with replacements."""
    m = Matcher(graph)
    claimed: set[int] = set()
    matches: dict[int, Match] = {}
    for node in reversed(graph.nodes):
        if id(node) in claimed:
            continue
        for rule in rules:
            match = rule(m, node)
            if match is not None and m.private(match.interior, node, claimed):
                matches[id(node)] = match
                claimed.update(id(n) for n in match.interior)
                claimed.add(id(node))
                break
    if not matches:
        return graph
    interior = claimed - set(matches)
    b = ImportBuilder(graph.name)
    mapping: dict[Value, Value] = {v: b.input(v.name or "input", v.shape, v.dtype) for v in graph.inputs}
    for p in graph.params:
        mapping[p] = b.param(p.name or "param", p.data)  # type: ignore[arg-type]
    for node in graph.nodes:
        if id(node) in interior:
            continue
        match = matches.get(id(node))
        if match is not None:
            start = len(b.nodes)
            out = match.build(b, *(mapping[v] for v in match.leaves))
            if out.producer is not None and any(n is out.producer for n in b.nodes[start:]):
                b.rename(out.producer, node.name)
        else:
            out = b.add_node(node.op, [mapping[v] for v in node.inputs], node.attrs, node.name)
        mapping[node.output] = out
    return dce(b.build([mapping[v] for v in graph.outputs]))


def recognize_patterns(graph: Graph) -> Graph:
    """Replace exported layer patterns with Kiln composites and canonical contractions."""
    graph = apply_rules(graph, RULES)
    return apply_rules(graph, LATE_RULES)
