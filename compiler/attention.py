"""The attention core as one fusion decision: ``batch_matmul(Q, K)`` -> elementwise score ops (a scale,
an additive or ``where`` mask of constants) -> the decomposed softmax over the last axis ->
``batch_matmul(P, V)``.

Unfused, the rules make three kernels of it (QKᵀ with its scale epilogue, the softmax reduction, P·V) and
write the scores twice ([B, H, M, N] floats each time). Fused, it is one group of kind ``attention`` that a
backend sketch computes per (batch, head, block of query rows) with the score rows kept in a local buffer
(``compiler/backends/cpu/sketches/attention.py``). The group also takes the layout prologues of Q, K and V
(the head reshapes/transposes, the slices of a merged Q/K/V projection) and the layouts of a constant mask.

A matched core is a :class:`compiler.fusion.FusionEdge` with rule ``attention`` and id ``a<qk>_<pv>`` (the
canonical numbers of its two batch_matmuls; producer = QKᵀ, consumer = P·V): the plan turns it on or off
like any other edge. The rules leave it off; the plan search decides by measurement, and only on targets
whose backend has a sketch for the group (``compiler.fusion.regions``' ``has_sketch``).

Matched form (after ``decompose``/``optimize``; the zoo's ``_attention_block`` and torch-exported ONNX
attention both lower to it)::

    s0 = batch_matmul(q, k)                     any transpose_b, transpose_a false
    s  = chain of elementwise ops on s0         each reads s0's chain once; its other operands are
                                                constants/params or layouts of them (scale, mask)
    m  = reduce_max(s, axes=[last], keepdims)
    e  = exp(subtract(s, broadcast_to(m)))
    l  = reduce_sum(e, axes=[last], keepdims)
    p  = divide(e, broadcast_to(l))
    o  = batch_matmul(p, v)                     transpose_a false, transpose_b false

Every intermediate (s0 .. p) is read only inside the core and is no graph output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from compiler.graph import Graph, Node, Value
from compiler.ops import PatternKind, get_op

# elementwise ops the score chain may hold between QKᵀ and the softmax
SCORE_OPS = {"multiply", "divide", "add", "subtract", "where"}
if TYPE_CHECKING:
    from compiler.fusion import FusionEdge

CONST_LAYOUTS = {"broadcast_to", "reshape", "expand_dims", "squeeze", "transpose", "cast"}


@dataclass(frozen=True)
class AttentionCore:
    """One matched core: its two batch_matmuls, the score chain between QKᵀ and the softmax, and every node
    from QKᵀ to P·V (``nodes``, graph order)."""

    qk: Node
    pv: Node
    chain: tuple[Node, ...]
    nodes: tuple[Node, ...]

    @property
    def node_ids(self) -> frozenset[int]:
        return frozenset(id(n) for n in self.nodes)


def _constant(v: Value, const: Callable[[Value], bool]) -> bool:
    """A model constant, a constant node, or a layout of one (a mask broadcast to the scores)."""
    p = v.producer
    if const(v) or (p is not None and p.op == "constant"):
        return True
    return p is not None and p.op in CONST_LAYOUTS and len(p.inputs) == 1 and _constant(p.inputs[0], const)


def _only(users: dict[Value, list[Node]], v: Value, outputs: set[Value]) -> list[Node]:
    return [] if v in outputs else list(dict.fromkeys(users.get(v, [])))


def _last_axis_reduce(n: Node, op: str) -> bool:
    rank = len(n.inputs[0].shape)
    return n.op == op and tuple(n.attrs["axes"]) == (rank - 1,) and bool(n.attrs["keepdims"])


def _reduce_then_combine(
    users: dict[Value, list[Node]], outs: set[Value], x: Value, reduce_op: str, combine_op: str
) -> tuple[Node, Node, Node] | None:
    """``x`` read by exactly ``reduce_op`` over the last axis (keepdims) and ``combine_op(x, broadcast_to(that
    reduction))``, each intermediate read only by the next: (the reduction, its broadcast, the combine), or
    None. Softmax's max/subtract and sum/divide steps."""
    readers = _only(users, x, outs)
    red = next((n for n in readers if _last_axis_reduce(n, reduce_op)), None)
    comb = next((n for n in readers if n.op == combine_op and n.inputs[0] is x), None)
    if len(readers) != 2 or red is None or comb is None:
        return None
    bcast = _single(users, red.output, outs)
    if bcast is None or bcast.op != "broadcast_to" or comb.inputs[1] is not bcast.output:
        return None
    if _single(users, bcast.output, outs) is not comb:
        return None
    return red, bcast, comb


