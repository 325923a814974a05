"""Recognize the subgraphs exporters emit for common layers and replace them with the Kiln ops the
GraphBuilder uses, so imported models decompose, fuse and hash like the built-in ones.

Rules (each matched from its last node backwards, intermediates used only inside the pattern):

- erf GELU ``x * 0.5 * (1 + erf(x / sqrt2))`` (any association / commuted order, ``x * (1/sqrt2)``,
  ``... / 2``) and tanh GELU ``0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))`` -> ``gelu``
- decomposed LayerNorm (ReduceMean, Sub, square, ReduceMean, Add eps, Sqrt, Div or Mul by Reciprocal,
  optional Mul gamma / Add beta) -> ``layer_norm``
- decomposed RMSNorm (square, ReduceMean, Add eps, Sqrt + Div or Reciprocal + Mul, optional Mul weight)
  -> ``rms_norm`` (these two rules live in ``onnx_norm_patterns``)
- ``x * sigmoid(x)`` -> ``silu``; ``x * hard_sigmoid(x; 1/6, 1/2)`` -> ``hard_swish``
- ``linear(x, W) + bias`` -> ``linear(x, W, bias)``
- contractions: transposes of an operand's last two axes become transpose flags, scalar scales of
  float operands move after the product (torch's split sqrt(scale) on q and k), and dividing a product
  by a constant becomes multiplying by its reciprocal (the attention-score scaling the zoo uses).

Matching is greedy from the outputs back, so the largest pattern at a root wins (engine: ``onnx_match``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from compiler.builder import GraphBuilder
from compiler.frontend.onnx_match import Match, Matcher, apply_rules
from compiler.frontend.onnx_norm_patterns import layer_norm_rule, rms_norm_rule
from compiler.graph import Graph, Node, Value

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


def recognize_patterns(graph: Graph) -> Graph:
    """Replace exported layer patterns with Kiln composites and canonical contractions."""
    graph = apply_rules(graph, RULES)
    return apply_rules(graph, LATE_RULES)
