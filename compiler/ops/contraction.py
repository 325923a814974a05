"""Contractions: matmul, batch_matmul (with transpose flags) and conv2d (NCHW, OIHW)."""

from __future__ import annotations

import numpy as np

from compiler.graph import TensorType
from compiler.ops.common import broadcast_shapes, require_float, same_dtype
from compiler.ops.registry import Attr, OpDef, OpTypeError, PatternKind, register

MATMUL_ATTRS = (Attr("transpose_a", "bool", False), Attr("transpose_b", "bool", False))


def _mk(t: TensorType, transposed: bool) -> tuple[int, int]:
    r, c = t.shape[-2], t.shape[-1]
    return (c, r) if transposed else (r, c)


def _check_k(op: str, a: TensorType, b: TensorType, attrs: dict) -> tuple[int, int]:
    m, k = _mk(a, attrs["transpose_a"])
    k2, n = _mk(b, attrs["transpose_b"])
    if k != k2:
        raise OpTypeError(
            f"{op}: inner dimensions differ: A{'ᵀ' if attrs['transpose_a'] else ''} is {m}x{k}, "
            f"B{'ᵀ' if attrs['transpose_b'] else ''} is {k2}x{n}"
        )
    return m, n


def _matmul_infer(types: list[TensorType], attrs: dict) -> TensorType:
    a, b = types
    if a.rank < 2 or b.rank != 2:
        raise OpTypeError(
            f"matmul needs A of rank >= 2 and a rank-2 B ([..., M, K] @ [K, N]), got {a} and {b}; "
            "use batch_matmul when B has batch dimensions"
        )
    dtype = same_dtype("matmul", types)
    require_float("matmul", a)
    m, n = _check_k("matmul", a, b, attrs)
    return TensorType((*a.shape[:-2], m, n), dtype)


def _batch_matmul_infer(types: list[TensorType], attrs: dict) -> TensorType:
    a, b = types
    if a.rank < 3 or a.rank != b.rank:
        raise OpTypeError(f"batch_matmul needs operands of the same rank >= 3, got {a} and {b}")
    dtype = same_dtype("batch_matmul", types)
    require_float("batch_matmul", a)
    m, n = _check_k("batch_matmul", a, b, attrs)
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return TensorType((*batch, m, n), dtype)


def _matmul_ref(a: np.ndarray, b: np.ndarray, transpose_a: bool, transpose_b: bool) -> np.ndarray:
    if transpose_a:
        a = np.swapaxes(a, -1, -2)
    if transpose_b:
        b = np.swapaxes(b, -1, -2)
    return np.matmul(a, b)


for _name, _infer in (("matmul", _matmul_infer), ("batch_matmul", _batch_matmul_infer)):
    register(
        OpDef(
            _name,
            PatternKind.OutFusible,
            2,
            _infer,
            _matmul_ref,
            attrs=MATMUL_ATTRS,
            doc="A @ B with optional transposes (of the last two axes); "
            + ("batch dims broadcast" if _name[0] == "b" else "A may have leading dims, B is rank 2"),
        )
    )


# ------------------------------------------------------------------------ conv2d
def pads4(op: str, padding: tuple[int, ...]) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) from 1, 2 or 4 numbers."""
    if len(padding) == 1:
        padding = padding * 4
    elif len(padding) == 2:
        padding = (padding[0], padding[1], padding[0], padding[1])
    if len(padding) != 4 or any(p < 0 for p in padding):
        raise OpTypeError(f"{op} padding must be 1, 2 or 4 non-negative numbers, got {list(padding)}")
    return tuple(padding)  # type: ignore[return-value]


def pair(op: str, name: str, v: tuple[int, ...]) -> tuple[int, int]:
    if len(v) == 1:
        v = v * 2
    if len(v) != 2 or any(x < 1 for x in v):
        raise OpTypeError(f"{op} {name} must be one or two positive numbers, got {list(v)}")
    return tuple(v)  # type: ignore[return-value]


def window_out(size: int, k: int, stride: int, pad_lo: int, pad_hi: int, dilation: int = 1) -> int:
    return (size + pad_lo + pad_hi - dilation * (k - 1) - 1) // stride + 1


def _conv_normalize(types: list[TensorType], attrs: dict) -> dict:
    return {
        "strides": pair("conv2d", "strides", attrs["strides"]),
        "padding": pads4("conv2d", attrs["padding"]),
        "dilation": pair("conv2d", "dilation", attrs["dilation"]),
        "groups": attrs["groups"],
    }


def _conv_infer(types: list[TensorType], attrs: dict) -> TensorType:
    x, w = types
    if x.rank != 4 or w.rank != 4:
        raise OpTypeError(f"conv2d needs NCHW input and OIHW weight (rank 4), got {x} and {w}")
    dtype = same_dtype("conv2d", types)
    require_float("conv2d", x)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    g = attrs["groups"]
    if g < 1 or c % g or o % g:
        raise OpTypeError(f"conv2d groups={g} must divide input channels {c} and output channels {o}")
    if cg != c // g:
        raise OpTypeError(
            f"conv2d weight {w} has {cg} input channels per group; input {x} with groups={g} needs {c // g}"
        )
    (sh, sw), (dh, dw) = attrs["strides"], attrs["dilation"]
    pt, pl, pb, pr = attrs["padding"]
    oh, ow = window_out(h, kh, sh, pt, pb, dh), window_out(wd, kw, sw, pl, pr, dw)
    if oh < 1 or ow < 1:
        raise OpTypeError(f"conv2d kernel {kh}x{kw} (dilation {dh}x{dw}) does not fit the padded input {x}")
    return TensorType((n, o, oh, ow), dtype)


def _conv_ref(x: np.ndarray, w: np.ndarray, strides, padding, dilation, groups) -> np.ndarray:
    pt, pl, pb, pr = padding
    (sh, sw), (dh, dw) = strides, dilation
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    o, cg, kh, kw = w.shape
    win = np.lib.stride_tricks.sliding_window_view(xp, (dh * (kh - 1) + 1, dw * (kw - 1) + 1), axis=(2, 3))
    win = win[:, :, ::sh, ::sw, ::dh, ::dw]  # N, C, OH, OW, KH, KW
    outs = []
    og = o // groups
    for g in range(groups):
        xg = win[:, g * cg : (g + 1) * cg]
        wg = w[g * og : (g + 1) * og]
        outs.append(np.einsum("nchwij,ocij->nohw", xg, wg, optimize=True))
    return np.concatenate(outs, axis=1).astype(x.dtype)


register(
    OpDef(
        "conv2d",
        PatternKind.OutFusible,
        2,
        _conv_infer,
        _conv_ref,
        attrs=(
            Attr("strides", "ints", (1, 1)),
            Attr("padding", "ints", (0, 0, 0, 0)),
            Attr("dilation", "ints", (1, 1)),
            Attr("groups", "int", 1),
        ),
        normalize=_conv_normalize,
        doc="2-D convolution, NCHW input, OIHW weight; padding = (top, left, bottom, right)",
    )
)
