"""The graph rewrites a fusion plan asks for before grouping: sibling GEMMs merged
(:mod:`compiler.horizontal`), cheap producers copied into each reader (:mod:`compiler.recompute`) and
small-M matmuls split along K (:mod:`compiler.passes.split_k`).

:func:`rewrite_for_plan` returns the rewritten graph and its origin map (id of each new node -> the node of
the given graph it copies or stands for), which :func:`compiler.fusion.fuse` uses to carry the plan's other
decisions over to the new graph's edges and to map groups back to regions. The given graph is untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from compiler.builder import GraphBuilder
from compiler.graph import Graph, Node, Value
from compiler.horizontal import SiblingSet
from compiler.passes.dce import dce
from compiler.passes.split_k import emit_split, gemm_shape, split_factor


def rewrite_for_plan(
    graph: Graph,
    sets: list[SiblingSet],
    recompute: list[Node],
    split: Sequence[Node] = (),
    sm_count: int = 0,
) -> tuple[Graph, dict[int, Node], set[int]]:
    """``graph`` with each sibling set merged into one GEMM (+ one bias add) and a slice per sibling, each
    node of ``recompute`` copied for every reader after its first (the copy placed just before the reader),
    and each matmul of ``split`` split along K into S partial GEMMs and their sum, S by
    :func:`~compiler.passes.split_k.split_factor` on ``sm_count`` SMs. A merged GEMM is split when every one
    of its siblings is in ``split`` (S from the merged shape; not split when that gives S = 1).

    Origin map: the merged matmul/add -> the first sibling's; sibling i's slice -> sibling i's last merged
    node; a copy -> the node it copies; a split matmul's new nodes (reshapes, transposes, partial GEMM, sum)
    -> the matmul (the merged one's -> the first sibling); every other node -> itself. Also returned: the
    ids of the copies. Weights must be params with data."""
    b = GraphBuilder(graph.name)
    mapping: dict[Value, Value] = {}
    origin: dict[int, Node] = {}
    for v in graph.inputs:
        mapping[v] = b.input(v.name or "input", v.shape, v.dtype)
    for p in graph.params:
        mapping[p] = b.param(p.name or "param", p.data)  # type: ignore[arg-type]
    first = {id(s.matmuls[0]): s for s in sets}
    replaced = {id(n) for s in sets for n in (*s.matmuls, *s.adds)}
    copied = {id(n): n for n in recompute if id(n) not in replaced}
    copies: dict[tuple[int, int], Value] = {}  # (producer, reader) -> the reader's copy
    readers_seen: dict[int, int] = {}
    made: set[int] = set()
    to_split = {id(n) for n in split}

    def node(op: str, inputs: list[Value], attrs: dict, name: str | None, src: Node) -> Value:
        out = b.add_node(op, inputs, attrs, name)
        origin[id(out.producer)] = src
        return out

    def matmul(inputs: list[Value], attrs: dict, name: str | None, src: Node, splits: bool) -> Value:
        s = 1
        if splits:
            m, n, k = gemm_shape(inputs[0], inputs[1], bool(attrs.get("transpose_b")))
            s = split_factor(m, n, k, sm_count)
        if s == 1:
            return node("matmul", inputs, attrs, name, src)
        start = len(b.nodes)
        out = emit_split(b, inputs[0], inputs[1], bool(attrs.get("transpose_b")), s, name)
        for new in b.nodes[start:]:
            origin[id(new)] = src
        return out

    for n in graph.nodes:
        s = first.get(id(n))
        if s is not None:
            _emit_merged(b, s, mapping, node, matmul, all(id(m) in to_split for m in s.matmuls))
            continue
        if id(n) in replaced:
            continue
        inputs = []
        for v in n.inputs:
            p = v.producer
            if p is not None and id(p) in copied:
                if (id(p), id(n)) not in copies:
                    k = readers_seen.get(id(p), 0)
                    readers_seen[id(p)] = k + 1
                    copies[id(p), id(n)] = (  # every reader after the first computes its own copy
                        mapping[v]
                        if k == 0
                        else node(p.op, [mapping[u] for u in p.inputs], p.attrs, f"{p.name}_re{k}", p)
                    )
                    if k > 0:
                        made.add(id(copies[id(p), id(n)].producer))
                inputs.append(copies[id(p), id(n)])
                continue
            inputs.append(mapping[v])
        if id(n) in to_split:
            mapping[n.output] = matmul(inputs, n.attrs, n.name, n, True)
            continue
        mapping[n.output] = node(n.op, inputs, n.attrs, n.name, n)
    out = dce(b.build([mapping[v] for v in graph.outputs], validate=False))
    live = {id(n) for n in out.nodes}
    return out.validate(), {k: v for k, v in origin.items() if k in live}, made & live


def _emit_merged(
    b: GraphBuilder, s: SiblingSet, mapping: dict[Value, Value], node: Callable, matmul: Callable, split: bool
) -> None:
    mm0 = s.matmuls[0]
    axis = 0 if mm0.attrs["transpose_b"] else 1
    weights = [m.inputs[1].data for m in s.matmuls]
    if any(w is None for w in weights):
        raise ValueError(f"horizontal fusion {s.id}: a sibling's weight has no data")
    w = b.param(f"{mm0.name}.hcat_weight", np.concatenate(weights, axis=axis))
    out = matmul([mapping[mm0.inputs[0]], w], mm0.attrs, f"{mm0.name}_h", mm0, split)
    if s.adds:
        bias = b.param(f"{mm0.name}.hcat_bias", np.concatenate([v.data for v in s.biases]))
        add0 = s.adds[0]
        other = next((v.producer for v in add0.inputs if v is not mm0.output and v.producer), None)
        wide = node("broadcast_to", [bias], {"shape": out.shape}, None, other or add0)
        out = node("add", [out, wide], {}, f"{add0.name}_h", add0)
    start = 0
    rank = len(out.shape)
    for i, mm in enumerate(s.matmuls):
        tail = s.adds[i] if s.adds else mm
        attrs = {
            "starts": (0,) * (rank - 1) + (start,),
            "sizes": tuple(mm.output.shape),
            "steps": (1,) * rank,
        }
        mapping[tail.output] = node("slice", [out], attrs, f"{tail.name}_part", tail)
        start += mm.output.shape[-1]
