"""Export Kiln graphs to ONNX: ``export_onnx(graph)`` builds an equivalent ``onnx.ModelProto`` with
``onnx.helper``, and ``ort_session(graph)`` opens it in onnxruntime, the peer Kiln's benchmarks compare
against.

The model has the graph's inputs (static shapes, names sanitized), its params as initializers and its
outputs; every node keeps its Kiln name (helper nodes a composite expands to are named
``<kiln node>.<OnnxOp>``). Each op maps to the closest ONNX spelling at the requested opset:

- primitives map one to one where ONNX has the op (``rsqrt`` -> Reciprocal(Sqrt), ``silu`` -> x * Sigmoid,
  ``not_equal`` -> Not(Equal), ``matmul`` with transpose flags -> Gemm, ``batch_matmul`` with them ->
  Transpose + MatMul); ``slice`` turns Kiln's normalized starts/sizes/steps back into ONNX starts/ends.
  Where ONNX or onnxruntime's CPU kernels lack an integer type the export stays exact another way:
  integer ``relu`` -> Max(x, 0), uint8 ``neg`` -> 0 - x, int8/uint8 ``power``/``reduce_sum`` (and
  Add/Sub/Mul/Div before opset 14) in int32 cast back, int32/int64 ``max_pool2d`` and integer
  ``avg_pool2d`` as strided Slices of the padded input combined by Max or an int64 sum / window count;
- composites keep their ONNX op where there is one: softmax -> Softmax, log_softmax -> LogSoftmax,
  layer_norm -> LayerNormalization (opset 17+; before that the decomposed ReduceMean form), batch_norm ->
  BatchNormalization (channels on axis 1), reduce_mean -> ReduceMean, global_avg_pool2d ->
  GlobalAveragePool, leaky_relu/hard_sigmoid -> LeakyRelu/HardSigmoid, hard_swish -> HardSwish (14+),
  gelu -> Gelu (20+) or the erf / tanh formula, rms_norm -> RMSNormalization (23+) or the decomposed
  Pow/ReduceMean/Add/Sqrt/Div/Mul form exporters emit, linear -> Gemm(transB=1) for a 2-D input or
  MatMul with a transposed weight initializer (+ Add bias) otherwise;
- any other composite is exported through its Kiln decomposition, so every registered op exports.

These are the forms the ONNX importer (``compiler.frontend.onnx``) recognizes, so for the built-in zoo
``optimize(load_onnx(export_onnx(g)))`` hashes like ``optimize(g)``. A value with no elements becomes an
empty Constant (its contents are known: none).

``onnx`` and ``onnxruntime`` are imported lazily: importing this module does not import them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from compiler import dtypes
from compiler.errors import KilnError
from compiler.frontend.onnx_common import sanitize
from compiler.graph import Graph, Node, TensorType, Value
from compiler.ops import get_op

if TYPE_CHECKING:
    import onnx
    import onnxruntime

__all__ = ["MIN_OPSET", "OnnxExportError", "export_onnx", "ort_feeds", "ort_session"]

# Softmax's per-axis semantics and Squeeze/Unsqueeze/ReduceSum axes as inputs start at opset 13.
MIN_OPSET = 13
DEFAULT_OPSET = 17


class OnnxExportError(KilnError):
    """A graph that cannot be exported (an op with no ONNX form, an opset out of range)."""


def export_onnx(graph: Graph, opset: int = DEFAULT_OPSET) -> onnx.ModelProto:
    """An ONNX model equivalent to ``graph`` (default-domain ``opset``, 13 up to what the installed onnx
    knows), checked with ``onnx.checker.check_model``.

    Graph inputs keep their order and static shapes (names sanitized and made unique), params become
    initializers, outputs keep their order (a graph output that is an input, a param or a repeat of an
    earlier output goes through an Identity). Raises :class:`OnnxExportError` for an op with no export.
    """
    import onnx

    newest = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= opset <= newest:
        raise OnnxExportError(
            f"cannot export graph {graph.name} at opset {opset}: supported opsets are {MIN_OPSET}..{newest}"
        )
    graph.validate()
    model = _Exporter(graph, opset).run()
    onnx.checker.check_model(model)
    return model


def ort_session(
    graph: Graph, threads: int | None = None, opset: int = DEFAULT_OPSET
) -> onnxruntime.InferenceSession:
    """An onnxruntime CPU session running ``export_onnx(graph, opset)``: sequential execution, graph
    optimizations ORT_ENABLE_ALL, ``threads`` intra-op threads (None: onnxruntime's default, one per
    physical core). Its inputs are the graph's in order (see :func:`ort_feeds`)."""
    import onnxruntime as ort

    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise OnnxExportError(f"threads must be a positive integer or None, got {threads!r}")
    model = export_onnx(graph, opset)
    opts = ort.SessionOptions()
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads is not None:
        opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1  # sequential execution never uses the inter-op pool
    opts.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def ort_feeds(session: onnxruntime.InferenceSession, inputs: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """The feed dict for ``session.run`` from arrays in the Kiln graph's input order."""
    names = [i.name for i in session.get_inputs()]
    if len(names) != len(inputs):
        raise OnnxExportError(
            f"the session takes {len(names)} inputs ({', '.join(names)}), got {len(inputs)}"
        )
    return dict(zip(names, inputs))


# ---------------------------------------------------------------------------------------- the exporter
Handler = Callable[["_Exporter", Node, list[str], str], None]
_HANDLERS: dict[str, Handler] = {}


def _handles(*ops: str) -> Callable[[Handler], Handler]:
    def deco(fn: Handler) -> Handler:
        for op in ops:
            _HANDLERS[op] = fn
        return fn

    return deco


def _elem(dtype: str) -> int:
    from onnx import helper

    return int(helper.np_dtype_to_tensor_dtype(dtypes.to_numpy(dtype)))


def _value_info(name: str, t: TensorType) -> Any:
    from onnx import helper

    return helper.make_tensor_value_info(name, _elem(t.dtype), list(t.shape))


class _Exporter:
    """Export state: emitted nodes and initializers, the ONNX name of each Kiln value, the names taken."""

    def __init__(self, graph: Graph, opset: int) -> None:
        self.graph = graph
        self.opset = opset
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self.names: dict[Value, str] = {}
        self.taken: set[str] = set()
        self.scope = "node"
        self._consts: dict[tuple[str, tuple[int, ...], bytes], str] = {}
        self._transposed: dict[Value, str] = {}

    # ------------------------------------------------------------------ names and constants
    def fresh(self, base: str) -> str:
        """A value name not used yet, from ``base`` sanitized (``base``, ``base_1``, ``base_2`` ...)."""
        base = sanitize(base)
        name, k = base, 0
        while name in self.taken:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        return name

    def emit(self, op_type: str, inputs: Sequence[str], out: str | None = None, **attrs: Any) -> str:
        """Append an ONNX node (named after its output); returns the output name."""
        from onnx import helper

        if out is None:
            out = self.fresh(f"{self.scope}.{op_type}")
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out

    def const(self, arr: np.ndarray, base: str) -> str:
        """A small helper tensor as an initializer (shared between nodes when equal)."""
        from onnx import numpy_helper

        arr = np.ascontiguousarray(arr)
        key = (arr.dtype.str, tuple(arr.shape), arr.tobytes())
        if key not in self._consts:
            name = self.fresh(f"{self.scope}.{base}")
            self.initializers.append(numpy_helper.from_array(arr, name))
            self._consts[key] = name
        return self._consts[key]

    def ints(self, values: Sequence[int], base: str) -> str:
        return self.const(np.asarray(list(values), np.int64), base)

    def scalar(self, value: float | int | bool, dtype: str, base: str = "c") -> str:
        return self.const(np.asarray(value).astype(dtypes.to_numpy(dtype)), base)

    def cast(self, x: str, dtype: str, out: str | None = None) -> str:
        return self.emit("Cast", [x], out, to=_elem(dtype))

    def reduce(
        self, op_type: str, x: str, axes: Sequence[int], keepdims: bool, out: str | None = None
    ) -> str:
        """A reduction over ``axes`` (an input from opset 18, ReduceSum from 13; an attribute before)."""
        if not axes:  # a rank-0 input: nothing to reduce
            return self.emit("Identity", [x], out)
        if op_type == "ReduceSum" or self.opset >= 18:
            return self.emit(op_type, [x, self.ints(axes, "axes")], out, keepdims=int(keepdims))
        return self.emit(op_type, [x], out, axes=list(axes), keepdims=int(keepdims))

    def transposed_param(self, w: Value) -> str:
        """The transpose of a 2-D param as its own initializer (one per param)."""
        from onnx import numpy_helper

        if w not in self._transposed:
            name = self.fresh(f"{self.names[w]}.T")
            data = np.ascontiguousarray(np.asarray(w.data).T)
            self.initializers.append(numpy_helper.from_array(data, name))
            self._transposed[w] = name
        return self._transposed[w]

    # ----------------------------------------------------------------------------- driver
    def run(self) -> onnx.ModelProto:
        from onnx import helper, numpy_helper

        g = self.graph
        inputs = []
        for i, v in enumerate(g.inputs):
            self.names[v] = self.fresh(v.name or f"input{i}")
            inputs.append(_value_info(self.names[v], v.type))
        used = {v for n in g.nodes for v in n.inputs} | set(g.outputs)
        for i, p in enumerate(g.params):
            if p in used:
                self.names[p] = self.fresh(p.name or f"param{i}")
                self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(p.data), self.names[p]))
        for node in g.nodes:
            out = self.fresh(node.output.name or node.name)
            self.export_node(node, [self.names[v] for v in node.inputs], out)
        outputs, seen = [], set()
        for v in g.outputs:
            name = self.names[v]
            if v.kind != "node" or name in seen:
                self.scope = name
                name = self.emit("Identity", [name], self.fresh(f"{name}.output"))
            seen.add(name)
            outputs.append(_value_info(name, v.type))
        onnx_graph = helper.make_graph(
            self.nodes, sanitize(g.name, "kiln_graph"), inputs, outputs, self.initializers
        )
        opsets = [helper.make_opsetid("", self.opset)]
        return helper.make_model(
            onnx_graph,
            opset_imports=opsets,
            ir_version=helper.find_min_ir_version_for(opsets),
            producer_name="kiln",
            doc_string=f"Kiln graph {g.name}",
        )

    def export_node(self, node: Node, ins: list[str], out: str, scope: str | None = None) -> None:
        """Emit ONNX nodes computing ``node`` from the ONNX values ``ins`` into the value ``out``; helper
        values are named ``<scope>.<OnnxOp>`` (scope: the node's name)."""
        from onnx import numpy_helper

        saved, self.scope = self.scope, sanitize(scope or node.name)
        try:
            self.names[node.output] = out
            t = node.output.type
            if t.numel == 0:  # an empty result is known without its inputs
                empty = np.zeros(t.shape, dtypes.to_numpy(t.dtype))
                self.emit("Constant", [], out, value=numpy_helper.from_array(empty))
                return
            handler = _HANDLERS.get(node.op)
            if handler is not None:
                handler(self, node, ins, out)
            elif get_op(node.op).is_composite:
                self.export_decomposed(node, ins, out)
            else:
                raise OnnxExportError(f"{node.describe()}: no ONNX export for op '{node.op}'")
        finally:
            self.scope = saved

    def export_decomposed(self, node: Node, ins: list[str], out: str) -> None:
        """Export a composite through its Kiln decomposition into primitives."""
        from compiler.builder import GraphBuilder

        b = GraphBuilder(node.name)
        xs = [b.input(f"in{i}", v.shape, v.dtype) for i, v in enumerate(node.inputs)]
        y = get_op(node.op).decompose(b, *xs, **node.attrs)  # type: ignore[misc]
        sub = b.build([y])
        names: dict[Value, str] = dict(zip(xs, ins))
        for p in sub.params:
            names[p] = self.const(np.asarray(p.data), p.name or "param")
        for n in sub.nodes:
            scope = f"{self.scope}.{n.name}"
            n_out = out if n.output is y else self.fresh(scope)
            self.export_node(n, [names[v] for v in n.inputs], n_out, scope)
            names[n.output] = n_out
        if y.producer is None:  # the decomposition is one of its inputs
            self.emit("Identity", [names[y]], out)


