"""Piecewise-linear activations that exported models use as single ops: leaky_relu, hard_sigmoid and
hard_swish (MobileNetV3, EfficientNet-lite). Each is elementwise on float tensors."""

from __future__ import annotations

import numpy as np

from compiler.graph import TensorType
from compiler.ops.common import require_float
from compiler.ops.registry import Attr, OpDef, OpTypeError, PatternKind, register


def _float_infer(op: str):
    def infer(types: list[TensorType], attrs: dict) -> TensorType:
        (t,) = types
        require_float(op, t)
        return t

    return infer


def _leaky_relu_ref(x: np.ndarray, alpha: float) -> np.ndarray:
    return np.where(x >= 0, x, x * np.asarray(alpha, x.dtype)).astype(x.dtype, copy=False)


def _hard_sigmoid_ref(x: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    y = x.astype(np.float64) * alpha + beta
    return np.clip(y, 0.0, 1.0).astype(x.dtype)


def _hard_swish_ref(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    return (x64 * np.clip(x64 / 6.0 + 0.5, 0.0, 1.0)).astype(x.dtype)


def _hard_sigmoid_normalize(types: list[TensorType], attrs: dict) -> dict:
    if attrs["alpha"] == 0.0:
        raise OpTypeError("hard_sigmoid alpha must not be 0 (that is a constant)")
    return attrs


register(
    OpDef(
        "leaky_relu",
        PatternKind.ElementWise,
        1,
        _float_infer("leaky_relu"),
        _leaky_relu_ref,
        attrs=(Attr("alpha", "float", 0.01),),
        doc="x if x >= 0 else alpha * x",
    )
)
register(
    OpDef(
        "hard_sigmoid",
        PatternKind.ElementWise,
        1,
        _float_infer("hard_sigmoid"),
        _hard_sigmoid_ref,
        attrs=(Attr("alpha", "float", 0.2), Attr("beta", "float", 0.5)),
        normalize=_hard_sigmoid_normalize,
        doc="max(0, min(1, alpha * x + beta))",
    )
)
register(
    OpDef(
        "hard_swish",
        PatternKind.ElementWise,
        1,
        _float_infer("hard_swish"),
        _hard_swish_ref,
        doc="x * max(0, min(1, x / 6 + 1/2))",
    )
)