def match_core(graph: Graph, qk: Node, const: Callable[[Value], bool] | None = None) -> AttentionCore | None:
    """The attention core starting at the batch_matmul ``qk``, or None when the nodes after it do not have
    the matched form. ``const`` says which values are model constants (default: params; a region's
    subgraph passes its constant inputs)."""
    const = const or (lambda v: v.kind == "param")
    if qk.op != "batch_matmul" or qk.attrs.get("transpose_a"):
        return None
    users = graph.consumers()
    outs = set(graph.outputs)
    chain: list[Node] = []
    cur = qk.output
    while True:
        nxt = _only(users, cur, outs)
        if len(nxt) != 1 or nxt[0].op not in SCORE_OPS or nxt[0].output.shape != qk.output.shape:
            break
        n = nxt[0]
        if get_op(n.op).kind != PatternKind.ElementWise and n.op != "where":
            break
        others = [v for v in n.inputs if v is not cur]
        if len(others) != len(n.inputs) - 1 or not all(_constant(v, const) for v in others):
            break
        chain.append(n)
        cur = n.output
    s = cur
    found = _reduce_then_combine(users, outs, s, "reduce_max", "subtract")
    if found is None:
        return None
    rmax, bmax, sub = found
    ex = _single(users, sub.output, outs)
    if ex is None or ex.op != "exp":
        return None
    found = _reduce_then_combine(users, outs, ex.output, "reduce_sum", "divide")
    if found is None:
        return None
    rsum, bsum, div = found
    pv = _single(users, div.output, outs)
    if (
        pv is None
        or pv.op != "batch_matmul"
        or pv.inputs[0] is not div.output
        or pv.inputs[1] is div.output
        or pv.attrs.get("transpose_a")
        or pv.attrs.get("transpose_b")
    ):
        return None
    members = {id(n) for n in (qk, *chain, rmax, bmax, sub, ex, rsum, bsum, div, pv)}
    nodes = tuple(n for n in graph.nodes if id(n) in members)
    return AttentionCore(qk, pv, tuple(chain), nodes)


def _single(users: dict[Value, list[Node]], v: Value, outs: set[Value]) -> Node | None:
    readers = _only(users, v, outs)
    return readers[0] if len(readers) == 1 else None


def match_cores(graph: Graph, const: Callable[[Value], bool] | None = None) -> list[AttentionCore]:
    """Every attention core of ``graph`` (decomposed and optimized), in graph order (``const``: see
    :func:`match_core`)."""
    return [
        c
        for n in graph.nodes
        if n.op == "batch_matmul"
        for c in [match_core(graph, n, const)]
        if c is not None
    ]


def premerge_cores(graph: Graph, part: Any, edges: list[FusionEdge]) -> dict[int, AttentionCore]:
    """Merge the nodes of each attention core whose edge is on (``edges``) into one group of the partition
    ``part`` (:class:`compiler.fusion._Partition`); returns partition group -> core. A core's intermediates
    are read only inside it (:func:`match_core`), so the merged group closes no cycle."""
    by_qk = {id(c.qk): c for c in match_cores(graph)}
    out: dict[int, AttentionCore] = {}
    for e in edges:
        core = by_qk.get(id(e.producer))
        if core is None or core.pv is not e.consumer:
            continue
        g = part.group_of[id(core.qk)]
        for n in core.nodes:
            h = part.group_of[id(n)]
            if h != g:
                part.merge(g, h)
        out[g] = core
    return out


def attention_group_problem(graph: Graph, nodes: list[Node], core: AttentionCore) -> str | None:
    """Why ``nodes`` (an attention core and more) cannot be one ``attention`` group: besides the core it
    takes only layout ops upstream of it (the head reshapes/transposes of Q, K, V, slices of a merged
    projection, layouts of a constant mask) whose values nothing outside the group reads; no epilogue."""
    from compiler.fusion import LAYOUT_OPS

    inside = {id(n) for n in nodes}
    users = graph.consumers()
    outs = set(graph.outputs)
    for n in nodes:
        if id(n) in core.node_ids:
            continue
        if n.op not in LAYOUT_OPS:
            return f"{n.name} ({n.op}) is no layout op: an attention group takes only layout prologues"
        if any(v.producer is not None and id(v.producer) in core.node_ids for v in n.inputs):
            return f"{n.name} ({n.op}) after {core.pv.name}: an attention group takes no epilogue"
        if n.output in outs or any(id(u) not in inside for u in users.get(n.output, [])):
            return f"{n.name} ({n.op}) is also read outside the attention group"
    return None