# ------------------------------------------------------------------------------- elementwise ops
_UNARY = {
    "neg": "Neg",
    "abs": "Abs",
    "exp": "Exp",
    "log": "Log",
    "sqrt": "Sqrt",
    "reciprocal": "Reciprocal",
    "tanh": "Tanh",
    "erf": "Erf",
    "sigmoid": "Sigmoid",
    "relu": "Relu",
    "logical_not": "Not",
}
_BINARY = {
    "add": "Add",
    "subtract": "Sub",
    "multiply": "Mul",
    "divide": "Div",
    "power": "Pow",
    "maximum": "Max",
    "minimum": "Min",
    "equal": "Equal",
    "less": "Less",
    "less_equal": "LessOrEqual",
    "greater": "Greater",
    "greater_equal": "GreaterOrEqual",
    "logical_and": "And",
    "logical_or": "Or",
}
_SMALL_INTS = ("int8", "uint8")


@_handles(*_UNARY, "rsqrt", "silu")
def _unary(ex: _Exporter, node: Node, ins: list[str], out: str) -> None:
    (x,) = ins
    dtype = node.inputs[0].dtype
    if node.op == "rsqrt":
        ex.emit("Reciprocal", [ex.emit("Sqrt", [x])], out)
    elif node.op == "silu":
        ex.emit("Mul", [x, ex.emit("Sigmoid", [x])], out)
    elif node.op == "relu" and not dtypes.is_float(dtype):  # Relu has no int64/uint8 kernel
        ex.emit("Max", [x, ex.scalar(0, dtype, "zero")], out)
    elif node.op == "neg" and dtype == "uint8":  # Neg takes signed types only; 0 - x wraps like numpy
        _arith(ex, "Sub", [ex.scalar(0, dtype, "zero"), x], out, dtype)
    else:
        ex.emit(_UNARY[node.op], [x], out)


