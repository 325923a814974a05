"""GraphBuilder: construct typed graphs with one method per op.

    b = GraphBuilder("softmax")
    x = b.input("x", (64, 128))
    g = b.build([b.softmax(x, axis=-1)])

Every method normalizes attributes and runs type inference at once, so a bad shape fails at the line
that made it, with a message naming the node, the op and the offending types.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from compiler import dtypes
from compiler.errors import GraphError
from compiler.graph import Graph, Node, TensorType, Value
from compiler.ops import get_op, infer_node, normalize_attrs
from compiler.ops.layout import slice_params
from compiler.ops.registry import OpTypeError

Operand = Value | float | int | bool


class GraphBuilder:
    """Builds a :class:`Graph` node by node; :meth:`build` validates and returns it."""

    def __init__(self, name: str = "graph") -> None:
        self.name = name
        self.inputs: list[Value] = []
        self.params: list[Value] = []
        self.nodes: list[Node] = []
        self._names: dict[str, int] = {}
        self._node_names: set[str] = set()

    # ----------------------------------------------------------- graph edges
    def input(self, name: str, shape: Sequence[int], dtype: str = "float32") -> Value:
        v = Value(TensorType(tuple(shape), dtype), "input", name)
        self.inputs.append(v)
        return v

    def param(self, name: str, data: np.ndarray) -> Value:
        data = np.ascontiguousarray(data)
        v = Value(TensorType(data.shape, dtypes.normalize_dtype(data.dtype)), "param", name, data=data)
        self.params.append(v)
        return v

    def build(self, outputs: Sequence[Value], validate: bool = True) -> Graph:
        used = {v for n in self.nodes for v in n.inputs} | set(outputs)
        params = [p for p in self.params if p in used]
        graph = Graph(self.name, self.inputs, params, self.nodes, outputs)
        return graph.validate() if validate else graph

    def _unique(self, base: str) -> str:
        while True:
            k = self._names.get(base, 0)
            self._names[base] = k + 1
            name = base if k == 0 and base not in self._node_names else f"{base}_{k}"
            if name not in self._node_names:
                self._node_names.add(name)
                return name

    def add_node(
        self, op: str, inputs: Sequence[Value], attrs: dict[str, Any] | None = None, name: str | None = None
    ) -> Value:
        """Add a node applying ``op``; returns its output value."""
        for i, v in enumerate(inputs):
            if not isinstance(v, Value):
                raise GraphError(f"{op}: input {i} is {type(v).__name__}, not a graph Value")
        node_name = self._unique(name or op)
        types = [v.type for v in inputs]
        attrs = normalize_attrs(op, types, attrs or {}, node_name)
        (out_type,) = infer_node(op, types, attrs, node_name)
        node = Node(op, inputs, attrs, node_name)
        node.outputs = [Value(out_type, "node", node_name, node, 0)]
        self.nodes.append(node)
        return node.outputs[0]

    def apply(self, op: str, *inputs: Operand, name: str | None = None, **attrs: Any) -> Value:
        """Generic form of the per-op methods; composites are kept as single nodes."""
        values = self._operands(op, inputs)
        return self.add_node(op, values, attrs, name)

    def _operands(self, op: str, inputs: Sequence[Operand]) -> list[Value]:
        like = next((v for v in inputs if isinstance(v, Value)), None)
        out = []
        for v in inputs:
            if isinstance(v, Value):
                out.append(v)
            elif isinstance(v, (bool, int, float, np.number, np.bool_)):
                dtype = like.dtype if like is not None else ("bool" if isinstance(v, bool) else "float32")
                out.append(self.constant(v, dtype))
            else:
                raise GraphError(f"{op}: cannot use {type(v).__name__} {v!r} as an input")
        return out

    # --------------------------------------------------------------- unary
    def neg(self, x: Value, name: str | None = None) -> Value:
        return self.apply("neg", x, name=name)

    def abs(self, x: Value, name: str | None = None) -> Value:
        return self.apply("abs", x, name=name)

    def exp(self, x: Value, name: str | None = None) -> Value:
        return self.apply("exp", x, name=name)

    def log(self, x: Value, name: str | None = None) -> Value:
        return self.apply("log", x, name=name)

    def sqrt(self, x: Value, name: str | None = None) -> Value:
        return self.apply("sqrt", x, name=name)

    def rsqrt(self, x: Value, name: str | None = None) -> Value:
        return self.apply("rsqrt", x, name=name)

    def reciprocal(self, x: Value, name: str | None = None) -> Value:
        return self.apply("reciprocal", x, name=name)

    def tanh(self, x: Value, name: str | None = None) -> Value:
        return self.apply("tanh", x, name=name)

    def erf(self, x: Value, name: str | None = None) -> Value:
        return self.apply("erf", x, name=name)

    def sigmoid(self, x: Value, name: str | None = None) -> Value:
        return self.apply("sigmoid", x, name=name)

    def relu(self, x: Value, name: str | None = None) -> Value:
        return self.apply("relu", x, name=name)

    def silu(self, x: Value, name: str | None = None) -> Value:
        return self.apply("silu", x, name=name)

    def logical_not(self, x: Value, name: str | None = None) -> Value:
        return self.apply("logical_not", x, name=name)

    def leaky_relu(self, x: Value, alpha: float = 0.01, name: str | None = None) -> Value:
        return self.apply("leaky_relu", x, alpha=alpha, name=name)

    def hard_sigmoid(self, x: Value, alpha: float = 0.2, beta: float = 0.5, name: str | None = None) -> Value:
        return self.apply("hard_sigmoid", x, alpha=alpha, beta=beta, name=name)

    def hard_swish(self, x: Value, name: str | None = None) -> Value:
        return self.apply("hard_swish", x, name=name)

    def gelu(self, x: Value, approximate: str = "none", name: str | None = None) -> Value:
        return self.apply("gelu", x, approximate=approximate, name=name)

    def cast(self, x: Value, dtype: str, name: str | None = None) -> Value:
        return self.apply("cast", x, dtype=dtype, name=name)

    def constant(self, value: float | int | bool, dtype: str = "float32", name: str | None = None) -> Value:
        if isinstance(value, (np.number, np.bool_)):
            value = value.item()
        return self.add_node("constant", [], {"value": value, "dtype": dtype}, name)

    # -------------------------------------------------------------- binary
    def add(self, a: Operand, b: Operand, name: str | None = None) -> Value:
        return self.apply("add", a, b, name=name)

    def subtract(self, a: Operand, b: Operand, name: str | None = None) -> Value:
        return self.apply("subtract", a, b, name=name)

    def multiply(self, a: Operand, b: Operand, name: str | None = None) -> Value:
        return self.apply("multiply", a, b, name=name)

    def divide(self, a: Operand, b: Operand, name: str | None = None) -> Value:
        return self.apply("divide", a, b, name=name)

    def power(self, a: Operand, b: Operand, name: str | None = None) -> Value:
        return self.apply("power", a, b, name=name)

    def maximum(self, a: Operand, b: Operand, name: str | None = None) -> Value:
        return self.apply("maximum", a, b, name=name)

    def minimum(self, a: Operand, b: Operand, name: str | None = None) -> Value:
        return self.apply("minimum", a, b, name=name)

    sub, mul, div, pow = subtract, multiply, divide, power

    def equal(self, a: Operand, b: Operand, name: str | None = None) -> Value:
        return self.apply("equal", a, b, name=name)

    def not_equal(self, a: Operand, b: Operand, name: str | None = None) -> Value:
        return self.apply("not_equal", a, b, name=name)

    def less(self, a: Operand, b: Operand, name: str | None = None) -> Value:
        return self.apply("less", a, b, name=name)

    def less_equal(self, a: Operand, b: Operand, name: str | None = None) -> Value:
        return self.apply("less_equal", a, b, name=name)

    def greater(self, a: Operand, b: Operand, name: str | None = None) -> Value:
        return self.apply("greater", a, b, name=name)

    def greater_equal(self, a: Operand, b: Operand, name: str | None = None) -> Value:
        return self.apply("greater_equal", a, b, name=name)

    def logical_and(self, a: Value, b: Value, name: str | None = None) -> Value:
        return self.apply("logical_and", a, b, name=name)

    def logical_or(self, a: Value, b: Value, name: str | None = None) -> Value:
        return self.apply("logical_or", a, b, name=name)

    def where(self, cond: Value, a: Operand, b: Operand, name: str | None = None) -> Value:
        values = self._operands("where", [a, b])
        return self.add_node("where", [cond, *values], {}, name)

    # -------------------------------------------------------------- layout
    def broadcast_to(self, x: Value, shape: Sequence[int], name: str | None = None) -> Value:
        return self.apply("broadcast_to", x, shape=tuple(shape), name=name)

    def reshape(self, x: Value, shape: Sequence[int], name: str | None = None) -> Value:
        return self.apply("reshape", x, shape=tuple(shape), name=name)

    def transpose(self, x: Value, perm: Sequence[int] | None = None, name: str | None = None) -> Value:
        return self.apply("transpose", x, perm=perm, name=name)

    def expand_dims(self, x: Value, axes: Sequence[int] | int, name: str | None = None) -> Value:
        return self.apply("expand_dims", x, axes=axes, name=name)

    def squeeze(self, x: Value, axes: Sequence[int] | int | None = None, name: str | None = None) -> Value:
        return self.apply("squeeze", x, axes=axes, name=name)

    def concat(self, xs: Sequence[Value], axis: int = 0, name: str | None = None) -> Value:
        return self.add_node("concat", list(xs), {"axis": axis}, name)

    def slice(
        self,
        x: Value,
        starts: Sequence[int],
        ends: Sequence[int],
        axes: Sequence[int] | None = None,
        steps: Sequence[int] | None = None,
        name: str | None = None,
    ) -> Value:
        """Python-style slicing (negative indices and steps allowed) on the given axes."""
        try:
            attrs = slice_params(x.shape, starts, ends, axes, steps)
        except OpTypeError as exc:
            raise GraphError(f"slice of {x.type}: {exc}") from None
        return self.add_node("slice", [x], attrs, name)

    def pad(self, x: Value, pads: Sequence[int], value: float = 0.0, name: str | None = None) -> Value:
        return self.apply("pad", x, pads=tuple(pads), value=value, name=name)

    def gather(self, data: Value, indices: Value, axis: int = 0, name: str | None = None) -> Value:
        return self.add_node("gather", [data, indices], {"axis": axis}, name)

    # ---------------------------------------------------------- reductions
    def reduce_sum(
        self,
        x: Value,
        axes: Sequence[int] | int | None = None,
        keepdims: bool = False,
        name: str | None = None,
    ) -> Value:
        return self.apply("reduce_sum", x, axes=axes, keepdims=keepdims, name=name)

    def reduce_max(
        self,
        x: Value,
        axes: Sequence[int] | int | None = None,
        keepdims: bool = False,
        name: str | None = None,
    ) -> Value:
        return self.apply("reduce_max", x, axes=axes, keepdims=keepdims, name=name)

    def reduce_min(
        self,
        x: Value,
        axes: Sequence[int] | int | None = None,
        keepdims: bool = False,
        name: str | None = None,
    ) -> Value:
        return self.apply("reduce_min", x, axes=axes, keepdims=keepdims, name=name)

    def reduce_mean(
        self,
        x: Value,
        axes: Sequence[int] | int | None = None,
        keepdims: bool = False,
        name: str | None = None,
    ) -> Value:
        return self.apply("reduce_mean", x, axes=axes, keepdims=keepdims, name=name)

    # -------------------------------------------------------- contractions
    def matmul(
        self,
        a: Value,
        b: Value,
        transpose_a: bool = False,
        transpose_b: bool = False,
        name: str | None = None,
    ) -> Value:
        return self.apply("matmul", a, b, transpose_a=transpose_a, transpose_b=transpose_b, name=name)

    def batch_matmul(
        self,
        a: Value,
        b: Value,
        transpose_a: bool = False,
        transpose_b: bool = False,
        name: str | None = None,
    ) -> Value:
        return self.apply("batch_matmul", a, b, transpose_a=transpose_a, transpose_b=transpose_b, name=name)

    def conv2d(
        self,
        x: Value,
        w: Value,
        strides: Sequence[int] = (1, 1),
        padding: Sequence[int] = (0, 0),
        dilation: Sequence[int] = (1, 1),
        groups: int = 1,
        name: str | None = None,
    ) -> Value:
        return self.apply(
            "conv2d", x, w, strides=strides, padding=padding, dilation=dilation, groups=groups, name=name
        )

    def max_pool2d(
        self,
        x: Value,
        kernel: Sequence[int],
        strides: Sequence[int] | None = None,
        padding: Sequence[int] = (0, 0),
        name: str | None = None,
    ) -> Value:
        return self.apply("max_pool2d", x, kernel=kernel, strides=strides, padding=padding, name=name)

    def avg_pool2d(
        self,
        x: Value,
        kernel: Sequence[int],
        strides: Sequence[int] | None = None,
        padding: Sequence[int] = (0, 0),
        count_include_pad: bool = False,
        name: str | None = None,
    ) -> Value:
        return self.apply(
            "avg_pool2d",
            x,
            kernel=kernel,
            strides=strides,
            padding=padding,
            count_include_pad=count_include_pad,
            name=name,
        )

    def global_avg_pool2d(self, x: Value, name: str | None = None) -> Value:
        return self.apply("global_avg_pool2d", x, name=name)

    # ---------------------------------------------------------- composites
    def softmax(self, x: Value, axis: int = -1, name: str | None = None) -> Value:
        return self.apply("softmax", x, axis=axis, name=name)

    def log_softmax(self, x: Value, axis: int = -1, name: str | None = None) -> Value:
        return self.apply("log_softmax", x, axis=axis, name=name)

    def layer_norm(
        self, x: Value, gamma: Value, beta: Value, axis: int = -1, eps: float = 1e-5, name: str | None = None
    ) -> Value:
        return self.apply("layer_norm", x, gamma, beta, axis=axis, eps=eps, name=name)

    def rms_norm(
        self, x: Value, weight: Value, axis: int = -1, eps: float = 1e-6, name: str | None = None
    ) -> Value:
        return self.apply("rms_norm", x, weight, axis=axis, eps=eps, name=name)

    def linear(self, x: Value, weight: Value, bias: Value | None = None, name: str | None = None) -> Value:
        inputs = [x, weight] if bias is None else [x, weight, bias]
        return self.add_node("linear", inputs, {}, name)

    def batch_norm(
        self,
        x: Value,
        gamma: Value,
        beta: Value,
        mean: Value,
        var: Value,
        axis: int = 1,
        eps: float = 1e-5,
        name: str | None = None,
    ) -> Value:
        return self.add_node("batch_norm", [x, gamma, beta, mean, var], {"axis": axis, "eps": eps}, name)


def check_builder_covers_registry() -> list[str]:
    """Names of registered ops that have no GraphBuilder method (used by a test)."""
    from compiler.ops import all_ops

    return [op.name for op in all_ops() if not callable(getattr(GraphBuilder, op.name, None))]


__all__ = ["GraphBuilder", "check_builder_covers_registry", "get_op"]
