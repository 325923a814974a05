"""The ONNX importer: ``load_onnx(path)`` turns an ONNX model into a static-shaped Kiln :class:`Graph`.

Steps (each failure is an :class:`OnnxImportError` naming the file and what is wrong):

1. read and check the file (``onnx_load``): parse, opsets 13..21, undefined values, cycles, every
   unsupported node listed at once, dynamic input dims resolved from ``input_shapes``, the onnx checker,
   strict ONNX shape inference;
2. convert node by node (converters in ``onnx_ops`` and ``onnx_nn``). A node whose inputs are all known at
   import time (initializers, constants, shapes) is evaluated with ``onnx.reference`` instead, so
   shape-computation subgraphs (Shape, Gather, Concat, Range, ConstantOfShape, Cast ...) fold away;
   size-1 constants in broadcasting ops become scalar ``constant`` nodes, larger ones params;
3. recognize exported patterns (``onnx_patterns``): erf/tanh GELU, decomposed LayerNorm and RMSNorm, SiLU,
   linear bias, attention scaling and transposes, so the graph is the one the GraphBuilder composites
   would make.

``onnx`` is imported lazily: importing :mod:`compiler` never imports it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from compiler.errors import KilnError
from compiler.frontend.onnx_common import (
    CONVERTERS,
    NEVER_FOLD,
    ImportBuilder,
    OnnxImportError,
    OnnxNode,
    array_dtype,
    onnx_dtype,
    sanitize,
)
from compiler.graph import Graph, Value

__all__ = ["Importer", "OnnxImportError", "load_onnx", "summarize_onnx"]


class Importer:
    """Conversion state: the builder, the ONNX values known as arrays (``consts``) and as Kiln values.

    Converters use :meth:`value`, :meth:`const`, :meth:`operands`, :meth:`shape` and :meth:`error`.
    """

    def __init__(self, loaded: Any, graph_name: str) -> None:
        from compiler.frontend.onnx_load import inferred_types

        self.loaded = loaded
        self.label: str = loaded.label
        self.opset: int = loaded.opset
        self.b = ImportBuilder(graph_name)
        self.consts: dict[str, np.ndarray] = {}
        self.values: dict[str, Value] = {}
        self.expanded: set[str] = set()  # folded values larger than their inputs (ConstantOfShape, Expand)
        self.inferred = inferred_types(loaded.model)
        self._transposed: dict[str, Value] = {}

    # ------------------------------------------------------------- lookups
    def error(self, node: OnnxNode, message: str) -> OnnxImportError:
        return OnnxImportError(f"{self.label}: {node.describe()}: {message}")

    def const(self, name: str) -> np.ndarray | None:
        """The value of ``name`` if it is known at import time, else None."""
        return self.consts.get(name) if name else None

    def need_const(self, node: OnnxNode, i: int, what: str) -> np.ndarray:
        arr = self.const(node.input(i))
        if arr is None:
            raise self.error(
                node, f"input {i} ({what}) must be known at import time (a constant or computed from shapes)"
            )
        return arr

    def shape(self, name: str) -> tuple[int, ...]:
        if name in self.values:
            return self.values[name].shape
        return tuple(self.consts[name].shape)

    def dtype(self, name: str) -> str:
        if name in self.values:
            return self.values[name].dtype
        return array_dtype(self.consts[name], f"{self.label}: value '{name}'")

    def value(self, name: str) -> Value:
        """``name`` as a Kiln value, materializing a known array as a constant or param on first use."""
        if name not in self.values:
            self.values[name] = self.materialize(self.consts[name], name)
        return self.values[name]

    def materialize(self, arr: np.ndarray, name: str, from_weight: bool | None = None) -> Value:
        """A Kiln value holding ``arr``: a scalar ``constant`` for rank 0, a lazy broadcast of a constant
        for a uniform array that import-time evaluation expanded (ConstantOfShape, Expand), else a param."""
        dtype = array_dtype(arr, f"{self.label}: value '{name}'")
        kname = sanitize(name)
        weight = name not in self.expanded if from_weight is None else from_weight
        saved, self.b.scope = self.b.scope, None
        try:
            if arr.ndim == 0:
                return self.b.constant(arr.item(), dtype, name=kname)
            flat = arr.reshape(-1)
            if not weight and arr.size > 1 and bool((flat == flat[0]).all()):
                return self.b.broadcast_to(self.b.constant(flat[0].item(), dtype), arr.shape, name=kname)
            return self.b.param(kname, np.ascontiguousarray(arr))
        finally:
            self.b.scope = saved

    def scalar_or_value(self, name: str, out_rank: int) -> Value:
        """A size-1 known array that does not raise the broadcast rank becomes a scalar constant."""
        arr = self.const(name)
        if arr is not None and arr.size == 1 and arr.ndim <= out_rank:
            saved, self.b.scope = self.b.scope, None
            try:
                return self.b.constant(arr.reshape(()).item(), array_dtype(arr, self.label))
            finally:
                self.b.scope = saved
        return self.value(name)

    def operands(self, *names: str) -> list[Value]:
        """Operands of a broadcasting elementwise op (size-1 constants as scalar literals)."""
        ranks = [len(self.shape(n)) for n in names if self.const(n) is None or self.const(n).size != 1]
        out_rank = max(ranks, default=0)
        return [self.scalar_or_value(n, out_rank) for n in names]

    def transposed_weight(self, name: str) -> Value:
        """A 2-D known array transposed, as a param (cached: a weight shared by several MatMuls)."""
        if name not in self._transposed:
            arr = self.consts[name]
            self._transposed[name] = self.materialize(np.ascontiguousarray(arr.T), name, from_weight=True)
        return self._transposed[name]

    # ------------------------------------------------------------ conversion
    def run(self, inputs: Sequence[tuple[str, tuple[int, ...], str]]) -> Graph:
        model = self.loaded.model
        from onnx import numpy_helper

        for name, shape, dtype in inputs:
            self.values[name] = self.b.input(sanitize(name, "input"), shape, dtype)
        for t in self.loaded.initializers:
            if t.name not in self.values:
                self.consts[t.name] = numpy_helper.to_array(t)
        consumers: dict[str, int] = {}
        for node in self.loaded.nodes:
            for i in node.inputs:
                consumers[i] = consumers.get(i, 0) + 1
        for o in model.graph.output:
            consumers[o.name] = consumers.get(o.name, 0) + 1
        for node in self.loaded.nodes:
            self._convert(node, consumers)
        outputs = []
        for o in model.graph.output:
            v = self.value(o.name)
            outputs.append(v)
        try:
            return self.b.build(outputs)
        except KilnError as exc:
            raise OnnxImportError(f"{self.label}: the imported graph is invalid: {exc}") from None

    def _convert(self, node: OnnxNode, consumers: Mapping[str, int]) -> None:
        known = all(not i or i in self.consts for i in node.inputs)
        results: Sequence[Any] | None = None
        if known and node.op not in NEVER_FOLD:
            results = self._fold(node, fallback=node.op in CONVERTERS)
        if results is None:
            results = self._lower(node)
        if len(results) < len(node.outputs):
            results = [*results, *[None] * (len(node.outputs) - len(results))]
        for name, out in zip(node.outputs, results):
            if not name:
                continue
            if out is None:
                if consumers.get(name):
                    raise self.error(node, f"output '{name}' is used, but Kiln does not produce it")
                continue
            if isinstance(out, Value):
                self.values[name] = out
            else:
                self.consts[name] = np.asarray(out)
            self._check_type(node, name)

    def _lower(self, node: OnnxNode) -> Sequence[Any]:
        conv = CONVERTERS.get(node.op)
        if conv is None:
            raise self.error(node, "only supported when all its inputs are known at import time")
        start = len(self.b.nodes)
        self.b.scope = sanitize(node.outputs[0] if node.outputs else node.name)
        try:
            results = conv(self, node)
        except OnnxImportError:
            raise
        except KilnError as exc:
            raise self.error(node, str(exc)) from None
        finally:
            self.b.scope = None
        created = {id(n) for n in self.b.nodes[start:]}
        for name, out in zip(node.outputs, results):
            if isinstance(out, Value) and out.producer is not None and id(out.producer) in created:
                self.b.rename(out.producer, sanitize(name))
        return results

    def _fold(self, node: OnnxNode, fallback: bool) -> list[np.ndarray] | None:
        from onnx.reference import ReferenceEvaluator

        feeds = {i: self.consts[i] for i in node.inputs if i}
        try:
            evaluator = ReferenceEvaluator(node.proto, opsets=dict(self.loaded.opsets))
            outs = evaluator.run(None, feeds)
        except Exception as exc:  # the reference raises many types; fall back to the converter
            if fallback:
                return None
            raise self.error(node, f"cannot evaluate it at import time: {exc}") from None
        outs = [np.asarray(o) for o in outs]
        size = sum(a.size for a in feeds.values())
        self.expanded.update(n for n, o in zip(node.outputs, outs) if o.size > max(size, 1))
        return outs

    def _check_type(self, node: OnnxNode, name: str) -> None:
        """Compare a converted value with what ONNX shape inference says (an importer self-check)."""
        expected = self.inferred.get(name)
        if expected is None:
            return
        shape, elem = expected
        got_shape = self.shape(name)
        if shape is not None and tuple(shape) != tuple(got_shape):
            raise self.error(
                node,
                f"output '{name}' has shape {list(got_shape)} in Kiln but {list(shape)} by ONNX shape "
                "inference (an importer bug; please report it)",
            )
        if name not in self.values:  # known arrays may have types Kiln lacks (only shapes use them)
            return
        if elem and self.dtype(name) != onnx_dtype(elem, f"{self.label}: value '{name}'"):
            raise self.error(
                node, f"output '{name}' is {self.dtype(name)} in Kiln but element type {elem} in ONNX"
            )


def load_onnx(
    path_or_model: Any,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    patterns: bool = True,
) -> Graph:
    """Import an ONNX model (a path, bytes or ``onnx.ModelProto``) as a static-shaped Kiln graph.

    The graph is named after the file (``gpt2.onnx`` -> ``gpt2``, the name ``kiln tune`` records the
    model's tasks under) or, for bytes and ModelProtos, after the ONNX graph.
    ``input_shapes`` gives static shapes for inputs with dynamic dimensions (``{"input_ids": (1, 128)}``,
    what ``--input-shape input_ids=1x128`` parses to). ``patterns=False`` skips pattern recognition
    (GELU, LayerNorm, RMSNorm ... stay as the primitive ops they were exported as).
    Raises :class:`OnnxImportError` (a :class:`~compiler.errors.ModelError`) on any problem.
    """
    import compiler.frontend.onnx_nn
    import compiler.frontend.onnx_ops  # noqa: F401
    from compiler.frontend.onnx_load import load_checked
    from compiler.passes import dce

    loaded, inputs = load_checked(path_or_model, input_shapes)
    if isinstance(path_or_model, (str, os.PathLike)):  # exporters' graph names are generic ("main_graph")
        name = sanitize(Path(path_or_model).stem, "onnx_model")
    else:
        name = sanitize(loaded.model.graph.name or "onnx_model", "onnx_model")
    graph = dce(Importer(loaded, name).run(inputs))
    if patterns:
        from compiler.frontend.onnx_patterns import recognize_patterns

        graph = recognize_patterns(graph)
    try:
        return graph.validate()
    except KilnError as exc:
        raise OnnxImportError(f"{loaded.label}: the imported graph is invalid: {exc}") from None


def summarize_onnx(path_or_model: Any) -> dict[str, Any]:
    """What is in an ONNX file without converting it: inputs and outputs (dims symbolic where dynamic),
    opsets, op histogram and whether Kiln supports each op. Raises OnnxImportError for unreadable files."""
    import compiler.frontend.onnx_nn
    import compiler.frontend.onnx_ops  # noqa: F401
    from compiler.frontend.onnx_common import is_supported
    from compiler.frontend.onnx_load import (
        check_opsets,
        dims_of,
        graph_inputs,
        read_model,
        sort_nodes,
        unsupported_nodes,
    )

    model, label = read_model(path_or_model)
    opsets = check_opsets(model, label)
    nodes = sort_nodes(model, label)
    bad = unsupported_nodes(model, nodes)
    bad_ops = {n.qualified_op for n in bad}

    def io(v: Any) -> dict[str, Any]:
        t = v.type.tensor_type
        try:
            dtype = onnx_dtype(t.elem_type, label)
        except OnnxImportError:
            dtype = f"unsupported ({t.elem_type})"
        return {"name": v.name, "dtype": dtype, "shape": dims_of(v)}

    hist: dict[str, int] = {}
    for n in nodes:
        hist[n.qualified_op] = hist.get(n.qualified_op, 0) + 1
    support = {}
    for op in sorted(hist):
        if op in bad_ops:
            support[op] = "no"
        elif is_supported(op):
            support[op] = "yes"
        else:
            support[op] = "at import time"  # only on known inputs (shape computations, constants)
    inits = list(model.graph.initializer)
    inputs = [io(v) for v in graph_inputs(model)]
    return {
        "file": label,
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "ir_version": int(model.ir_version),
        "opsets": opsets,
        "graph": model.graph.name,
        "inputs": inputs,
        "outputs": [io(v) for v in model.graph.output],
        "dynamic_inputs": [i["name"] for i in inputs if any(not isinstance(d, int) for d in i["shape"])],
        "initializers": len(inits),
        "parameters": int(sum(int(np.prod(t.dims, dtype=np.int64)) for t in inits)),
        "nodes": len(nodes),
        "ops": dict(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0]))),
        "support": support,
        "unsupported_nodes": [{"name": n.name, "op": n.qualified_op} for n in bad],
        "supported": not bad,
    }
