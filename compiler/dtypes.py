"""Element types Kiln understands, with their numpy, C and short printed names.

bfloat16's numpy type comes from ``ml_dtypes`` (numpy has none): arrays of ``ml_dtypes.bfloat16`` add,
multiply, exp ... by computing in float32 and rounding each result to bfloat16, the IR's semantics."""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from compiler.errors import KilnError


@dataclass(frozen=True)
class DTypeInfo:
    name: str  # canonical name used everywhere in the IR: "float32"
    short: str  # printed form: "f32"
    numpy: str  # numpy dtype name
    c_type: str  # C type used by the codegen
    itemsize: int
    is_float: bool
    is_int: bool
    is_bool: bool = False


_INFOS = (
    DTypeInfo("float32", "f32", "float32", "float", 4, True, False),
    DTypeInfo("float16", "f16", "float16", "_Float16", 2, True, False),
    DTypeInfo("bfloat16", "bf16", "bfloat16", "__bf16", 2, True, False),
    DTypeInfo("float64", "f64", "float64", "double", 8, True, False),
    DTypeInfo("int32", "i32", "int32", "int32_t", 4, False, True),
    DTypeInfo("int64", "i64", "int64", "int64_t", 8, False, True),
    DTypeInfo("int8", "i8", "int8", "int8_t", 1, False, True),
    DTypeInfo("uint8", "u8", "uint8", "uint8_t", 1, False, True),
    DTypeInfo("bool", "b8", "bool", "bool", 1, False, False, True),
)
DTYPES: dict[str, DTypeInfo] = {info.name: info for info in _INFOS}
_ALIASES = {info.short: info.name for info in _INFOS} | {
    "float": "float32",
    "half": "float16",
    "bf16": "bfloat16",
    "int": "int64",
}


def normalize_dtype(dtype: object) -> str:
    """Return the canonical dtype name for a name, alias or numpy dtype; raise KilnError otherwise."""
    if isinstance(dtype, str):
        name = _ALIASES.get(dtype, dtype)
    else:
        try:
            name = np.dtype(dtype).name  # type: ignore[arg-type]
        except TypeError as exc:
            raise KilnError(f"unknown dtype {dtype!r}") from exc
    if name not in DTYPES:
        raise KilnError(f"unsupported dtype {dtype!r}; Kiln supports {', '.join(DTYPES)}")
    return name


def info(dtype: str) -> DTypeInfo:
    return DTYPES[normalize_dtype(dtype)]


_NUMPY = {
    info.name: np.dtype(ml_dtypes.bfloat16 if info.name == "bfloat16" else info.numpy) for info in _INFOS
}

# Float types narrower than float32: sums over them accumulate in float32 (graph, TE, reference and codegen).
NARROW_FLOATS = ("float16", "bfloat16")


def to_numpy(dtype: str) -> np.dtype:
    return _NUMPY[dtype]


def is_float_numpy(np_dtype: np.dtype) -> bool:
    """Whether a numpy dtype is a float one: kind "f", or ml_dtypes' bfloat16 (whose kind is "V")."""
    return np_dtype.kind == "f" or np_dtype == _NUMPY["bfloat16"]


def sum_accumulator(dtype: str) -> str:
    """The dtype a sum over ``dtype`` accumulates in: float32 for the 16-bit floats, else ``dtype``."""
    return "float32" if dtype in NARROW_FLOATS else dtype


def is_float(dtype: str) -> bool:
    return DTYPES[dtype].is_float


def is_int(dtype: str) -> bool:
    return DTYPES[dtype].is_int
