"""Composite ops. Each has its own numpy reference and a decomposition into primitives (the CINN
"composite op" split), e.g. softmax -> reduce_max, broadcast_to, subtract, exp, reduce_sum, divide."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from compiler.graph import TensorType
from compiler.ops.common import norm_axis, require_float, same_dtype
from compiler.ops.reduce import REDUCE_ATTRS, reduce_infer, reduce_normalize, reduced_shape
from compiler.ops.registry import Attr, OpDef, OpTypeError, PatternKind, register

if TYPE_CHECKING:
    from compiler.builder import GraphBuilder
    from compiler.graph import Value


def _bcast(b: GraphBuilder, v: Value, shape: tuple[int, ...]) -> Value:
    return v if v.shape == shape else b.broadcast_to(v, shape)


def _scalar(b: GraphBuilder, value: float, like: Value) -> Value:
    return b.constant(value, like.dtype)


def _float_same(op: str):
    def infer(types: list[TensorType], attrs: dict) -> TensorType:
        require_float(op, types[0])
        return types[0]

    return infer


# ------------------------------------------------------------------- reduce_mean
def _mean_decompose(b: GraphBuilder, x: Value, axes, keepdims) -> Value:
    n = math.prod(x.shape[a] for a in axes)
    return b.divide(b.reduce_sum(x, axes=axes, keepdims=keepdims), _scalar(b, float(n), x))


def _mean_ref(x: np.ndarray, axes, keepdims) -> np.ndarray:
    return np.mean(x, axis=tuple(axes), keepdims=keepdims, dtype=np.float64).astype(x.dtype)


def _mean_infer(types: list[TensorType], attrs: dict) -> TensorType:
    require_float("reduce_mean", types[0])
    return reduce_infer("reduce_mean")(types, attrs)


register(
    OpDef(
        "reduce_mean",
        PatternKind.Reduction,
        1,
        _mean_infer,
        _mean_ref,
        attrs=REDUCE_ATTRS,
        normalize=reduce_normalize("reduce_mean"),
        decompose=_mean_decompose,
        doc="mean over axes",
    )
)


# -------------------------------------------------------------------- softmaxes
def _axis_normalize(op: str):
    def normalize(types: list[TensorType], attrs: dict) -> dict:
        return {**attrs, "axis": norm_axis(op, attrs["axis"], types[0].rank)}

    return normalize


def _softmax_decompose(b: GraphBuilder, x: Value, axis: int) -> Value:
    m = _bcast(b, b.reduce_max(x, axes=[axis], keepdims=True), x.shape)
    e = b.exp(b.subtract(x, m))
    s = _bcast(b, b.reduce_sum(e, axes=[axis], keepdims=True), x.shape)
    return b.divide(e, s)


def _softmax_ref(x: np.ndarray, axis: int) -> np.ndarray:
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True)).astype(x.dtype)


def _log_softmax_decompose(b: GraphBuilder, x: Value, axis: int) -> Value:
    m = _bcast(b, b.reduce_max(x, axes=[axis], keepdims=True), x.shape)
    d = b.subtract(x, m)
    lse = _bcast(b, b.log(b.reduce_sum(b.exp(d), axes=[axis], keepdims=True)), x.shape)
    return b.subtract(d, lse)


def _log_softmax_ref(x: np.ndarray, axis: int) -> np.ndarray:
    x64 = x.astype(np.float64)
    d = x64 - x64.max(axis=axis, keepdims=True)
    return (d - np.log(np.exp(d).sum(axis=axis, keepdims=True))).astype(x.dtype)


for _name, _dec, _ref in (
    ("softmax", _softmax_decompose, _softmax_ref),
    ("log_softmax", _log_softmax_decompose, _log_softmax_ref),
):
    register(
        OpDef(
            _name,
            PatternKind.Reduction,
            1,
            _float_same(_name),
            _ref,
            attrs=(Attr("axis", "int", -1),),
            normalize=_axis_normalize(_name),
            decompose=_dec,
            doc=f"{_name} along an axis",
        )
    )


# ----------------------------------------------------------- layer_norm / rms_norm
def _norm_infer(op: str, n_params: int):
    def infer(types: list[TensorType], attrs: dict) -> TensorType:
        x, params = types[0], types[1:]
        require_float(op, x)
        same_dtype(op, types)
        inner = x.shape[attrs["axis"] :]
        for p in params:
            if p.shape != inner:
                raise OpTypeError(f"{op} scale/bias {p} must have the normalized shape {list(inner)}")
        return x

    return infer


def _layer_norm_decompose(b: GraphBuilder, x: Value, gamma: Value, beta: Value, axis: int, eps: float):
    axes = list(range(axis, len(x.shape)))
    n = float(math.prod(x.shape[axis:]))
    mean = b.divide(b.reduce_sum(x, axes=axes, keepdims=True), _scalar(b, n, x))
    d = b.subtract(x, _bcast(b, mean, x.shape))
    var = b.divide(b.reduce_sum(b.multiply(d, d), axes=axes, keepdims=True), _scalar(b, n, x))
    r = b.rsqrt(b.add(var, _scalar(b, eps, x)))
    y = b.multiply(d, _bcast(b, r, x.shape))
    y = b.multiply(y, _bcast(b, gamma, x.shape))
    return b.add(y, _bcast(b, beta, x.shape))


def _layer_norm_ref(x, gamma, beta, axis, eps):
    axes = tuple(range(axis, x.ndim))
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=axes, keepdims=True)
    var = ((x64 - mean) ** 2).mean(axis=axes, keepdims=True)
    return ((x64 - mean) / np.sqrt(var + eps) * gamma + beta).astype(x.dtype)


def _rms_norm_decompose(b: GraphBuilder, x: Value, weight: Value, axis: int, eps: float):
    axes = list(range(axis, len(x.shape)))
    n = float(math.prod(x.shape[axis:]))
    ms = b.divide(b.reduce_sum(b.multiply(x, x), axes=axes, keepdims=True), _scalar(b, n, x))
    r = b.rsqrt(b.add(ms, _scalar(b, eps, x)))
    return b.multiply(b.multiply(x, _bcast(b, r, x.shape)), _bcast(b, weight, x.shape))


def _rms_norm_ref(x, weight, axis, eps):
    axes = tuple(range(axis, x.ndim))
    x64 = x.astype(np.float64)
    ms = (x64 * x64).mean(axis=axes, keepdims=True)
    return (x64 / np.sqrt(ms + eps) * weight).astype(x.dtype)


register(
    OpDef(
        "layer_norm",
        PatternKind.Reduction,
        3,
        _norm_infer("layer_norm", 2),
        _layer_norm_ref,
        attrs=(Attr("axis", "int", -1), Attr("eps", "float", 1e-5)),
        normalize=_axis_normalize("layer_norm"),
        decompose=_layer_norm_decompose,
        doc="(x - mean) / sqrt(var + eps) * gamma + beta over axes [axis, rank)",
    )
)
register(
    OpDef(
        "rms_norm",
        PatternKind.Reduction,
        2,
        _norm_infer("rms_norm", 1),
        _rms_norm_ref,
        attrs=(Attr("axis", "int", -1), Attr("eps", "float", 1e-6)),
        normalize=_axis_normalize("rms_norm"),
        decompose=_rms_norm_decompose,
        doc="x / sqrt(mean(x^2) + eps) * weight over axes [axis, rank)",
    )
)


# ------------------------------------------------------------------------ linear
def _linear_infer(types: list[TensorType], attrs: dict) -> TensorType:
    x, w = types[0], types[1]
    same_dtype("linear", types)
    require_float("linear", x)
    if w.rank != 2 or x.rank < 1 or x.shape[-1] != w.shape[1]:
        raise OpTypeError(f"linear needs x[..., in] and weight[out, in]; got {x} and {w}")
    if len(types) == 3 and types[2].shape != (w.shape[0],):
        raise OpTypeError(f"linear bias {types[2]} must have shape [{w.shape[0]}]")
    return TensorType((*x.shape[:-1], w.shape[0]), x.dtype)


def _linear_decompose(b: GraphBuilder, x: Value, w: Value, bias: Value | None = None) -> Value:
    x2 = x if len(x.shape) >= 2 else b.reshape(x, (1, x.shape[-1]))
    y = b.matmul(x2, w, transpose_b=True)  # matmul takes leading dims on A: no reshapes around it
    if bias is not None:
        y = b.add(y, _bcast(b, bias, y.shape))
    return y if len(x.shape) >= 2 else b.reshape(y, (w.shape[0],))


def _linear_ref(x, w, bias=None):
    y = np.matmul(x, w.T)
    return (y if bias is None else y + bias).astype(x.dtype)


register(
    OpDef(
        "linear",
        PatternKind.OutFusible,
        (2, 3),
        _linear_infer,
        _linear_ref,
        decompose=_linear_decompose,
        doc="x @ weight^T + bias (weight is [out, in], as in torch.nn.Linear)",
    )
)


# -------------------------------------------------------------------- batch_norm
def _bn_infer(types: list[TensorType], attrs: dict) -> TensorType:
    x = types[0]
    same_dtype("batch_norm", types)
    require_float("batch_norm", x)
    c = x.shape[attrs["axis"]]
    for name, t in zip(("gamma", "beta", "mean", "var"), types[1:]):
        if t.shape != (c,):
            raise OpTypeError(
                f"batch_norm {name} {t} must have shape [{c}] (channels on axis {attrs['axis']})"
            )
    return x


def _bn_decompose(b: GraphBuilder, x, gamma, beta, mean, var, axis: int, eps: float) -> Value:
    scale = b.multiply(gamma, b.rsqrt(b.add(var, _scalar(b, eps, x))))
    shift = b.subtract(beta, b.multiply(mean, scale))
    shape = (x.shape[axis],) + (1,) * (len(x.shape) - axis - 1)
    scale_r, shift_r = b.reshape(scale, shape), b.reshape(shift, shape)
    return b.add(b.multiply(x, _bcast(b, scale_r, x.shape)), _bcast(b, shift_r, x.shape))


def _bn_ref(x, gamma, beta, mean, var, axis, eps):
    shape = (-1,) + (1,) * (x.ndim - axis - 1)
    x64 = x.astype(np.float64)
    y = (x64 - mean.reshape(shape)) / np.sqrt(var.reshape(shape).astype(np.float64) + eps)
    return (y * gamma.reshape(shape) + beta.reshape(shape)).astype(x.dtype)


register(
    OpDef(
        "batch_norm",
        PatternKind.ElementWise,
        5,
        _bn_infer,
        _bn_ref,
        attrs=(Attr("axis", "int", 1), Attr("eps", "float", 1e-5)),
        normalize=_axis_normalize("batch_norm"),
        decompose=_bn_decompose,
        doc="inference batch norm: (x - mean) / sqrt(var + eps) * gamma + beta",
    )
)


# -------------------------------------------------------------------------- gelu
def _gelu_normalize(types: list[TensorType], attrs: dict) -> dict:
    if attrs["approximate"] not in ("none", "tanh"):
        raise OpTypeError(f"gelu approximate must be 'none' or 'tanh', got {attrs['approximate']!r}")
    return attrs


def _gelu_decompose(b: GraphBuilder, x: Value, approximate: str) -> Value:
    half = b.multiply(x, _scalar(b, 0.5, x))
    if approximate == "none":
        inner = b.erf(b.multiply(x, _scalar(b, 1 / math.sqrt(2.0), x)))
    else:
        cube = b.multiply(b.multiply(x, x), x)
        poly = b.add(x, b.multiply(cube, _scalar(b, 0.044715, x)))
        inner = b.tanh(b.multiply(poly, _scalar(b, math.sqrt(2 / math.pi), x)))
    return b.multiply(half, b.add(inner, _scalar(b, 1.0, x)))


def _gelu_ref(x: np.ndarray, approximate: str) -> np.ndarray:
    from scipy.special import erf

    x64 = x.astype(np.float64)
    if approximate == "none":
        y = 0.5 * x64 * (1 + erf(x64 / math.sqrt(2)))
    else:
        y = 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64**3)))
    return y.astype(x.dtype)


register(
    OpDef(
        "gelu",
        PatternKind.ElementWise,
        1,
        _float_same("gelu"),
        _gelu_ref,
        attrs=(Attr("approximate", "str", "none"),),
        normalize=_gelu_normalize,
        decompose=_gelu_decompose,
        doc="GELU, exact (erf) or the tanh approximation",
    )
)


# ------------------------------------------------------------- global_avg_pool2d
def _gap_infer(types: list[TensorType], attrs: dict) -> TensorType:
    x = types[0]
    if x.rank != 4:
        raise OpTypeError(f"global_avg_pool2d needs an NCHW input, got {x}")
    require_float("global_avg_pool2d", x)
    return TensorType(reduced_shape(x.shape, (2, 3), True), x.dtype)


register(
    OpDef(
        "global_avg_pool2d",
        PatternKind.Reduction,
        1,
        _gap_infer,
        lambda x: x.astype(np.float64).mean(axis=(2, 3), keepdims=True).astype(x.dtype),
        decompose=lambda b, x: b.reduce_mean(x, axes=[2, 3], keepdims=True),
        doc="mean over H and W, keeping them as size-1 axes",
    )
)
