"""Reading and checking ONNX files before conversion: parse errors, opsets and domains, undefined values,
cycles, static input shapes, the onnx checker and shape inference. Every failure is an OnnxImportError
whose message names the file and the problem."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler.frontend.onnx_common import (
    DEFAULT_DOMAINS,
    FOLD_ONLY,
    MAX_OPSET,
    MIN_OPSET,
    NEVER_FOLD,
    OnnxImportError,
    OnnxNode,
    is_supported,
    onnx_dtype,
)


@dataclass
class LoadedModel:
    """A checked model: the shape-inferred graph (``model``, whose large initializers are replaced by
    typed inputs), the original ``initializers``, its label (the file path, for messages), opsets and
    topologically sorted nodes."""

    model: Any  # onnx.ModelProto
    label: str
    opsets: dict[str, int]
    nodes: list[OnnxNode]
    initializers: list[Any] = field(default_factory=list)  # onnx.TensorProto

    @property
    def opset(self) -> int:
        return self.opsets[""]

    def error(self, message: str) -> OnnxImportError:
        return OnnxImportError(f"{self.label}: {message}")


def read_model(path_or_model: Any) -> tuple[Any, str]:
    """Parse a path, bytes or ModelProto into a ModelProto (local functions inlined) and a label naming
    it for messages."""
    import onnx
    import onnx.inliner

    model, label = _parse(path_or_model)
    if model.functions:  # model-local functions (newer exporters): inline them into the graph
        try:
            model = onnx.inliner.inline_local_functions(model)
        except Exception as exc:  # the inliner raises several types on malformed functions
            raise OnnxImportError(f"{label}: cannot inline the model's local functions: {exc}") from None
    return model, label


def _parse(path_or_model: Any) -> tuple[Any, str]:
    import onnx
    from google.protobuf.message import DecodeError

    if isinstance(path_or_model, onnx.ModelProto):
        return path_or_model, f"ONNX model '{path_or_model.graph.name or 'unnamed'}'"
    if isinstance(path_or_model, (bytes, bytearray)):
        label = "ONNX model bytes"
        try:
            return onnx.load_model_from_string(bytes(path_or_model)), label
        except (DecodeError, ValueError) as exc:
            raise OnnxImportError(f"{label}: cannot parse: {exc}") from None
    if not isinstance(path_or_model, (str, os.PathLike)):
        raise OnnxImportError(f"cannot load an ONNX model from {type(path_or_model).__name__}")
    label = os.fspath(path_or_model)
    if not os.path.exists(label):
        raise OnnxImportError(f"{label}: no such file")
    if not os.path.isfile(label):
        raise OnnxImportError(f"{label}: not a file (an ONNX model is a single .onnx file)")
    try:
        return onnx.load(label), label
    except (DecodeError, ValueError, RuntimeError, UnicodeDecodeError) as exc:
        raise OnnxImportError(
            f"{label}: cannot parse the file as an ONNX model (truncated or not ONNX): {exc}"
        ) from None
    except OSError as exc:  # external data that is missing or unreadable
        raise OnnxImportError(f"{label}: cannot read the model or its external data: {exc}") from None


def check_opsets(model: Any, label: str) -> dict[str, int]:
    """The model's opsets by domain ('' for the default one); errors for unknown or unsupported ones."""
    import onnx

    if not model.HasField("graph") or (not model.graph.node and not model.graph.output):
        raise OnnxImportError(f"{label}: not an ONNX model: it has no graph (empty or truncated file?)")
    opsets: dict[str, int] = {}
    for imp in model.opset_import:
        domain = "" if imp.domain in DEFAULT_DOMAINS else imp.domain
        opsets[domain] = int(imp.version)
    if "" not in opsets:
        raise OnnxImportError(f"{label}: the model imports no opset of the default ONNX domain")
    version, known = opsets[""], onnx.defs.onnx_opset_version()
    if version > known or version < 1:
        raise OnnxImportError(
            f"{label}: unknown opset {version} (the installed onnx knows opsets 1 to {known})"
        )
    if not MIN_OPSET <= version <= MAX_OPSET:
        raise OnnxImportError(
            f"{label}: opset {version} is not supported; Kiln imports opsets {MIN_OPSET} to {MAX_OPSET} "
            f"(re-export with opset_version={min(max(version, MIN_OPSET), MAX_OPSET)}, or convert it with "
            "onnx.version_converter)"
        )
    for node in model.graph.node:
        domain = "" if node.domain in DEFAULT_DOMAINS else node.domain
        if domain not in opsets:
            raise OnnxImportError(
                f"{label}: node '{node.name or node.op_type}' ({node.op_type}) uses domain '{node.domain}', "
                "which the model does not import (unknown domain)"
            )
    return opsets


