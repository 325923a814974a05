"""Elementwise ops: unary math, binary arithmetic with numpy broadcasting, comparisons, logic, where,
cast and scalar constants."""

from __future__ import annotations

import numpy as np

from compiler import dtypes
from compiler.graph import TensorType
from compiler.ops.common import broadcast_shapes, require_float, same_dtype
from compiler.ops.registry import Attr, OpDef, OpTypeError, PatternKind, register


def _erf(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf

    return erf(x).astype(x.dtype, copy=False)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return (1 / (1 + np.exp(-x))).astype(x.dtype, copy=False)


def _rsqrt(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return (np.asarray(1, x.dtype) / np.sqrt(x)).astype(x.dtype, copy=False)


def _reciprocal(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return (np.asarray(1, x.dtype) / x).astype(x.dtype, copy=False)


# name -> (numpy reference, needs float input, doc)
UNARY = {
    "neg": (np.negative, False, "-x"),
    "abs": (np.abs, False, "|x|"),
    "exp": (np.exp, True, "e**x"),
    "log": (np.log, True, "natural logarithm"),
    "sqrt": (np.sqrt, True, "square root"),
    "rsqrt": (_rsqrt, True, "1 / sqrt(x)"),
    "reciprocal": (_reciprocal, True, "1 / x"),
    "tanh": (np.tanh, True, "hyperbolic tangent"),
    "erf": (_erf, True, "the error function"),
    "sigmoid": (_sigmoid, True, "1 / (1 + exp(-x))"),
    "relu": (lambda x: np.maximum(x, np.asarray(0, x.dtype)), False, "max(x, 0)"),
    "silu": (lambda x: (x * _sigmoid(x)).astype(x.dtype, copy=False), True, "x * sigmoid(x)"),
}


def _unary_infer(name: str, needs_float: bool):
    def infer(types: list[TensorType], attrs: dict) -> TensorType:
        (t,) = types
        if t.dtype == "bool":
            raise OpTypeError(f"{name} does not accept bool input {t}")
        if needs_float:
            require_float(name, t)
        return t

    return infer


def _quiet(fn):
    def ref(*arrays, **attrs):
        with np.errstate(all="ignore"):
            return np.asarray(fn(*arrays, **attrs))

    return ref


for _name, (_fn, _float, _doc) in UNARY.items():
    register(OpDef(_name, PatternKind.ElementWise, 1, _unary_infer(_name, _float), _quiet(_fn), doc=_doc))


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer division truncating toward zero (C and ONNX semantics)."""
    q = np.floor_divide(a, b)
    fix = (q < 0) & (q * b != a)
    return (q + fix).astype(a.dtype)


def _divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(a.dtype, np.integer):
        return _int_div(a, b)
    return np.divide(a, b).astype(a.dtype, copy=False)


def _power(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.power(a, b).astype(np.result_type(a, b), copy=False)


BINARY = {
    "add": (np.add, "a + b"),
    "subtract": (np.subtract, "a - b"),
    "multiply": (np.multiply, "a * b"),
    "divide": (_divide, "a / b (truncating for integers)"),
    "power": (_power, "a ** b"),
    "maximum": (np.maximum, "elementwise max"),
    "minimum": (np.minimum, "elementwise min"),
}
COMPARE = {
    "equal": np.equal,
    "not_equal": np.not_equal,
    "less": np.less,
    "less_equal": np.less_equal,
    "greater": np.greater,
    "greater_equal": np.greater_equal,
}
LOGICAL = {"logical_and": np.logical_and, "logical_or": np.logical_or}


def _binary_infer(name: str, out_dtype: str | None = None, need_bool: bool = False):
    def infer(types: list[TensorType], attrs: dict) -> TensorType:
        dtype = same_dtype(name, types)
        if need_bool and dtype != "bool":
            raise OpTypeError(f"{name} needs bool inputs, got {', '.join(map(str, types))}")
        if not need_bool and dtype == "bool" and out_dtype is None:
            raise OpTypeError(f"{name} does not accept bool inputs; cast them first")
        shape = broadcast_shapes(*(t.shape for t in types))
        return TensorType(shape, out_dtype or dtype)

    return infer


for _name, (_fn, _doc) in BINARY.items():
    register(OpDef(_name, PatternKind.ElementWise, 2, _binary_infer(_name), _quiet(_fn), doc=_doc))
for _name, _fn in COMPARE.items():
    register(OpDef(_name, PatternKind.ElementWise, 2, _binary_infer(_name, "bool"), _quiet(_fn), doc=_name))
for _name, _fn in LOGICAL.items():
    register(
        OpDef(_name, PatternKind.ElementWise, 2, _binary_infer(_name, "bool", True), _quiet(_fn), doc=_name)
    )


def _not_infer(types: list[TensorType], attrs: dict) -> TensorType:
    if types[0].dtype != "bool":
        raise OpTypeError(f"logical_not needs a bool input, got {types[0]}")
    return types[0]


register(OpDef("logical_not", PatternKind.ElementWise, 1, _not_infer, _quiet(np.logical_not), doc="not x"))


def _where_infer(types: list[TensorType], attrs: dict) -> TensorType:
    cond, a, b = types
    if cond.dtype != "bool":
        raise OpTypeError(f"where needs a bool condition, got {cond}")
    dtype = same_dtype("where", [a, b])
    return TensorType(broadcast_shapes(cond.shape, a.shape, b.shape), dtype)


register(
    OpDef(
        "where",
        PatternKind.ElementWise,
        3,
        _where_infer,
        lambda c, a, b: np.where(c, a, b),
        doc="cond ? a : b, broadcast",
    )
)


def _cast_infer(types: list[TensorType], attrs: dict) -> TensorType:
    return TensorType(types[0].shape, attrs["dtype"])


def _cast_ref(x: np.ndarray, dtype: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        return x.astype(dtypes.to_numpy(dtype))


register(
    OpDef(
        "cast",
        PatternKind.ElementWise,
        1,
        _cast_infer,
        _cast_ref,
        attrs=(Attr("dtype", "dtype"),),
        doc="convert the element type (float to int truncates toward zero)",
    )
)


def _constant_infer(types: list[TensorType], attrs: dict) -> TensorType:
    return TensorType((), attrs["dtype"])


def _constant_normalize(types: list[TensorType], attrs: dict) -> dict:
    value, dtype = attrs["value"], attrs["dtype"]
    if dtype == "bool":
        value = bool(value)
    elif dtypes.is_int(dtype):
        if isinstance(value, float) and not value.is_integer():
            raise OpTypeError(f"constant value {value} is not an integer but dtype is {dtype}")
        value = int(value)
    else:
        # store the value rounded to the constant's dtype so the reference and the code agree exactly
        value = float(np.asarray(value, dtypes.to_numpy(dtype)))
    return {"value": value, "dtype": dtype}


register(
    OpDef(
        "constant",
        PatternKind.ElementWise,
        0,
        _constant_infer,
        lambda value, dtype: np.asarray(value, dtypes.to_numpy(dtype)),
        attrs=(Attr("value", "scalar"), Attr("dtype", "dtype", "float32")),
        normalize=_constant_normalize,
        doc="a scalar literal (shape [])",
    )
)