@_handles(*_BINARY, "not_equal")
def _binary(ex: _Exporter, node: Node, ins: list[str], out: str) -> None:
    dtype = node.inputs[0].dtype
    if node.op == "not_equal":
        ex.emit("Not", [ex.emit("Equal", ins)], out)
    elif node.op in ("less", "less_equal", "greater", "greater_equal") and dtype == "bool":
        ex.emit(_BINARY[node.op], [ex.cast(x, "uint8") for x in ins], out)  # order False < True
    else:
        _arith(ex, _BINARY[node.op], ins, out, dtype)


def _arith(ex: _Exporter, op_type: str, ins: list[str], out: str, dtype: str) -> None:
    """``op_type`` on ``ins``; in int32 and cast back (wrapping as numpy's 8-bit arithmetic does) where
    ONNX takes no 8-bit ints: Pow always, Add/Sub/Mul/Div before opset 14."""
    widen = op_type == "Pow" or (op_type in ("Add", "Sub", "Mul", "Div") and ex.opset < 14)
    if dtype in _SMALL_INTS and widen:
        ex.cast(ex.emit(op_type, [ex.cast(x, "int32") for x in ins]), dtype, out)
    else:
        ex.emit(op_type, ins, out)


@_handles("where")
def _where(ex: _Exporter, node: Node, ins: list[str], out: str) -> None:
    ex.emit("Where", ins, out)


