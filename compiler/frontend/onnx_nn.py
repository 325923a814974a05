"""ONNX converters for contractions (MatMul, Gemm, Einsum), convolution, pooling, normalization, softmax
and reductions."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from compiler.frontend.onnx_common import OnnxNode, converter, ints, norm_axis

if TYPE_CHECKING:
    from compiler.builder import GraphBuilder
    from compiler.frontend.onnx import Importer
    from compiler.graph import Value


# --------------------------------------------------------------------- matmul
def matmul_nd(b: GraphBuilder, x: Value, y: Value) -> Value:
    """numpy.matmul semantics with Kiln's matmul (rank 2) and batch_matmul (equal ranks >= 3)."""
    out_shape = np.matmul(np.empty(x.shape, np.bool_), np.empty(y.shape, np.bool_)).shape
    if x.type.rank == 1:
        x = b.expand_dims(x, [0])
    if y.type.rank == 1:
        y = b.expand_dims(y, [1])
    if x.type.rank == 2 and y.type.rank == 2:
        out = b.matmul(x, y)
    elif y.type.rank == 2:  # [..., M, K] x [K, N]: one big matmul, as linear does
        lead = x.shape[:-1]
        out = b.matmul(b.reshape(x, (math.prod(lead), x.shape[-1])), y)
    else:
        rank = max(x.type.rank, y.type.rank)
        if x.type.rank < rank:
            x = b.expand_dims(x, list(range(rank - x.type.rank)))
        if y.type.rank < rank:
            y = b.expand_dims(y, list(range(rank - y.type.rank)))
        out = b.batch_matmul(x, y)
    return out if out.shape == out_shape else b.reshape(out, out_shape)


@converter("MatMul")
def _matmul(ctx: Importer, node: OnnxNode) -> list[Value]:
    a_name, w_name = node.inputs
    w = ctx.const(w_name)
    if w is not None and w.ndim == 2 and ctx.const(a_name) is None:
        # x @ W with a known [K, N] weight: linear with the [N, K] weight, as torch.nn.Linear is built
        return [ctx.b.linear(ctx.value(a_name), ctx.transposed_weight(w_name))]
    return [matmul_nd(ctx.b, ctx.value(a_name), ctx.value(w_name))]


@converter("Gemm")
def _gemm(ctx: Importer, node: OnnxNode) -> list[Value]:
    b = ctx.b
    alpha, beta = node.attr("alpha", 1.0), node.attr("beta", 1.0)
    ta, tb = bool(node.attr("transA", 0)), bool(node.attr("transB", 0))
    a_name, w_name, c_name = node.input(0), node.input(1), node.input(2)
    w, c = ctx.const(w_name), ctx.const(c_name)
    if not ta and alpha == 1.0 and w is not None and w.ndim == 2 and ctx.const(a_name) is None:
        n = w.shape[0] if tb else w.shape[1]
        if not c_name or (c is not None and beta == 1.0 and c.size == n and c.shape[-1:] == (n,)):
            weight = ctx.value(w_name) if tb else ctx.transposed_weight(w_name)
            bias = None
            if c_name:
                bias = ctx.value(c_name) if c.shape == (n,) else ctx.materialize(c.reshape(n), c_name, True)
            return [b.linear(ctx.value(a_name), weight, bias)]
    y = b.matmul(ctx.value(a_name), ctx.value(w_name), transpose_a=ta, transpose_b=tb)
    if alpha != 1.0:
        y = b.multiply(y, b.constant(alpha, y.dtype))
    if c_name:
        (cv,) = ctx.operands(c_name)
        if beta != 1.0:
            cv = b.multiply(cv, b.constant(beta, cv.dtype))
        y = b.add(y, cv)
    return [y]


# --------------------------------------------------------------------- einsum
def _parse_einsum(ctx: Importer, node: OnnxNode, ranks: list[int]) -> tuple[list[str], str]:
    eq = node.attr("equation", "").replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ctx.error(node, f"equation '{eq}' has {len(terms)} operands, the node {len(ranks)}")
    letters = {c for c in eq if c.isalpha()}
    spare = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz" if c not in letters]
    n_ell = max((r - (len(t) - 3) for t, r in zip(terms, ranks) if "..." in t), default=0)
    ell = "".join(spare[:n_ell])
    out_terms = []
    for t, r in zip(terms, ranks):
        if "..." in t:
            k = r - (len(t) - 3)
            t = t.replace("...", ell[n_ell - k :])
        if len(t) != r or not t.isalpha():
            raise ctx.error(node, f"einsum term '{t}' does not match an operand of rank {r}")
        if len(set(t)) != len(t):
            raise ctx.error(node, f"einsum term '{t}' repeats an index (diagonals are not supported)")
        out_terms.append(t)
    if arrow:
        out = rhs.replace("...", ell)
    else:
        counts = {c: lhs.count(c) for c in letters}
        out = ell + "".join(sorted(c for c in letters if counts[c] == 1))
    if not set(out) <= set("".join(out_terms)) or len(set(out)) != len(out):
        raise ctx.error(node, f"einsum output '{out}' is not valid for '{eq}'")
    return out_terms, out