def sort_nodes(model: Any, label: str) -> list[OnnxNode]:
    """The graph's nodes in a topological order; errors list undefined inputs, duplicates and cycles."""
    graph = model.graph
    nodes = [OnnxNode.from_proto(p, i) for i, p in enumerate(graph.node)]
    available = {v.name for v in graph.input} | {t.name for t in graph.initializer} | {""}
    producer: dict[str, OnnxNode] = {}
    problems: list[str] = []
    for node in nodes:
        for out in node.outputs:
            if not out:
                continue
            if out in producer or out in available:
                problems.append(f"value '{out}' is defined twice (by {node.describe()})")
            producer[out] = node
    for node in nodes:
        for name in node.inputs:
            if name not in available and name not in producer:
                problems.append(
                    f"{node.describe()} reads '{name}', which is no graph input, initializer or node output "
                    "(a missing initializer or an undefined value)"
                )
    for out in graph.output:
        if out.name not in available and out.name not in producer:
            problems.append(f"graph output '{out.name}' is not defined by any node, input or initializer")
    if problems:
        raise OnnxImportError(f"{label}: malformed graph:\n  " + "\n  ".join(problems))
    # ONNX requires sorted nodes, but exporters do not always comply: repeat in-order sweeps (one sweep for
    # a sorted graph); a sweep that places nothing means a cycle.
    ready = set(available)
    pending, ordered = nodes, []
    while pending:
        rest = []
        for n in pending:
            if all(i in ready for i in n.inputs):
                ready.update(n.outputs)
                ordered.append(n)
            else:
                rest.append(n)
        if len(rest) == len(pending):
            shown = ", ".join(n.describe() for n in rest[:8])
            more = f" and {len(rest) - 8} more" if len(rest) > 8 else ""
            raise OnnxImportError(
                f"{label}: the graph has a cycle: these nodes wait on each other: {shown}{more}"
            )
        pending = rest
    return ordered


def constant_values(model: Any, nodes: Sequence[OnnxNode]) -> set[str]:
    """Names of values known at import time: initializers, Constant outputs, Shape/Size outputs (shapes are
    static) and outputs of nodes whose inputs are all known."""
    const = {t.name for t in model.graph.initializer} | {""}
    for node in nodes:
        if node.op in NEVER_FOLD or node.domain:
            continue
        if node.op in ("Shape", "Size") or all(i in const for i in node.inputs):
            const.update(node.outputs)
    return const


def unsupported_nodes(model: Any, nodes: Sequence[OnnxNode]) -> list[OnnxNode]:
    """Nodes the importer can neither convert nor evaluate at import time."""
    const = constant_values(model, nodes)
    bad = []
    for node in nodes:
        if is_supported(node.op, node.domain):
            continue
        foldable = not node.domain and node.op not in NEVER_FOLD and all(i in const for i in node.inputs)
        if not foldable or (node.op not in FOLD_ONLY and not _reference_has(node.op)):
            bad.append(node)
    return bad


def _reference_has(op: str) -> bool:
    from onnx.reference import ops

    try:
        ops.load_op("", op)
    except Exception:  # the reference raises several types for unknown ops
        return False
    return True


def graph_inputs(model: Any, initializers: set[str] | None = None) -> list[Any]:
    """Graph inputs that are real inputs (old exporters also list initializers as inputs)."""
    inits = {t.name for t in model.graph.initializer} if initializers is None else initializers
    return [v for v in model.graph.input if v.name not in inits]


