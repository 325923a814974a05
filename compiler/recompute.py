"""Recompute instead of materialize: a cheap producer read by several consumers, copied into each of them.

A group holds each node once, so a producer whose output several groups read is materialized: its group
writes it to memory and every consumer group reads it back. Recomputing it instead gives each consumer
(after the first) a copy of the producer node reading the producer's own inputs; the ordinary rules then
fuse each copy into its consumer's group, and when every consumer got its copy the value is never written
(the memory planner and assemble never see it). It pays when the producer is cheap next to a pass over
memory: an elementwise/broadcast op of at most ``MAX_INPUTS`` inputs.

A candidate is a :class:`compiler.fusion.FusionEdge` with rule ``recompute`` and id ``r<p>`` (the
producer's canonical number; producer = the node, consumer = its last reader): the plan turns it on or
off like any other edge. The rules leave it off; :func:`compiler.fusion.regions` offers it only where
turning it on changes the groups.
"""

from __future__ import annotations

from compiler.graph import Graph, Node
from compiler.ops import PatternKind, get_op

MAX_INPUTS = 2  # a recomputed op reads at most this many values (an add, a multiply, a broadcast)


def recompute_candidates(graph: Graph, numbers: dict[int, int]) -> list[tuple[Node, list[Node]]]:
    """(producer, its readers in graph order) for every cheap elementwise/broadcast node of ``graph`` read
    by two or more nodes and not a graph output; ``numbers`` is the canonical node numbering (ids)."""
    consumers = graph.consumers()
    outputs = set(graph.outputs)
    out = []
    for n in graph.nodes:
        if id(n) not in numbers or n.op == "constant" or n.output in outputs:
            continue
        if get_op(n.op).kind not in (PatternKind.ElementWise, PatternKind.Broadcast):
            continue
        if len(n.inputs) > MAX_INPUTS:
            continue
        readers = list(dict.fromkeys(consumers.get(n.output, [])))
        if len(readers) >= 2:
            out.append((n, readers))
    return out