def _permute(b: GraphBuilder, v: Value, term: str, order: str) -> Value:
    if term == order:
        return v
    return b.transpose(v, [term.index(c) for c in order])


def _sum_out(b: GraphBuilder, v: Value, term: str, keep: set[str]) -> tuple[Value, str]:
    drop = [i for i, c in enumerate(term) if c not in keep]
    if not drop:
        return v, term
    return b.reduce_sum(v, axes=drop), "".join(c for c in term if c in keep)


def _contract(b: GraphBuilder, x: Value, tx: str, y: Value, ty: str, keep: str) -> tuple[Value, str]:
    """Contract two operands to the indices in ``keep`` (ordered batch, m, n) with one (batch_)matmul."""
    size = dict(zip(tx, x.shape)) | dict(zip(ty, y.shape))
    for c in set(tx) & set(ty):
        size[c] = max(dict(zip(tx, x.shape))[c], dict(zip(ty, y.shape))[c])
    x, tx = _sum_out(b, x, tx, set(ty) | set(keep))
    y, ty = _sum_out(b, y, ty, set(tx) | set(keep))
    batch = "".join(c for c in keep if c in tx and c in ty)
    m = "".join(c for c in keep if c in tx and c not in ty)
    n = "".join(c for c in keep if c in ty and c not in tx)
    k = "".join(c for c in tx if c in ty and c not in keep)

    def arrange(v: Value, t: str, first: str, second: str) -> tuple[Value, bool]:
        """v laid out as [batch, first, second], or [batch, second, first] with a transpose flag when
        that is its order already."""
        plain, flipped = batch + first + second, batch + second + first
        flip = t == flipped and t != plain
        v = _permute(b, v, t, flipped if flip else plain)
        want = tuple(size[c] for c in batch)
        if v.shape[: len(batch)] != want:
            v = b.broadcast_to(v, (*want, *v.shape[len(batch) :]))
        d1, d2 = math.prod(size[c] for c in first), math.prod(size[c] for c in second)
        shape = (*want, d2, d1) if flip else (*want, d1, d2)
        return (v if v.shape == shape else b.reshape(v, shape)), flip

    xa, ta = arrange(x, tx, m, k)
    ya, tb = arrange(y, ty, k, n)
    if batch:
        out = b.batch_matmul(xa, ya, transpose_a=ta, transpose_b=tb)
    else:
        out = b.matmul(xa, ya, transpose_a=ta, transpose_b=tb)
    shape = tuple(size[c] for c in batch + m + n)
    return (out if out.shape == shape else b.reshape(out, shape)), batch + m + n


@converter("Einsum")
def _einsum(ctx: Importer, node: OnnxNode) -> list[Value]:
    b = ctx.b
    vals = [ctx.value(n) for n in node.inputs]
    terms, out = _parse_einsum(ctx, node, [v.type.rank for v in vals])
    v, t = vals[0], terms[0]
    for i in range(1, len(vals)):
        later = set(out).union(*terms[i + 1 :])
        keep_x = [c for c in out if c in t or c in terms[i]]
        keep = "".join(keep_x) + "".join(sorted((set(t) | set(terms[i])) & later - set(keep_x)))
        v, t = _contract(b, v, t, vals[i], terms[i], keep)
    v, t = _sum_out(b, v, t, set(out))
    return [_permute(b, v, t, out)]


