"""Decompose composite ops (softmax, layer_norm, rms_norm, linear, gelu, batch_norm, reduce_mean ...)
into primitive ops, as CINN's composite-op split does. Decompositions may use other composites
(global_avg_pool2d -> reduce_mean), so the pass repeats until no composite is left."""

from __future__ import annotations

from compiler.builder import GraphBuilder
from compiler.graph import Graph, Node, Value
from compiler.ops import get_op
from compiler.passes.rewrite import rewrite


def _rule(b: GraphBuilder, node: Node, inputs: list[Value]) -> Value | None:
    opdef = get_op(node.op)
    if opdef.is_composite:
        return opdef.decompose(b, *inputs, **node.attrs)  # type: ignore[misc]
    return None


def decompose(graph: Graph) -> Graph:
    while any(get_op(n.op).is_composite for n in graph.nodes):
        graph = rewrite(graph, _rule)
    return graph
