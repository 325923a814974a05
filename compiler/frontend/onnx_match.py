"""The pattern-matching engine behind ``onnx_patterns``: rules look at a node and the nodes before it
(read-only, through :class:`Matcher`) and return a :class:`Match`; :func:`apply_rules` claims matches
greedily from the outputs back and rebuilds the graph with the replacements."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from compiler.frontend.onnx_common import ImportBuilder
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
