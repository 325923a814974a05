"""Common-subexpression elimination: nodes with the same op, inputs and attributes are computed once;
params with identical contents are merged."""

from __future__ import annotations

import json

from compiler.builder import GraphBuilder
from compiler.graph import Graph, Node, Value, attrs_to_json
from compiler.passes.rewrite import rewrite


def cse(graph: Graph) -> Graph:
    seen: dict[tuple, Value] = {}

    def rule(b: GraphBuilder, node: Node, inputs: list[Value]) -> Value | None:
        key = (node.op, tuple(id(v) for v in inputs), json.dumps(attrs_to_json(node.attrs), sort_keys=True))
        if key not in seen:
            seen[key] = b.add_node(node.op, inputs, node.attrs, node.name)
        return seen[key]

    return rewrite(graph, rule, merge_equal_params=True)
