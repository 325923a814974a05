"""The op registry: one :class:`OpDef` per op, with its pattern kind, attributes, type inference,
numpy reference and (for composites) its decomposition into primitives."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from compiler import dtypes
from compiler.errors import KilnError, TypeInferenceError, UnknownOpError

if TYPE_CHECKING:
    from compiler.graph import TensorType, Value


class PatternKind(enum.IntEnum):
    """How an op's output indices relate to its inputs' (the TVM / CINN OpPatternKind)."""

    ElementWise = 0  # out[i, j] = f(in[i, j])
    Broadcast = 1  # out[i, j] = f(in[j]): one-to-many
    Injective = 2  # each output index maps to one input index (transpose, reshape, slice ...)
    Reduction = 3  # many-to-one along reduced axes
    OutFusible = 4  # complex ops (matmul, conv) that can take elementwise consumers
    Opaque = 8  # fuses with nothing


class OpTypeError(KilnError):
    """Raised by an op's type inference; :func:`infer_node` adds the node and its input types."""


_MISSING = object()


@dataclass(frozen=True)
class Attr:
    """An op attribute: its name, kind (int, float, bool, str, ints, floats, dtype) and default."""

    name: str
    kind: str
    default: Any = _MISSING

    @property
    def required(self) -> bool:
        return self.default is _MISSING

    def coerce(self, op: str, value: Any) -> Any:
        try:
            if self.kind == "int":
                if isinstance(value, bool) or int(value) != value:
                    raise ValueError
                return int(value)
            if self.kind == "float":
                return float(value)
            if self.kind == "bool":
                if not isinstance(value, (bool, np.bool_)):
                    raise ValueError
                return bool(value)
            if self.kind == "str":
                if not isinstance(value, str):
                    raise ValueError
                return value
            if self.kind == "ints":
                if isinstance(value, (int, np.integer)):
                    value = [value]
                out = tuple(int(v) for v in value)
                if any(int(v) != v for v in value):
                    raise ValueError
                return out
            if self.kind == "floats":
                return tuple(float(v) for v in value)
            if self.kind == "dtype":
                return dtypes.normalize_dtype(value)
            if self.kind == "scalar":  # a number or bool kept as given
                if isinstance(value, (bool, np.bool_)):
                    return bool(value)
                if isinstance(value, (int, np.integer)):
                    return int(value)
                return float(value)
        except (TypeError, ValueError, KilnError):
            pass
        raise OpTypeError(f"attribute '{self.name}' of {op} must be {self.kind}, got {value!r}")


InferFn = Callable[[list["TensorType"], dict[str, Any]], "TensorType"]
NormalizeFn = Callable[[list["TensorType"], dict[str, Any]], dict[str, Any]]
ReferenceFn = Callable[..., np.ndarray]
DecomposeFn = Callable[..., "Value"]


@dataclass
class OpDef:
    """Everything Kiln knows about one op.

    ``infer(input_types, attrs) -> TensorType`` raises :class:`OpTypeError` with a message that names
    the offending shapes, dtypes or attributes. ``reference(*arrays, **attrs) -> ndarray`` is the ground
    truth every compiled kernel is checked against. ``normalize`` canonicalizes attributes given the input
    types (negative axes made positive, defaults spelled out) so equal ops hash equally. Composite ops
    carry ``decompose(builder, *values, **attrs) -> Value`` built from primitive ops.
    """

    name: str
    kind: PatternKind
    arity: int | tuple[int, int | None]  # exact count, or (min, max or None)
    infer: InferFn
    reference: ReferenceFn
    attrs: tuple[Attr, ...] = ()
    normalize: NormalizeFn | None = None
    decompose: DecomposeFn | None = None
    doc: str = ""
    compute: Any = field(default=None, repr=False)  # tensor-expression compute, set by compiler.te

    @property
    def is_composite(self) -> bool:
        return self.decompose is not None

    def check_arity(self, n: int) -> None:
        if isinstance(self.arity, int):
            if n != self.arity:
                raise OpTypeError(f"{self.name} takes {self.arity} input(s), got {n}")
            return
        lo, hi = self.arity
        if n < lo or (hi is not None and n > hi):
            bound = f"{lo} to {hi}" if hi is not None else f"at least {lo}"
            raise OpTypeError(f"{self.name} takes {bound} inputs, got {n}")


_REGISTRY: dict[str, OpDef] = {}


def register(opdef: OpDef) -> OpDef:
    if opdef.name in _REGISTRY:
        raise KilnError(f"op {opdef.name} is registered twice")
    _REGISTRY[opdef.name] = opdef
    return opdef


def get_op(name: str) -> OpDef:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownOpError(f"unknown op '{name}'; known ops: {', '.join(sorted(_REGISTRY))}") from None


def all_ops() -> list[OpDef]:
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


def _types_str(types: Sequence[TensorType]) -> str:
    return ", ".join(str(t) for t in types)


def normalize_attrs(op: str, types: list[TensorType], attrs: dict[str, Any], node: str | None = None) -> dict:
    """Check names and kinds of attributes, fill defaults and canonicalize them for the given inputs."""
    opdef = get_op(op)
    where = f"node '{node}' ({op})" if node else op
    try:
        opdef.check_arity(len(types))
        known = {a.name: a for a in opdef.attrs}
        unknown = sorted(set(attrs) - set(known))
        if unknown:
            raise OpTypeError(
                f"unknown attribute(s) {', '.join(unknown)}; {op} accepts {', '.join(known) or 'none'}"
            )
        out: dict[str, Any] = {}
        for a in opdef.attrs:
            if a.name in attrs and attrs[a.name] is not None:
                out[a.name] = a.coerce(op, attrs[a.name])
            elif a.required:
                raise OpTypeError(f"missing required attribute '{a.name}'")
            elif a.default is not None:
                out[a.name] = a.coerce(op, a.default)
            else:
                out[a.name] = None
        if opdef.normalize is not None:
            out = opdef.normalize(types, out)
        return out
    except OpTypeError as exc:
        raise TypeInferenceError(f"{where}: {exc} (inputs: {_types_str(types)})") from None


def infer_node(op: str, types: list[TensorType], attrs: dict[str, Any], node: str | None = None) -> list:
    """Infer the output types of ``op`` on inputs of ``types`` with (normalized) ``attrs``."""
    opdef = get_op(op)
    where = f"node '{node}' ({op})" if node else op
    try:
        opdef.check_arity(len(types))
        return [opdef.infer(list(types), attrs)]
    except OpTypeError as exc:
        shown = {k: v for k, v in attrs.items() if v is not None}
        raise TypeInferenceError(f"{where}: {exc} (inputs: {_types_str(types)}; attrs: {shown})") from None