@_handles("cast")
def _cast(ex: _Exporter, node: Node, ins: list[str], out: str) -> None:
    ex.cast(ins[0], node.attrs["dtype"], out)


@_handles("constant")
def _constant(ex: _Exporter, node: Node, ins: list[str], out: str) -> None:
    from onnx import numpy_helper

    arr = np.asarray(node.attrs["value"]).astype(dtypes.to_numpy(node.attrs["dtype"]))
    ex.emit("Constant", [], out, value=numpy_helper.from_array(arr))


@_handles("leaky_relu")
def _leaky_relu(ex: _Exporter, node: Node, ins: list[str], out: str) -> None:
    ex.emit("LeakyRelu", ins, out, alpha=node.attrs["alpha"])


@_handles("hard_sigmoid")
def _hard_sigmoid(ex: _Exporter, node: Node, ins: list[str], out: str) -> None:
    ex.emit("HardSigmoid", ins, out, alpha=node.attrs["alpha"], beta=node.attrs["beta"])


@_handles("hard_swish")
def _hard_swish(ex: _Exporter, node: Node, ins: list[str], out: str) -> None:
    (x,) = ins
    if ex.opset >= 14:
        ex.emit("HardSwish", [x], out)
    else:  # how opset 13 spells it (the importer's hard_swish pattern)
        ex.emit("Mul", [x, ex.emit("HardSigmoid", [x], alpha=1 / 6, beta=0.5)], out)