def dims_of(value_info: Any) -> list[int | str | None]:
    """A value's dims: ints where static, the symbolic name (or None) where dynamic."""
    t = value_info.type.tensor_type
    if not t.HasField("shape"):
        return []
    out: list[int | str | None] = []
    for d in t.shape.dim:
        if d.HasField("dim_value") and d.dim_value > 0:
            out.append(int(d.dim_value))
        else:
            out.append(d.dim_param or None)
    return out


def fix_input_shapes(
    model: Any,
    label: str,
    input_shapes: Mapping[str, Sequence[int]] | None,
    initializers: set[str] | None = None,
) -> list[tuple[str, tuple[int, ...], str]]:
    """Make every graph input static (in place) from its declared dims and ``input_shapes``; return
    (name, shape, dtype) per input. Dynamic dims without a given shape are reported all at once."""
    input_shapes = dict(input_shapes or {})
    inputs = graph_inputs(model, initializers)
    names = [v.name for v in inputs]
    unknown = sorted(set(input_shapes) - set(names))
    if unknown:
        raise OnnxImportError(
            f"{label}: --input-shape names {', '.join(unknown)}, "
            f"but the model's inputs are {', '.join(names)}"
        )
    result, dynamic = [], []
    for v in inputs:
        if not v.type.HasField("tensor_type"):
            raise OnnxImportError(
                f"{label}: input '{v.name}' is not a tensor (sequences and maps are unsupported)"
            )
        dtype = onnx_dtype(v.type.tensor_type.elem_type, f"{label}: input '{v.name}'")
        declared = dims_of(v)
        has_shape = v.type.tensor_type.HasField("shape")
        if v.name in input_shapes:
            given = tuple(int(d) for d in input_shapes[v.name])
            if any(d < 1 for d in given):
                raise OnnxImportError(
                    f"{label}: --input-shape {v.name} has a non-positive dimension {list(given)}"
                )
            if has_shape and len(given) != len(declared):
                raise OnnxImportError(
                    f"{label}: --input-shape {v.name}={'x'.join(map(str, given))} has rank {len(given)}, "
                    f"but the model declares rank {len(declared)} ({_show(declared)})"
                )
            clash = [i for i, (g, d) in enumerate(zip(given, declared)) if isinstance(d, int) and d != g]
            if clash:
                raise OnnxImportError(
                    f"{label}: --input-shape {v.name}={'x'.join(map(str, given))} contradicts the static "
                    f"shape {_show(declared)} declared in the model (dimension {clash[0]})"
                )
            shape = given
        elif not has_shape or any(not isinstance(d, int) for d in declared):
            dynamic.append((v.name, declared, has_shape))
            continue
        else:
            shape = tuple(int(d) for d in declared)  # type: ignore[arg-type]
        dims = v.type.tensor_type.shape.dim
        del dims[:]
        for d in shape:
            dims.add().dim_value = d
        result.append((v.name, shape, dtype))
    if dynamic:
        lines = []
        for name, declared, has_shape in dynamic:
            if not has_shape:
                lines.append(f"input '{name}' has no declared shape: give it with --input-shape {name}=1x128")
                continue
            example = "x".join(
                str(d) if isinstance(d, int) else ("1" if i == 0 else "128") for i, d in enumerate(declared)
            )
            lines.append(
                f"input '{name}' has dynamic dimensions {_show(declared)}: give a static shape with "
                f"--input-shape {name}={example}"
            )
        raise OnnxImportError(f"{label}: Kiln compiles static shapes;\n  " + "\n  ".join(lines))
    return result


