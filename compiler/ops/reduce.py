"""Reductions over axes: reduce_sum, reduce_max, reduce_min (reduce_mean is a composite)."""

from __future__ import annotations

import numpy as np

from compiler import dtypes
from compiler.graph import TensorType
from compiler.ops.common import norm_axes
from compiler.ops.registry import Attr, OpDef, OpTypeError, PatternKind, register

REDUCE_ATTRS = (Attr("axes", "ints", None), Attr("keepdims", "bool", False))


def reduce_normalize(op: str):
    def normalize(types: list[TensorType], attrs: dict) -> dict:
        axes = norm_axes(op, attrs["axes"], types[0].rank)
        if not axes and types[0].rank:
            raise OpTypeError(f"{op} with an empty axes list reduces nothing")
        return {"axes": axes, "keepdims": attrs["keepdims"]}

    return normalize


def reduced_shape(shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def reduce_infer(op: str, allow_bool: bool = False):
    def infer(types: list[TensorType], attrs: dict) -> TensorType:
        t = types[0]
        if t.dtype == "bool" and not allow_bool:
            raise OpTypeError(f"{op} does not accept bool input {t}")
        if op != "reduce_sum" and any(t.shape[a] == 0 for a in attrs["axes"]):
            raise OpTypeError(f"{op} over an empty axis of {t} has no identity")
        return TensorType(reduced_shape(t.shape, attrs["axes"], attrs["keepdims"]), t.dtype)

    return infer


def _sum_ref(x: np.ndarray, axes, keepdims) -> np.ndarray:
    acc = dtypes.to_numpy(dtypes.sum_accumulator(dtypes.normalize_dtype(x.dtype)))  # f16/bf16 sum in f32
    return np.sum(x, axis=tuple(axes), keepdims=keepdims, dtype=acc).astype(x.dtype)


REDUCERS = {
    "reduce_sum": (_sum_ref, "sum over axes (f16/bf16 accumulate in f32)"),
    "reduce_max": (lambda x, axes, keepdims: np.max(x, axis=tuple(axes), keepdims=keepdims), "max over axes"),
    "reduce_min": (lambda x, axes, keepdims: np.min(x, axis=tuple(axes), keepdims=keepdims), "min over axes"),
}

for _name, (_fn, _doc) in REDUCERS.items():
    register(
        OpDef(
            _name,
            PatternKind.Reduction,
            1,
            reduce_infer(_name),
            lambda x, axes, keepdims, _fn=_fn: np.asarray(_fn(x, axes, keepdims)),
            attrs=REDUCE_ATTRS,
            normalize=reduce_normalize(_name),
            doc=_doc,
        )
    )
