"""2-D pooling over NCHW: max_pool2d and avg_pool2d (global_avg_pool2d is a composite)."""

from __future__ import annotations

import numpy as np

from compiler import dtypes
from compiler.graph import TensorType
from compiler.ops.contraction import pads4, pair, window_out
from compiler.ops.registry import Attr, OpDef, OpTypeError, PatternKind, register

POOL_ATTRS = (Attr("kernel", "ints"), Attr("strides", "ints", None), Attr("padding", "ints", (0, 0, 0, 0)))


def _normalize(op: str):
    def normalize(types: list[TensorType], attrs: dict) -> dict:
        kernel = pair(op, "kernel", attrs["kernel"])
        out = {
            "kernel": kernel,
            "strides": pair(op, "strides", attrs["strides"] or kernel),
            "padding": pads4(op, attrs["padding"]),
        }
        pt, pl, pb, pr = out["padding"]
        if max(pt, pb) >= kernel[0] or max(pl, pr) >= kernel[1]:
            raise OpTypeError(
                f"{op} padding {list(out['padding'])} must be smaller than the kernel {list(kernel)}"
            )
        if "count_include_pad" in attrs:
            out["count_include_pad"] = attrs["count_include_pad"]
        return out

    return normalize


def _infer(op: str):
    def infer(types: list[TensorType], attrs: dict) -> TensorType:
        (x,) = types
        if x.rank != 4:
            raise OpTypeError(f"{op} needs an NCHW (rank-4) input, got {x}")
        if x.dtype == "bool":
            raise OpTypeError(f"{op} does not accept bool input")
        (kh, kw), (sh, sw) = attrs["kernel"], attrs["strides"]
        pt, pl, pb, pr = attrs["padding"]
        oh, ow = window_out(x.shape[2], kh, sh, pt, pb), window_out(x.shape[3], kw, sw, pl, pr)
        if oh < 1 or ow < 1:
            raise OpTypeError(f"{op} kernel {kh}x{kw} does not fit the padded input {x}")
        return TensorType((x.shape[0], x.shape[1], oh, ow), x.dtype)

    return infer


def _windows(x: np.ndarray, kernel, strides, padding, fill) -> np.ndarray:
    pt, pl, pb, pr = padding
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=fill)
    win = np.lib.stride_tricks.sliding_window_view(xp, tuple(kernel), axis=(2, 3))
    return win[:, :, :: strides[0], :: strides[1]]


def _max_ref(x: np.ndarray, kernel, strides, padding) -> np.ndarray:
    fill = -np.inf if dtypes.is_float_numpy(x.dtype) else np.iinfo(x.dtype).min
    return _windows(x, kernel, strides, padding, fill).max(axis=(-2, -1))


def _avg_ref(x: np.ndarray, kernel, strides, padding, count_include_pad) -> np.ndarray:
    total = _windows(x.astype(np.float64), kernel, strides, padding, 0).sum(axis=(-2, -1))
    if count_include_pad:
        count = kernel[0] * kernel[1]
    else:
        ones = np.ones((1, 1, *x.shape[2:]))
        count = _windows(ones, kernel, strides, padding, 0).sum(axis=(-2, -1))
    return (total / count).astype(x.dtype)


register(
    OpDef(
        "max_pool2d",
        PatternKind.OutFusible,
        1,
        _infer("max_pool2d"),
        _max_ref,
        attrs=POOL_ATTRS,
        normalize=_normalize("max_pool2d"),
        doc="max over windows (padding counts as -inf)",
    )
)
register(
    OpDef(
        "avg_pool2d",
        PatternKind.OutFusible,
        1,
        _infer("avg_pool2d"),
        _avg_ref,
        attrs=(*POOL_ATTRS, Attr("count_include_pad", "bool", False)),
        normalize=_normalize("avg_pool2d"),
        doc="mean over windows; padding is excluded from the count unless count_include_pad",
    )
)
