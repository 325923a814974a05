"""Horizontal fusion: sibling GEMMs that read the same A operand become one GEMM over concatenated weights.

Q/K/V projections (``x @ Wq^T + bq``, ``x @ Wk^T + bk``, ``x @ Wv^T + bv``) are three ``matmul`` nodes with
the same A, model-constant weights of the same K and the same transpose flags. Merged, they are one
``matmul(x, concat(Wq, Wk, Wv))`` — the weights (and, when every sibling has one, the bias vectors) are
concatenated at compile time into new params — followed by one ``slice`` per sibling along the output's
last axis. A slice is a layout op, so each one fuses as a strided view into its consumer's prologue
(Q/K/V's reshape/transpose into the attention ``batch_matmul``) or into its consumer's elementwise group:
the three outputs are never copied out of the merged buffer. Both backends compile the rewritten graph as
they compile any other, so the decision is a graph rewrite, not a sketch.

A sibling set is a :class:`compiler.fusion.FusionEdge` with rule ``horizontal`` and id ``h<a>_<b>[_<c>...]``
(the canonical numbers of its matmuls): the fusion plan turns it on or off like any other edge. The rules
leave it off (default False: today's behaviour); the plan search decides.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from compiler.builder import GraphBuilder
from compiler.graph import Graph, Node, Value


@dataclass(frozen=True)
class SiblingSet:
    """Matmuls sharing their A operand, in graph order; ``adds`` are their bias-add epilogues when every
    sibling has one (else empty)."""

    id: str
    matmuls: tuple[Node, ...]
    adds: tuple[Node, ...]
    biases: tuple[Value, ...]  # the bias vector ([N_i] params) of each add, when adds


def _weight_ok(v: Value, const: Callable[[Value], bool]) -> bool:
    return const(v) and len(v.shape) == 2


def _bias_of(add: Node, mm: Node, const: Callable[[Value], bool]) -> Value | None:
    """The [N] constant bias vector of ``add(mm, broadcast_to(bias))`` (either operand order)."""
    if add.op != "add" or len(add.inputs) != 2 or add.output.shape != mm.output.shape:
        return None
    other = add.inputs[1] if add.inputs[0] is mm.output else add.inputs[0]
    if other is mm.output:
        return None
    n = mm.output.shape[-1]
    if other.producer is not None and other.producer.op == "broadcast_to":
        other = other.producer.inputs[0]
    if const(other) and other.shape == (n,):
        return other
    return None


def sibling_sets(
    graph: Graph, numbers: dict[int, int], const: Callable[[Value], bool] | None = None
) -> list[SiblingSet]:
    """Every set of >= 2 ``matmul`` nodes with the same A, constant 2-D weights with the same K and flags,
    and the same dtype. ``numbers`` is the canonical node numbering (ids); ``const`` says which values are
    model constants (default: params)."""
    const = const or (lambda v: v.kind == "param")
    consumers = graph.consumers()
    outputs = set(graph.outputs)
    buckets: dict[tuple, list[Node]] = {}
    for n in graph.nodes:
        if n.op != "matmul" or id(n) not in numbers or n.attrs["transpose_a"]:
            continue
        w = n.inputs[1]
        if not _weight_ok(w, const) or w.dtype != n.inputs[0].dtype:
            continue
        k = w.shape[1] if n.attrs["transpose_b"] else w.shape[0]
        buckets.setdefault((id(n.inputs[0]), n.attrs["transpose_b"], k, w.dtype), []).append(n)
    sets = []
    for mms in buckets.values():
        if len(mms) < 2:
            continue
        mms.sort(key=lambda n: numbers[id(n)])
        adds, biases = [], []
        for mm in mms:
            users = consumers.get(mm.output, [])
            bias = _bias_of(users[0], mm, const) if len(users) == 1 and mm.output not in outputs else None
            if bias is None:
                adds, biases = [], []
                break
            adds.append(users[0])
            biases.append(bias)
        ident = "h" + "_".join(str(numbers[id(n)]) for n in mms)
        sets.append(SiblingSet(ident, tuple(mms), tuple(adds), tuple(biases)))
    return sets


def merge_siblings(graph: Graph, sets: list[SiblingSet]) -> tuple[Graph, dict[int, Node]]:
    """``graph`` with each sibling set merged into one GEMM (+ one bias add) and a slice per sibling.

    Returns the new graph and its origin map: id of each node of the new graph -> the node of ``graph``
    it copies or stands for (the merged matmul/add -> the first sibling's; sibling i's slice -> sibling i's
    last merged node). The input graph is left untouched; weights must be params with data."""
    b = GraphBuilder(graph.name)
    mapping: dict[Value, Value] = {}
    origin: dict[int, Node] = {}
    for v in graph.inputs:
        mapping[v] = b.input(v.name or "input", v.shape, v.dtype)
    for p in graph.params:
        mapping[p] = b.param(p.name or "param", p.data)  # type: ignore[arg-type]
    first = {id(s.matmuls[0]): s for s in sets}
    replaced = {id(n) for s in sets for n in (*s.matmuls, *s.adds)}

    def node(op: str, inputs: list[Value], attrs: dict, name: str | None, src: Node) -> Value:
        out = b.add_node(op, inputs, attrs, name)
        origin[id(out.producer)] = src
        return out

    for n in graph.nodes:
        s = first.get(id(n))
        if s is not None:
            _emit_merged(b, s, mapping, node)
            continue
        if id(n) in replaced:
            continue
        mapping[n.output] = node(n.op, [mapping[v] for v in n.inputs], n.attrs, n.name, n)
    merged = b.build([mapping[v] for v in graph.outputs], validate=False)
    from compiler.passes.dce import dce  # the siblings' bias broadcasts are left without a reader

    out = dce(merged)
    live = {id(n) for n in out.nodes}
    return out.validate(), {k: v for k, v in origin.items() if k in live}


def _emit_merged(b: GraphBuilder, s: SiblingSet, mapping: dict[Value, Value], node: Callable) -> None:
    mm0 = s.matmuls[0]
    axis = 0 if mm0.attrs["transpose_b"] else 1
    weights = [m.inputs[1].data for m in s.matmuls]
    if any(w is None for w in weights):
        raise ValueError(f"horizontal fusion {s.id}: a sibling's weight has no data")
    w = b.param(f"{mm0.name}.hcat_weight", np.concatenate(weights, axis=axis))
    out = node("matmul", [mapping[mm0.inputs[0]], w], mm0.attrs, f"{mm0.name}_h", mm0)
    if s.adds:
        bias = b.param(f"{mm0.name}.hcat_bias", np.concatenate([v.data for v in s.biases]))
        add0 = s.adds[0]
        other = next((v.producer for v in add0.inputs if v is not mm0.output and v.producer), None)
        wide = node("broadcast_to", [bias], {"shape": out.shape}, None, other or add0)
        out = node("add", [out, wide], {}, f"{s.adds[0].name}_h", s.adds[0])
    start = 0
    rank = len(out.shape)
    for i, mm in enumerate(s.matmuls):
        n_i = mm.output.shape[-1]
        tail = s.adds[i] if s.adds else mm
        attrs = {
            "starts": (0,) * (rank - 1) + (start,),
            "sizes": tuple(mm.output.shape),
            "steps": (1,) * rank,
        }
        mapping[tail.output] = node("slice", [out], attrs, f"{tail.name}_part", tail)
        start += n_i