def _show(dims: Sequence[int | str | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def check_and_infer(model: Any, label: str) -> Any:
    """Run strict shape inference, then the onnx checker; return the model with inferred value_info
    (inference first: it also fills in graph outputs declared without a shape, which the checker wants)."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    except (onnx.shape_inference.InferenceError, ValueError, RuntimeError) as exc:
        raise OnnxImportError(
            f"{label}: ONNX shape inference failed (check the input shapes): {_first_lines(exc)}"
        ) from None
    # The checker wants a shape on every graph output; ONNX inference cannot always tell one (Reshape to
    # computed shapes), while Kiln's conversion will. Give those outputs an empty shape while checking.
    unshaped = [
        o
        for o in inferred.graph.output
        if o.type.HasField("tensor_type") and not o.type.tensor_type.HasField("shape")
    ]
    for o in unshaped:
        o.type.tensor_type.shape.SetInParent()
    try:
        onnx.checker.check_model(inferred)
    except (onnx.checker.ValidationError, ValueError) as exc:
        raise OnnxImportError(f"{label}: invalid ONNX model: {_first_lines(exc)}") from None
    finally:
        for o in unshaped:
            o.type.tensor_type.ClearField("shape")
    return inferred


def _first_lines(exc: BaseException, n: int = 4) -> str:
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    return "\n  ".join(lines[:n]) + (" ..." if len(lines) > n else "")


def inferred_types(model: Any) -> dict[str, tuple[tuple[int, ...] | None, int]]:
    """Static shapes (None where any dim is unknown) and element types ONNX inferred, by value name."""
    out: dict[str, tuple[tuple[int, ...] | None, int]] = {}
    g = model.graph
    for v in [*g.value_info, *g.output, *g.input]:
        if not v.type.HasField("tensor_type"):
            continue
        dims = dims_of(v)
        static = v.type.tensor_type.HasField("shape") and all(isinstance(d, int) for d in dims)
        out[v.name] = (tuple(dims) if static else None, v.type.tensor_type.elem_type)  # type: ignore[arg-type]
    return out


SMALL_INITIALIZER = 4096  # elements; shape inference sees the values of initializers up to this size


def _light_model(model: Any, nodes: Sequence[OnnxNode]) -> Any:
    """A copy of the model for shape inference and the checker: sorted nodes, only small initializers
    (shape inference needs the values of shape tensors, never of weights; copying and serializing the
    weights would dominate import time)."""
    import onnx

    light = onnx.ModelProto()
    for name in ("ir_version", "producer_name", "producer_version", "domain", "model_version"):
        setattr(light, name, getattr(model, name))
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    g, src = light.graph, model.graph
    g.name = src.name
    g.node.extend(n.proto for n in nodes)
    g.input.extend(src.input)
    g.output.extend(src.output)
    g.value_info.extend(src.value_info)
    for t in src.initializer:
        if int(np.prod(t.dims, dtype=np.int64)) <= SMALL_INITIALIZER:
            g.initializer.append(t)
    return light


def load_checked(
    path_or_model: Any, input_shapes: Mapping[str, Sequence[int]] | None
) -> tuple[LoadedModel, list[tuple[str, tuple[int, ...], str]]]:
    """Everything before conversion: parse, check opsets, sort, list unsupported ops, fix input shapes,
    check and infer shapes."""
    import onnx

    model, label = read_model(path_or_model)
    opsets = check_opsets(model, label)
    nodes = sort_nodes(model, label)
    bad = unsupported_nodes(model, nodes)
    if bad:
        ops = sorted({n.qualified_op for n in bad})
        listing = "\n  ".join(f"{n.name} ({n.qualified_op})" for n in bad)
        raise OnnxImportError(
            f"{label}: {len(bad)} node(s) use ops Kiln cannot import ({', '.join(ops)}):\n  {listing}"
        )
    init_names = {t.name for t in model.graph.initializer}
    light = _light_model(model, nodes)
    inputs = fix_input_shapes(light, label, input_shapes, init_names)
    declared = {v.name for v in light.graph.input} | {t.name for t in light.graph.initializer}
    for t in model.graph.initializer:  # large weights enter inference as typed inputs, not as data
        if t.name not in declared:
            light.graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    inferred = check_and_infer(light, label)
    loaded = LoadedModel(
        inferred,
        label,
        opsets,
        [OnnxNode.from_proto(p, i) for i, p in enumerate(inferred.graph.node)],
        list(model.graph.initializer),
    )
    return loaded, inputs