# ---------------------------------------------------------------- convolution
def _spatial_pads(
    ctx: Importer,
    node: OnnxNode,
    sizes: tuple[int, ...],
    kernel: list[int],
    strides: list[int],
    dil: list[int],
) -> list[int]:
    """ONNX pads [begin..., end...] with auto_pad resolved."""
    n = len(sizes)
    auto = node.attr("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        return list(node.attr("pads", [0] * 2 * n))
    if auto == "VALID":
        return [0] * 2 * n
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise ctx.error(node, f"auto_pad {auto!r} is not supported")
    begin, end = [], []
    for size, k, s, d in zip(sizes, kernel, strides, dil):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small = total // 2
        begin.append(small if auto == "SAME_UPPER" else total - small)
        end.append(total - begin[-1])
    return begin + end


@converter("Conv")
def _conv(ctx: Importer, node: OnnxNode) -> list[Value]:
    b = ctx.b
    x = ctx.value(node.inputs[0])
    if x.type.rank not in (3, 4):
        raise ctx.error(node, f"only 1-D and 2-D convolutions are supported, input is {x.type}")
    w_arr = ctx.const(node.inputs[1])
    w = ctx.value(node.inputs[1])
    nsp = x.type.rank - 2
    kernel = list(node.attr("kernel_shape", w.shape[2:]))
    strides = list(node.attr("strides", [1] * nsp))
    dil = list(node.attr("dilations", [1] * nsp))
    pads = _spatial_pads(ctx, node, x.shape[2:], kernel, strides, dil)
    if nsp == 1:  # as a 2-D convolution over a height-1 image
        x = b.reshape(x, (x.shape[0], x.shape[1], 1, x.shape[2]))
        if w_arr is not None:
            w = ctx.materialize(w_arr.reshape(*w_arr.shape[:2], 1, w_arr.shape[2]), node.inputs[1], True)
        else:
            w = b.reshape(w, (*w.shape[:2], 1, w.shape[2]))
        strides, dil, pads = [1, *strides], [1, *dil], [0, pads[0], 0, pads[1]]
    y = b.conv2d(x, w, strides=strides, padding=pads, dilation=dil, groups=node.attr("group", 1))
    if node.input(2):
        bias = ctx.const(node.input(2))
        o = y.shape[1]
        if bias is not None:
            bv = ctx.materialize(bias.reshape(o, 1, 1), node.input(2), True)
        else:
            bv = b.reshape(ctx.value(node.input(2)), (o, 1, 1))
        y = b.add(y, bv)
    if nsp == 1:
        y = b.reshape(y, (y.shape[0], y.shape[1], y.shape[3]))
    return [y]


# -------------------------------------------------------------------- pooling
def _pool(ctx: Importer, node: OnnxNode, kind: str) -> list[Value | None]:
    b = ctx.b
    x = ctx.value(node.inputs[0])
    if x.type.rank not in (3, 4):
        raise ctx.error(node, f"only 1-D and 2-D pooling is supported, input is {x.type}")
    nsp = x.type.rank - 2
    kernel = list(node.attr("kernel_shape"))
    strides = list(node.attr("strides", [1] * nsp))
    if any(d != 1 for d in node.attr("dilations", [1] * nsp)):
        raise ctx.error(node, "dilated pooling is not supported")
    pads = _spatial_pads(ctx, node, x.shape[2:], kernel, strides, [1] * nsp)
    include_pad = bool(node.attr("count_include_pad", 0))
    if node.attr("ceil_mode", 0):
        if kind == "avg" and include_pad:
            # the extra ceil-mode window never counts; with no real padding nothing else would either
            if any(pads):
                raise ctx.error(node, "ceil_mode with count_include_pad and padding is not supported")
            include_pad = False
        for i, (size, k, s) in enumerate(zip(x.shape[2:], kernel, strides)):
            span = size + pads[i] + pads[i + nsp] - k
            out = -(-span // s) + 1
            if (out - 1) * s >= size + pads[i]:  # the last window must start inside the input
                out -= 1
            pads[i + nsp] += max(0, (out - 1) * s + k - (size + pads[i] + pads[i + nsp]))
    if nsp == 1:
        x = b.reshape(x, (x.shape[0], x.shape[1], 1, x.shape[2]))
        kernel, strides, pads = [1, *kernel], [1, *strides], [0, pads[0], 0, pads[1]]
    if max(pads[0], pads[2]) >= kernel[0] or max(pads[1], pads[3]) >= kernel[1]:
        raise ctx.error(node, f"padding {pads} must be smaller than the kernel {kernel}")
    if kind == "max":
        y = b.max_pool2d(x, kernel, strides=strides, padding=pads)
    else:
        y = b.avg_pool2d(x, kernel, strides=strides, padding=pads, count_include_pad=include_pad)
    if nsp == 1:
        y = b.reshape(y, (y.shape[0], y.shape[1], y.shape[3]))
    return [y, None]


@converter("MaxPool")
def _max_pool(ctx: Importer, node: OnnxNode) -> list[Value | None]:
    return _pool(ctx, node, "max")


@converter("AveragePool")
def _avg_pool(ctx: Importer, node: OnnxNode) -> list[Value | None]:
    return _pool(ctx, node, "avg")


@converter("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(ctx: Importer, node: OnnxNode) -> list[Value]:
    x = ctx.value(node.inputs[0])
    axes = list(range(2, x.type.rank))
    if node.op == "GlobalMaxPool":
        return [ctx.b.reduce_max(x, axes=axes, keepdims=True)]
    if x.type.rank == 4:
        return [ctx.b.global_avg_pool2d(x)]
    return [ctx.b.reduce_mean(x, axes=axes, keepdims=True)]


# -------------------------------------------------------------- normalization
@converter("BatchNormalization")
def _batch_norm(ctx: Importer, node: OnnxNode) -> list[Value | None]:
    if node.attr("training_mode", 0):
        raise ctx.error(node, "training_mode=1 is not supported (Kiln imports models for inference)")
    x = ctx.value(node.inputs[0])
    params = [ctx.value(n) for n in node.inputs[1:5]]
    y = ctx.b.batch_norm(x, *params, axis=1, eps=node.attr("epsilon", 1e-5))
    return [y, None, None]


def _norm_param(ctx: Importer, name: str, shape: tuple[int, ...], fill: float, dtype: str) -> Value:
    """A scale/bias input as a tensor of exactly the normalized shape."""
    if not name:
        return ctx.materialize(
            np.full(shape, fill, dtype), f"{ctx.b.scope}.{'scale' if fill else 'bias'}", True
        )
    arr = ctx.const(name)
    if arr is not None:
        if arr.shape == shape:
            return ctx.value(name)
        return ctx.materialize(np.ascontiguousarray(np.broadcast_to(arr, shape)), name, True)
    v = ctx.value(name)
    return v if v.shape == shape else ctx.b.broadcast_to(v, shape)


@converter("LayerNormalization")
def _layer_norm(ctx: Importer, node: OnnxNode) -> list[Value | None]:
    x = ctx.value(node.inputs[0])
    axis = norm_axis(node.attr("axis", -1), x.type.rank, node)
    inner = x.shape[axis:]
    gamma = _norm_param(ctx, node.input(1), inner, 1.0, x.dtype)
    beta = _norm_param(ctx, node.input(2), inner, 0.0, x.dtype)
    return [ctx.b.layer_norm(x, gamma, beta, axis=axis, eps=node.attr("epsilon", 1e-5)), None, None]


@converter("Softmax", "LogSoftmax")
def _softmax(ctx: Importer, node: OnnxNode) -> list[Value]:
    x = ctx.value(node.inputs[0])
    op = "softmax" if node.op == "Softmax" else "log_softmax"
    return [ctx.b.apply(op, x, axis=node.attr("axis", -1))]


# ----------------------------------------------------------------- reductions
REDUCE = {
    "ReduceMean": "reduce_mean",
    "ReduceSum": "reduce_sum",
    "ReduceMax": "reduce_max",
    "ReduceMin": "reduce_min",
    "ReduceSumSquare": "reduce_sum",
    "ReduceL2": "reduce_sum",
    "ReduceL1": "reduce_sum",
    "ReduceLogSumExp": "reduce_sum",
}


@converter(*REDUCE)
def _reduce(ctx: Importer, node: OnnxNode) -> list[Value]:
    b = ctx.b
    x = ctx.value(node.inputs[0])
    if "axes" in node.attrs:
        axes: list[int] | None = list(node.attrs["axes"])
    elif node.input(1):
        axes = ints(ctx.need_const(node, 1, "axes"))
    else:
        axes = None
    if not axes:
        if node.attr("noop_with_empty_axes", 0):
            return [x]
        axes = None
    keep = bool(node.attr("keepdims", 1))
    if node.op in ("ReduceSumSquare", "ReduceL2"):
        x = b.multiply(x, x)
    elif node.op == "ReduceL1":
        x = b.abs(x)
    if node.op == "ReduceLogSumExp":
        m = b.reduce_max(x, axes=axes, keepdims=True)
        s = b.reduce_sum(b.exp(b.subtract(x, m)), axes=axes, keepdims=keep)
        mk = m if keep else b.reshape(m, s.shape)
        return [b.add(b.log(s), mk)]
    y = b.apply(REDUCE[node.op], x, axes=axes, keepdims=keep)
    return [b.sqrt(y) if node.op == "ReduceL2" else y]