@_handles("gelu")
def _gelu(ex: _Exporter, node: Node, ins: list[str], out: str) -> None:
    (x,) = ins
    approximate = node.attrs["approximate"]
    if ex.opset >= 20:
        ex.emit("Gelu", [x], out, approximate=approximate)
        return
    dtype = node.inputs[0].dtype

    def c(v: float, base: str) -> str:
        return ex.scalar(v, dtype, base)

    if approximate == "none":  # x * (1 + erf(x / sqrt(2))) * 0.5, torch's spelling (onnxruntime fuses it)
        inner = ex.emit("Erf", [ex.emit("Div", [x, c(math.sqrt(2.0), "sqrt2")])])
    else:  # 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))
        cube = ex.emit("Mul", [ex.emit("Mul", [x, x]), x])
        poly = ex.emit("Add", [x, ex.emit("Mul", [cube, c(0.044715, "k")])])
        inner = ex.emit("Tanh", [ex.emit("Mul", [poly, c(math.sqrt(2 / math.pi), "sqrt_2_pi")])])
    t = ex.emit("Mul", [x, ex.emit("Add", [inner, c(1.0, "one")])])
    ex.emit("Mul", [t, c(0.5, "half")], out)


# ------------------------------------------------------------------------------------ layout ops
@_handles("broadcast_to")
def _broadcast_to(ex: _Exporter, node: Node, ins: list[str], out: str) -> None:
    ex.emit("Expand", [ins[0], ex.ints(node.attrs["shape"], "shape")], out)


@_handles("reshape")
def _reshape(ex: _Exporter, node: Node, ins: list[str], out: str) -> None:
    # (no 0 in the shape: a reshape to an empty tensor is exported as an empty constant)
    ex.emit("Reshape", [ins[0], ex.ints(node.attrs["shape"], "shape")], out)


@_handles("transpose")
def _transpose(ex: _Exporter, node: Node, ins: list[str], out: str) -> None:
    ex.emit("Transpose", ins, out, perm=list(node.attrs["perm"]))


@_handles("expand_dims", "squeeze")
def _unsqueeze(ex: _Exporter, node: Node, ins: list[str], out: str) -> None:
    axes = node.attrs["axes"]
    if not axes:
        ex.emit("Identity", ins, out)
        return
    op_type = "Unsqueeze" if node.op == "expand_dims" else "Squeeze"
    ex.emit(op_type, [ins[0], ex.ints(axes, "axes")], out)


