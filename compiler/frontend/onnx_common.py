"""Pieces shared by the ONNX importer modules: the error type, node wrapper, converter table, names and
dtypes. Nothing here imports ``onnx`` at module level (``import compiler`` must stay onnx-free)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from compiler import dtypes
from compiler.builder import GraphBuilder
from compiler.errors import KilnError, ModelError

if TYPE_CHECKING:
    from compiler.frontend.onnx import Importer
    from compiler.graph import Node, Value

# Default-domain opsets the importer understands (op signatures are handled per version inside this range).
MIN_OPSET, MAX_OPSET = 13, 21
DEFAULT_DOMAINS = ("", "ai.onnx")


class OnnxImportError(ModelError):
    """An ONNX model Kiln cannot import: malformed file, unsupported op, dynamic shape. The message
    names the file and the nodes involved."""


class ImportBuilder(GraphBuilder):
    """A GraphBuilder that names helper nodes after the value being converted (``scope``) and can rename
    a node after the fact (to the ONNX output name it ends up producing)."""

    scope: str | None = None

    def add_node(
        self, op: str, inputs: Sequence[Value], attrs: dict[str, Any] | None = None, name: str | None = None
    ) -> Value:
        if name is None and self.scope:
            name = f"{self.scope}.{op}"
        return super().add_node(op, inputs, attrs, name)

    def rename(self, node: Node, base: str) -> None:
        node.name = self._unique(base)
        for v in node.outputs:
            v.name = node.name


@dataclass
class OnnxNode:
    """An ONNX node with its attributes decoded to Python values (strings as str, tensors as ndarray)."""

    op: str
    name: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any]
    domain: str = ""
    proto: Any = field(default=None, repr=False)

    @staticmethod
    def from_proto(proto: Any, index: int) -> OnnxNode:
        from onnx import helper, numpy_helper

        attrs: dict[str, Any] = {}
        for a in proto.attribute:
            v = helper.get_attribute_value(a)
            if isinstance(v, bytes):
                v = v.decode("utf-8", "replace")
            elif isinstance(v, list) and v and isinstance(v[0], bytes):
                v = [s.decode("utf-8", "replace") for s in v]
            elif a.type == a.TENSOR:
                v = numpy_helper.to_array(v)
            elif a.type == a.FLOAT:
                v = f32_value(v)
            attrs[a.name] = v
        domain = "" if proto.domain in DEFAULT_DOMAINS else proto.domain
        name = proto.name or f"{proto.op_type}_{index}"
        return OnnxNode(proto.op_type, name, list(proto.input), list(proto.output), attrs, domain, proto)

    @property
    def qualified_op(self) -> str:
        return f"{self.domain}::{self.op}" if self.domain else self.op

    def describe(self) -> str:
        return f"node '{self.name}' ({self.qualified_op})"

    def input(self, i: int) -> str:
        """The name of input ``i``, or '' when it is absent (optional inputs may be omitted or empty)."""
        return self.inputs[i] if i < len(self.inputs) else ""

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)


# A converter turns one ONNX node into Kiln values: one entry per ONNX output, each a Kiln Value, a numpy
# array (a value known at import time, e.g. Shape) or None (an output Kiln does not produce).
Converter = Callable[["Importer", OnnxNode], Sequence["Value | np.ndarray | None"]]
CONVERTERS: dict[str, Converter] = {}

# Ops that are evaluated at import time when all their inputs are constants but have no Kiln lowering
# for runtime inputs (they compute shapes, or fill constants).
FOLD_ONLY = frozenset({"Shape", "Size", "ConstantOfShape", "Range", "Constant", "OneHot", "NonZero"})
# Ops never folded: their result is random.
NEVER_FOLD = frozenset(
    {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial"}
)


def converter(*ops: str) -> Callable[[Converter], Converter]:
    """Register a converter for one or more ONNX op types (default domain)."""

    def deco(fn: Converter) -> Converter:
        for op in ops:
            if op in CONVERTERS:
                raise KilnError(f"ONNX converter for {op} registered twice")
            CONVERTERS[op] = fn
        return fn

    return deco


def is_supported(op: str, domain: str = "") -> bool:
    """Whether the importer can convert ``op`` with runtime inputs."""
    return domain in DEFAULT_DOMAINS and op in CONVERTERS


_BAD_CHARS = re.compile(r"[^A-Za-z0-9_.]+")


def sanitize(name: str, fallback: str = "v") -> str:
    """An ONNX value name as a Kiln name: runs of characters other than letters, digits, '_' and '.'
    become '_' ('/blocks.0/attn/MatMul_output_0' -> 'blocks.0_attn_MatMul_output_0')."""
    out = _BAD_CHARS.sub("_", name).strip("_")
    return out or fallback


def onnx_dtype(elem_type: int, where: str) -> str:
    """The Kiln dtype of an ONNX TensorProto element type; OnnxImportError for ones Kiln lacks."""
    from onnx import TensorProto, helper

    try:
        np_dtype = helper.tensor_dtype_to_np_dtype(elem_type)
        return dtypes.normalize_dtype(np_dtype)
    except (KeyError, ValueError, TypeError, KilnError):
        name = (
            TensorProto.DataType.Name(elem_type) if elem_type in TensorProto.DataType.values() else elem_type
        )
        raise OnnxImportError(
            f"{where}: element type {name} is not supported; Kiln supports {', '.join(dtypes.DTYPES)}"
        ) from None


def array_dtype(arr: np.ndarray, where: str) -> str:
    try:
        return dtypes.normalize_dtype(arr.dtype)
    except KilnError:
        raise OnnxImportError(
            f"{where}: element type {arr.dtype} is not supported; Kiln supports {', '.join(dtypes.DTYPES)}"
        ) from None


def f32_value(x: float) -> float:
    """A float32 number as the shortest decimal that rounds to it (ONNX stores eps=1e-12 as the float32
    9.99999996e-13; Kiln graphs built by hand say 1e-12, and attributes should hash alike)."""
    return float(str(np.float32(x)))


def norm_axis(axis: int, rank: int, node: OnnxNode) -> int:
    if not -rank <= axis < max(rank, 1):
        raise OnnxImportError(f"{node.describe()}: axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def ints(arr: Any) -> list[int]:
    return [int(v) for v in np.asarray(arr).reshape(-1).tolist()]
