"""Constant folding: evaluate nodes whose inputs are all constants (params or scalar literals).

Scalar results become ``constant`` nodes; larger results become params. A node is not folded when that
would materialize more data than its constant inputs hold (``broadcast_to(0.5, [4096, 3072])`` stays
lazy, so the kernel computes it instead of reading 48 MiB)."""

from __future__ import annotations

import numpy as np

from compiler.builder import GraphBuilder
from compiler.graph import Graph, Node, Value
from compiler.ops import get_op
from compiler.passes.rewrite import rewrite


def _const_value(v: Value) -> np.ndarray | None:
    if v.kind == "param":
        return v.data
    if v.producer is not None and v.producer.op == "constant":
        return get_op("constant").reference(**v.producer.attrs)
    return None


def fold_constants(graph: Graph) -> Graph:
    def rule(b: GraphBuilder, node: Node, inputs: list[Value]) -> Value | None:
        if node.op == "constant" or not inputs:
            return None
        arrays = [_const_value(v) for v in inputs]
        if any(a is None for a in arrays):
            return None
        out_type = node.output.type
        if out_type.numel > max(1, sum(int(a.size) for a in arrays)):  # type: ignore[union-attr]
            return None
        result = np.asarray(get_op(node.op).reference(*arrays, **node.attrs)).astype(out_type.dtype)
        if out_type.shape == ():
            return b.constant(result.item(), out_type.dtype, name=node.name)
        return b.param(node.name, result)

    return rewrite(graph, rule)
