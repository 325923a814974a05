"""Dead-code elimination: drop nodes and params that no output depends on."""

from __future__ import annotations

from compiler.graph import Graph


def dce(graph: Graph) -> Graph:
    live = set(graph.outputs)
    kept = []
    for node in reversed(graph.nodes):
        if any(v in live for v in node.outputs):
            kept.append(node)
            live.update(node.inputs)
    params = [p for p in graph.params if p in live]
    return Graph(graph.name, graph.inputs, params, list(reversed(kept)), graph.outputs)