@_handles("concat")
def _concat(ex: _Exporter, node: Node, ins: list[str], out: str) -> None:
    ex.emit("Concat", ins, out, axis=node.attrs["axis"])


def slice_bounds(
    shape: Sequence[int], starts: Sequence[int], sizes: Sequence[int], steps: Sequence[int]
) -> tuple[list[int], list[int], list[int], list[int]]:
    """ONNX Slice (starts, ends, axes, steps) for Kiln's full-rank (starts, sizes, steps), leaving out
    axes taken whole. A negative step that runs past index 0 ends at -dim-1 (ONNX clamps it to 'before
    the first element')."""
    o_starts, o_ends, o_axes, o_steps = [], [], [], []
    for axis, (dim, s, n, st) in enumerate(zip(shape, starts, sizes, steps)):
        if st == 1 and s == 0 and n == dim:
            continue
        end = s + n * st
        if st > 0:
            end = min(end, dim)
        elif end < 0:
            end = -dim - 1
        o_starts.append(s)
        o_ends.append(end)
        o_axes.append(axis)
        o_steps.append(st)
    return o_starts, o_ends, o_axes, o_steps


@_handles("slice")
def _slice(ex: _Exporter, node: Node, ins: list[str], out: str) -> None:
    a = node.attrs
    starts, ends, axes, steps = slice_bounds(node.inputs[0].shape, a["starts"], a["sizes"], a["steps"])
    if not axes:
        ex.emit("Identity", ins, out)
        return
    args = [ex.ints(starts, "starts"), ex.ints(ends, "ends"), ex.ints(axes, "axes"), ex.ints(steps, "steps")]
    ex.emit("Slice", [ins[0], *args], out)


@_handles("pad")
def _pad(ex: _Exporter, node: Node, ins: list[str], out: str) -> None:
    dtype = node.inputs[0].dtype
    value = np.asarray(node.attrs["value"], np.float64).astype(dtypes.to_numpy(dtype))
    ex.emit(
        "Pad", [ins[0], ex.ints(node.attrs["pads"], "pads"), ex.const(value, "value")], out, mode="constant"
    )


@_handles("gather")
def _gather(ex: _Exporter, node: Node, ins: list[str], out: str) -> None:
    ex.emit("Gather", ins, out, axis=node.attrs["axis"])


# -------------------------------------------------------------------------------- reductions
_REDUCE = {
    "reduce_sum": "ReduceSum",
    "reduce_max": "ReduceMax",
    "reduce_min": "ReduceMin",
    "reduce_mean": "ReduceMean",
}


@_handles(*_REDUCE)
def _reduce(ex: _Exporter, node: Node, ins: list[str], out: str) -> None:
    axes, keep = node.attrs["axes"], node.attrs["keepdims"]
    dtype = node.inputs[0].dtype
    if node.op == "reduce_sum" and dtype in _SMALL_INTS:  # no 8-bit ReduceSum kernel; int32 wraps alike
        ex.cast(ex.reduce("ReduceSum", ex.cast(ins[0], "int32"), axes, keep), dtype, out)
        return
    ex.reduce(_REDUCE[node.op], ins[0], axes, keep, out)


@_handles("softmax", "log_softmax")
def _softmax(ex: _Exporter, node: Node, ins: list[str], out: str) -> None:
    ex.emit("Softmax" if node.op == "softmax" else "LogSoftmax", ins, out, axis=node.attrs["axis"])


