"""Horizontal fusion: sibling GEMMs that read the same A operand become one GEMM over concatenated weights.

Q/K/V projections (``x @ Wq^T + bq``, ``x @ Wk^T + bk``, ``x @ Wv^T + bv``) are three ``matmul`` nodes with
the same A, model-constant weights of the same K and the same transpose flags. Merged, they are one
``matmul(x, concat(Wq, Wk, Wv))`` — the weights (and, when every sibling has one, the bias vectors) are
concatenated at compile time into new params — followed by one ``slice`` per sibling along the output's
last axis. A slice is a layout op, so each one fuses as a strided view into its consumer's prologue
(Q/K/V's reshape/transpose into the attention ``batch_matmul``) or into its consumer's elementwise group:
the three outputs are never copied out of the merged buffer. Both backends compile the rewritten graph
(:func:`compiler.plan_rewrite.rewrite_for_plan`) as they compile any other: a graph rewrite, not a sketch.

A sibling set is a :class:`compiler.fusion.FusionEdge` with rule ``horizontal`` and id ``h<a>_<b>[_<c>...]``
(the canonical numbers of its matmuls): the fusion plan turns it on or off like any other edge. The rules
leave it off (default False: today's behaviour); the plan search decides.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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
