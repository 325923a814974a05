"""Kiln's graph IR: typed values, nodes that apply registered ops, and graphs.

A :class:`Graph` has ordered inputs, params (named constant tensors carried with the graph), nodes in
topological order and ordered outputs. Every node's output types come from its op's type inference
(``compiler.ops``), so a graph built through :class:`~compiler.builder.GraphBuilder` is typed by
construction and :meth:`Graph.validate` re-checks that invariant.

The canonical JSON (:meth:`Graph.canonical`) numbers values by a depth-first walk from the outputs, so
it ignores value names and the order in which independent nodes were added; :meth:`Graph.structural_hash`
is the sha256 of that JSON, stable across processes and runs.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler import dtypes
from compiler.canonical import canonical_hash, canonical_json
from compiler.errors import GraphError


@dataclass(frozen=True)
class TensorType:
    """A static shape and an element type."""

    shape: tuple[int, ...]
    dtype: str

    def __post_init__(self) -> None:
        shape = tuple(int(d) for d in self.shape)
        if any(d < 0 for d in shape):
            raise GraphError(f"negative dimension in shape {list(shape)}")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", dtypes.normalize_dtype(self.dtype))

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.numel * dtypes.DTYPES[self.dtype].itemsize

    def to_json(self) -> list[Any]:
        return [self.dtype, list(self.shape)]

    @staticmethod
    def from_json(data: Sequence[Any]) -> TensorType:
        return TensorType(tuple(data[1]), data[0])

    def __str__(self) -> str:
        return f"{dtypes.DTYPES[self.dtype].short}[{','.join(map(str, self.shape))}]"


_value_ids = itertools.count()


class Value:
    """A tensor in a graph: a graph input, a param (with data), or the output of a node."""

    __slots__ = ("_uid", "data", "index", "kind", "name", "producer", "type")

    def __init__(
        self,
        type: TensorType,
        kind: str,
        name: str | None = None,
        producer: Node | None = None,
        index: int = 0,
        data: np.ndarray | None = None,
    ) -> None:
        self.type = type
        self.kind = kind  # "input" | "param" | "node"
        self.name = name
        self.producer = producer
        self.index = index
        self.data = data
        self._uid = next(_value_ids)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> str:
        return self.type.dtype

    def __repr__(self) -> str:
        return f"Value({self.name or self._uid}: {self.type}, {self.kind})"


class Node:
    """One application of a registered op: ``outputs = op(inputs; attrs)``."""

    __slots__ = ("attrs", "inputs", "name", "op", "outputs")

    def __init__(self, op: str, inputs: Sequence[Value], attrs: dict[str, Any], name: str) -> None:
        self.op = op
        self.inputs = list(inputs)
        self.attrs = dict(attrs)
        self.name = name
        self.outputs: list[Value] = []

    @property
    def output(self) -> Value:
        if len(self.outputs) != 1:
            raise GraphError(f"node {self.name} ({self.op}) has {len(self.outputs)} outputs, not one")
        return self.outputs[0]

    def describe(self) -> str:
        return f"node '{self.name}' (op {self.op})"

    def __repr__(self) -> str:
        return f"Node({self.name}: {self.op})"


def attrs_to_json(attrs: dict[str, Any]) -> dict[str, Any]:
    """Attribute values as plain JSON data (tuples become lists, numpy scalars become numbers)."""

    def conv(v: Any) -> Any:
        if isinstance(v, (tuple, list)):
            return [conv(x) for x in v]
        if isinstance(v, np.generic):
            return v.item()
        if isinstance(v, float) and v != v:
            return "nan"
        if isinstance(v, float) and v in (float("inf"), float("-inf")):
            return "inf" if v > 0 else "-inf"
        return v

    return {k: conv(attrs[k]) for k in sorted(attrs)}


def _attrs_from_json(attrs: dict[str, Any]) -> dict[str, Any]:
    special = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}
    return {k: special.get(v, v) if isinstance(v, str) and k == "value" else v for k, v in attrs.items()}


class Graph:
    """A typed dataflow graph: inputs, params, nodes in topological order, outputs."""

    def __init__(
        self,
        name: str,
        inputs: Sequence[Value],
        params: Sequence[Value],
        nodes: Sequence[Node],
        outputs: Sequence[Value],
    ) -> None:
        self.name = name
        self.inputs = list(inputs)
        self.params = list(params)
        self.nodes = list(nodes)
        self.outputs = list(outputs)

    # ---------------------------------------------------------------- queries
    def consumers(self) -> dict[Value, list[Node]]:
        """Map each value to the nodes that read it (in node order)."""
        users: dict[Value, list[Node]] = {}
        for node in self.nodes:
            for v in node.inputs:
                users.setdefault(v, []).append(node)
        return users

    def values(self) -> Iterator[Value]:
        yield from self.inputs
        yield from self.params
        for node in self.nodes:
            yield from node.outputs

    def op_histogram(self) -> dict[str, int]:
        hist: dict[str, int] = {}
        for node in self.nodes:
            hist[node.op] = hist.get(node.op, 0) + 1
        return dict(sorted(hist.items()))

    # ------------------------------------------------------------- validation
    def validate(self) -> Graph:
        """Check the graph's invariants; raise GraphError naming the offending node or value."""
        from compiler.ops import get_op, infer_node

        defined: set[Value] = set()
        for v in self.inputs:
            if v.kind != "input":
                raise GraphError(f"graph {self.name}: input {v!r} is not an input value")
            if v in defined:
                raise GraphError(f"graph {self.name}: input {v.name} listed twice")
            defined.add(v)
        for p in self.params:
            if p.kind != "param" or p.data is None:
                raise GraphError(f"graph {self.name}: param {p!r} has no data")
            if tuple(p.data.shape) != p.shape or p.data.dtype != dtypes.to_numpy(p.dtype):
                raise GraphError(
                    f"graph {self.name}: param {p.name} data is {p.data.dtype}{list(p.data.shape)} "
                    f"but its type is {p.type}"
                )
            defined.add(p)
        names: set[str] = set()
        for node in self.nodes:
            get_op(node.op)  # raises UnknownOpError naming the op
            if node.name in names:
                raise GraphError(f"graph {self.name}: two nodes are named '{node.name}'")
            names.add(node.name)
            for i, v in enumerate(node.inputs):
                if v not in defined:
                    where = f"produced by {v.producer.describe()}" if v.producer else v.kind
                    raise GraphError(
                        f"{node.describe()}: input {i} ({v.name or v.type}) is not defined before the node "
                        f"({where}); the graph has a cycle or a dangling value"
                    )
            expected = infer_node(node.op, [v.type for v in node.inputs], node.attrs, node.name)
            got = [v.type for v in node.outputs]
            if expected != got:
                raise GraphError(
                    f"{node.describe()}: output types {[str(t) for t in got]} do not match inferred "
                    f"{[str(t) for t in expected]}"
                )
            for k, v in enumerate(node.outputs):
                if v.producer is not node or v.index != k:
                    raise GraphError(f"{node.describe()}: output {k} is not linked back to its node")
                if v in defined:
                    raise GraphError(f"{node.describe()}: output {k} is defined twice")
                defined.add(v)
        if not self.outputs:
            raise GraphError(f"graph {self.name} has no outputs")
        for i, v in enumerate(self.outputs):
            if v not in defined:
                raise GraphError(f"graph {self.name}: output {i} ({v!r}) is not defined in the graph")
        return self

    # ------------------------------------------------------ canonical / hash
    def canonical_order(self) -> tuple[list[Value], list[Node]]:
        """Params and nodes in the order of a depth-first walk from the outputs (inputs left to right)."""
        params: list[Value] = []
        order: list[Node] = []
        seen: set[int] = set()
        for out in self.outputs:
            stack: list[tuple[Value, bool]] = [(out, False)]
            while stack:
                v, expanded = stack.pop()
                node = v.producer
                if node is None:
                    if v.kind == "param" and id(v) not in seen:
                        seen.add(id(v))
                        params.append(v)
                    continue
                if id(node) in seen:
                    continue
                if expanded:
                    seen.add(id(node))
                    order.append(node)
                    continue
                stack.append((v, True))
                for inp in reversed(node.inputs):
                    stack.append((inp, False))
        return params, order

    def canonical(self) -> dict[str, Any]:
        """A JSON-able description of the graph's structure that ignores every name."""
        params, order = self.canonical_order()
        number: dict[Value, int] = {}
        for v in itertools.chain(self.inputs, params):
            number[v] = len(number)
        nodes = []
        for node in order:
            for v in node.outputs:
                number[v] = len(number)
            nodes.append(
                {
                    "op": node.op,
                    "in": [number[v] for v in node.inputs],
                    "attrs": attrs_to_json(node.attrs),
                    "out": [v.type.to_json() for v in node.outputs],
                }
            )
        return {
            "inputs": [v.type.to_json() for v in self.inputs],
            "params": [v.type.to_json() for v in params],
            "nodes": nodes,
            "outputs": [number[v] for v in self.outputs],
        }

    @staticmethod
    def from_canonical(data: dict[str, Any] | str, name: str = "graph") -> Graph:
        """Rebuild a graph from :meth:`canonical` output. Params come back as zero-filled tensors of
        their type (the canonical form carries structure, not weights), so this serves for workloads."""
        from compiler.builder import GraphBuilder

        if isinstance(data, str):
            data = json.loads(data)
        try:
            b = GraphBuilder(name)
            values: list[Value] = [b.input(f"in{i}", t[1], t[0]) for i, t in enumerate(data["inputs"])]
            for i, t in enumerate(data["params"]):
                tt = TensorType.from_json(t)
                values.append(b.param(f"param{i}", np.zeros(tt.shape, dtypes.to_numpy(tt.dtype))))
            for n in data["nodes"]:
                out = b.add_node(n["op"], [values[i] for i in n["in"]], _attrs_from_json(n["attrs"]))
                if out.type.to_json() != list(n["out"][0]):
                    raise GraphError(f"canonical node {n['op']} infers {out.type}, recorded {n['out'][0]}")
                values.append(out)
            return b.build([values[i] for i in data["outputs"]])
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise GraphError(f"malformed canonical graph JSON: {exc!r}") from None

    def canonical_json(self) -> str:
        return canonical_json(self.canonical())

    def structural_hash(self) -> str:
        return canonical_hash(self.canonical())

    def params_hash(self) -> str:
        """sha256 over the param values (in canonical order), for telling trained weights apart."""
        h = hashlib.sha256()
        for p in self.canonical_order()[0]:
            h.update(np.ascontiguousarray(p.data).tobytes())
        return h.hexdigest()

    # --------------------------------------------------------------- printing
    def __str__(self) -> str:
        from compiler.printer import print_graph

        return print_graph(self)

    def __repr__(self) -> str:
        return f"Graph({self.name}: {len(self.inputs)} inputs, {len(self.nodes)} nodes)"
