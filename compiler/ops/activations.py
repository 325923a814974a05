"""Piecewise-linear activations that exported models use as single ops: leaky_relu, hard_sigmoid and
hard_swish (MobileNetV3, EfficientNet-lite). Each is elementwise on float tensors, with its own numpy
reference and a decomposition into maximum/minimum/multiply/add, so the decompose pass lowers it to
primitives that every later stage (fusion, tensor expressions) already handles."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from compiler.graph import TensorType
from compiler.ops.common import require_float
from compiler.ops.registry import Attr, OpDef, PatternKind, register

if TYPE_CHECKING:
    from compiler.builder import GraphBuilder
    from compiler.graph import Value


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


def _leaky_relu_decompose(b: GraphBuilder, x: Value, alpha: float) -> Value:
    # for 0 <= alpha <= 1, max(x, alpha*x) is x for x >= 0 and alpha*x below; otherwise select
    scaled = b.multiply(x, b.constant(alpha, x.dtype))
    if 0.0 <= alpha <= 1.0:
        return b.maximum(x, scaled)
    return b.where(b.greater_equal(x, b.constant(0.0, x.dtype)), x, scaled)


def _hard_sigmoid_decompose(b: GraphBuilder, x: Value, alpha: float, beta: float) -> Value:
    y = b.add(b.multiply(x, b.constant(alpha, x.dtype)), b.constant(beta, x.dtype))
    return b.minimum(b.maximum(y, b.constant(0.0, x.dtype)), b.constant(1.0, x.dtype))


def _hard_swish_decompose(b: GraphBuilder, x: Value) -> Value:
    return b.multiply(x, _hard_sigmoid_decompose(b, x, 1.0 / 6.0, 0.5))


register(
    OpDef(
        "leaky_relu",
        PatternKind.ElementWise,
        1,
        _float_infer("leaky_relu"),
        _leaky_relu_ref,
        attrs=(Attr("alpha", "float", 0.01),),
        decompose=_leaky_relu_decompose,
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
        decompose=_hard_sigmoid_decompose,
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
        decompose=_hard_swish_decompose,
        doc="x * max(0, min(1, x / 6 + 1/2))",
    )
)
