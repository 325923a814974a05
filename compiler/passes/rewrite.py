"""Rebuild a graph node by node, letting a pass replace any node with a subgraph."""

from __future__ import annotations

from collections.abc import Callable

from compiler.builder import GraphBuilder
from compiler.graph import Graph, Node, Value

# A node rule gets the builder, the node and its already-mapped inputs; it returns the replacement
# output value, or None to copy the node unchanged.
NodeRule = Callable[[GraphBuilder, Node, list[Value]], "Value | None"]


def rewrite(graph: Graph, rule: NodeRule | None = None, merge_equal_params: bool = False) -> Graph:
    """A new graph with every node passed through ``rule``; the input graph is left untouched."""
    b = GraphBuilder(graph.name)
    mapping: dict[Value, Value] = {}
    for v in graph.inputs:
        mapping[v] = b.input(v.name or "input", v.shape, v.dtype)
    by_content: dict[tuple, Value] = {}
    for p in graph.params:
        key = (p.dtype, p.shape, p.data.tobytes()) if merge_equal_params else (id(p),)  # type: ignore[union-attr]
        if key not in by_content:
            by_content[key] = b.param(p.name or "param", p.data)  # type: ignore[arg-type]
        mapping[p] = by_content[key]
    for node in graph.nodes:
        inputs = [mapping[v] for v in node.inputs]
        out = rule(b, node, inputs) if rule is not None else None
        if out is None:
            out = b.add_node(node.op, inputs, node.attrs, node.name)
        mapping[node.output] = out
    return b.build([mapping[v] for v in graph.outputs], validate=False)