# -------------------------------------------------------------------------------- normalization
@_handles("layer_norm")
def _layer_norm(ex: _Exporter, node: Node, ins: list[str], out: str) -> None:
    x, gamma, beta = ins
    axis, eps = node.attrs["axis"], node.attrs["eps"]
    if ex.opset >= 17:
        ex.emit("LayerNormalization", ins, out, axis=axis, epsilon=eps)
        return
    # the decomposed form exporters emit before opset 17 (the importer's layer_norm pattern)
    axes = list(range(axis, node.inputs[0].type.rank))
    dtype = node.inputs[0].dtype
    d = ex.emit("Sub", [x, ex.reduce("ReduceMean", x, axes, True)])
    var = ex.reduce("ReduceMean", ex.emit("Mul", [d, d]), axes, True)
    std = ex.emit("Sqrt", [ex.emit("Add", [var, ex.scalar(eps, dtype, "eps")])])
    y = ex.emit("Mul", [ex.emit("Div", [d, std]), gamma])
    ex.emit("Add", [y, beta], out)


@_handles("rms_norm")
def _rms_norm(ex: _Exporter, node: Node, ins: list[str], out: str) -> None:
    x, weight = ins
    axis, eps = node.attrs["axis"], node.attrs["eps"]
    if ex.opset >= 23:
        ex.emit("RMSNormalization", ins, out, axis=axis, epsilon=eps)
        return
    # x / sqrt(mean(x^2) + eps) * weight, as torch exports it (the importer's rms_norm pattern)
    axes = list(range(axis, node.inputs[0].type.rank))
    dtype = node.inputs[0].dtype
    ms = ex.reduce("ReduceMean", ex.emit("Pow", [x, ex.scalar(2.0, dtype, "two")]), axes, True)
    std = ex.emit("Sqrt", [ex.emit("Add", [ms, ex.scalar(eps, dtype, "eps")])])
    ex.emit("Mul", [ex.emit("Div", [x, std]), weight], out)


@_handles("batch_norm")
def _batch_norm(ex: _Exporter, node: Node, ins: list[str], out: str) -> None:
    if node.attrs["axis"] != 1:  # BatchNormalization keeps channels on axis 1
        ex.export_decomposed(node, ins, out)
        return
    ex.emit("BatchNormalization", ins, out, epsilon=node.attrs["eps"])


# ------------------------------------------------------------------------------ contractions
@_handles("matmul")
def _matmul(ex: _Exporter, node: Node, ins: list[str], out: str) -> None:
    ta, tb = node.attrs["transpose_a"], node.attrs["transpose_b"]
    if node.inputs[0].type.rank == 2 and (ta or tb):
        ex.emit("Gemm", ins, out, transA=int(ta), transB=int(tb))
    elif tb and node.inputs[1].kind == "param" and not ta:  # A may have leading dims: MatMul with W^T
        ex.emit("MatMul", [ins[0], ex.transposed_param(node.inputs[1])], out)
    else:
        _batch_matmul(ex, node, ins, out)


def _swap_last(rank: int) -> list[int]:
    return [*range(rank - 2), rank - 1, rank - 2]


@_handles("batch_matmul")
def _batch_matmul(ex: _Exporter, node: Node, ins: list[str], out: str) -> None:
    a, b = ins
    if node.attrs["transpose_a"]:
        a = ex.emit("Transpose", [a], perm=_swap_last(node.inputs[0].type.rank))
    if node.attrs["transpose_b"]:
        b = ex.emit("Transpose", [b], perm=_swap_last(node.inputs[1].type.rank))
    ex.emit("MatMul", [a, b], out)


@_handles("linear")
def _linear(ex: _Exporter, node: Node, ins: list[str], out: str) -> None:
    x, w = node.inputs[0], node.inputs[1]
    if x.type.rank == 2:  # y = x W^T + b in one Gemm
        ex.emit("Gemm", ins, out, transB=1)
        return
    wt = ex.transposed_param(w) if w.kind == "param" else ex.emit("Transpose", [ins[1]], perm=[1, 0])
    if len(ins) == 2:
        ex.emit("MatMul", [ins[0], wt], out)
    else:
        ex.emit("Add", [ex.emit("MatMul", [ins[0], wt]), ins[2]], out)


@_handles("conv2d")
def _conv2d(ex: _Exporter, node: Node, ins: list[str], out: str) -> None:
    a = node.attrs
    ex.emit(
        "Conv",
        ins,
        out,
        kernel_shape=list(node.inputs[1].shape[2:]),
        strides=list(a["strides"]),
        pads=list(a["padding"]),  # (top, left, bottom, right) is ONNX's [h_begin, w_begin, h_end, w_end]
        dilations=list(a["dilation"]),
        group=a["groups"],
    )


# ----------------------------------------------------------------------------------- pooling
def _pool_attrs(node: Node) -> dict[str, list[int]]:
    a = node.attrs
    return {"kernel_shape": list(a["kernel"]), "strides": list(a["strides"]), "pads": list(a["padding"])}


def _windows(ex: _Exporter, node: Node, x: str, dtype: str, fill: int) -> list[str]:
    """One strided Slice of the padded input per kernel offset (the windows' elements), for integer
    pooling: MaxPool takes no 32/64-bit ints and AveragePool no ints at all. ``x`` is of ``dtype``; the
    padding holds ``fill``."""
    (kh, kw), (sh, sw) = node.attrs["kernel"], node.attrs["strides"]
    pt, pl, pb, pr = node.attrs["padding"]
    if any((pt, pl, pb, pr)):
        pads = ex.ints([0, 0, pt, pl, 0, 0, pb, pr], "pads")
        x = ex.emit("Pad", [x, pads, ex.scalar(fill, dtype, "fill")], mode="constant")
    oh, ow = node.output.shape[2:]
    axes, steps = ex.ints([2, 3], "axes"), ex.ints([sh, sw], "steps")
    out = []
    for i in range(kh):
        for j in range(kw):
            starts = ex.ints([i, j], "starts")
            ends = ex.ints([i + (oh - 1) * sh + 1, j + (ow - 1) * sw + 1], "ends")
            out.append(ex.emit("Slice", [x, starts, ends, axes, steps]))
    return out


@_handles("max_pool2d")
def _max_pool(ex: _Exporter, node: Node, ins: list[str], out: str) -> None:
    dtype = node.inputs[0].dtype
    if dtype in ("int32", "int64"):  # exact: the max of the windows' slices (padding is the type's min)
        windows = _windows(ex, node, ins[0], dtype, int(np.iinfo(dtypes.to_numpy(dtype)).min))
        ex.emit("Max" if len(windows) > 1 else "Identity", windows, out)
        return
    ex.emit("MaxPool", ins, out, **_pool_attrs(node))


@_handles("avg_pool2d")
def _avg_pool(ex: _Exporter, node: Node, ins: list[str], out: str) -> None:
    include_pad = node.attrs["count_include_pad"]
    dtype = node.inputs[0].dtype
    if dtypes.is_float(dtype):
        ex.emit("AveragePool", ins, out, **_pool_attrs(node), count_include_pad=int(include_pad))
        return
    # integers: an exact int64 window sum, divided (truncating, as the reference's cast) by the count
    total = None
    for w in _windows(ex, node, ex.cast(ins[0], "int64"), "int64", 0):
        total = w if total is None else ex.emit("Add", [total, w])
    (kh, kw), (sh, sw) = node.attrs["kernel"], node.attrs["strides"]
    pt, pl, pb, pr = node.attrs["padding"]
    if include_pad:
        count = np.asarray(kh * kw, np.int64)
    else:  # real (unpadded) elements per window, known from the shapes
        h, w = node.inputs[0].shape[2:]
        ones = np.pad(np.ones((h, w), np.int64), ((pt, pb), (pl, pr)))
        win = np.lib.stride_tricks.sliding_window_view(ones, (kh, kw))[::sh, ::sw]
        count = win.sum(axis=(-2, -1)).reshape(1, 1, *node.output.shape[2:])
    ex.cast(ex.emit("Div", [total, ex.const(count, "count")]), dtype, out)


@_handles("global_avg_pool2d")
def _global_avg_pool(ex: _Exporter, node: Node, ins: list[str], out: str) -> None:
    ex.emit("GlobalAveragePool", ins, out)
