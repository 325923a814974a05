"""The tensor-expression compute of every op, and graph -> TE program.

A compute takes the input tensors, the node's attributes, its output type and a stage name and returns
the stages it adds (the last one is the node's output). Importing this module attaches each compute to
its OpDef (``OpDef.compute``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from compiler import dtypes
from compiler.errors import KilnError
from compiler.graph import Graph, TensorType, Value
from compiler.loopir.expr import (
    Expr,
    Logical,
    as_expr,
    call,
    cast,
    compare,
    const,
    logical_and,
    maximum,
    minimum,
    select,
)
from compiler.ops import get_op
from compiler.te import Tensor, TEProgram, compute, placeholder, reduce, reduce_axis

Compute = Callable[[list[Tensor], dict, TensorType, str], list[Tensor]]
_COMPUTES: dict[str, Compute] = {}


def register_compute(*names: str):
    def deco(fn: Compute) -> Compute:
        for n in names:
            _COMPUTES[n] = fn
            get_op(n).compute = fn
        return fn

    return deco


def bcast_index(
    in_shape: Sequence[int], out_idx: Sequence[Expr], out_shape: Sequence[int]
) -> tuple[Expr, ...]:
    """Index into an input of ``in_shape`` for an output index under numpy broadcasting (a size-1 axis
    reads index 0 only where the output axis is really broadcast, so same-shape reads stay identity)."""
    off = len(out_idx) - len(in_shape)
    return tuple(
        const(0) if d == 1 and out_shape[off + k] != 1 else out_idx[off + k] for k, d in enumerate(in_shape)
    )


def _reader(out_shape: Sequence[int]):
    def read(t: Tensor, idx: Sequence[Expr]) -> Expr:
        return t[tuple(bcast_index(t.shape, idx, out_shape))] if t.shape else t[()]

    return read


# ------------------------------------------------------------------ elementwise
_UNARY: dict[str, Callable[[Expr], Expr]] = {
    "neg": lambda x: call("neg", x),
    "abs": lambda x: call("abs", x),
    "exp": lambda x: call("exp", x),
    "log": lambda x: call("log", x),
    "sqrt": lambda x: call("sqrt", x),
    "rsqrt": lambda x: call("rsqrt", x),
    "reciprocal": lambda x: call("recip", x),
    "tanh": lambda x: call("tanh", x),
    "erf": lambda x: call("erf", x),
    "sigmoid": lambda x: call("sigmoid", x),
    "relu": lambda x: maximum(x, const(0, x.dtype)),
    "silu": lambda x: x * call("sigmoid", x),
    "logical_not": lambda x: Logical("not", x),
}


def _make_unary(op: str) -> Compute:
    fn = _UNARY[op]

    def comp(ins: list[Tensor], attrs: dict, out: TensorType, name: str) -> list[Tensor]:
        (x,) = ins
        _read = _reader(out.shape)
        return [compute(out.shape, lambda *i: fn(_read(x, i)), name)]

    return comp


for _op in _UNARY:
    register_compute(_op)(_make_unary(_op))

_BINARY = {
    "add": lambda a, b: a + b,
    "subtract": lambda a, b: a - b,
    "multiply": lambda a, b: a * b,
    "divide": lambda a, b: a / b,
    "power": lambda a, b: _pow(a, b),
    "maximum": maximum,
    "minimum": minimum,
    "equal": lambda a, b: compare("==", a, b),
    "not_equal": lambda a, b: compare("!=", a, b),
    "less": lambda a, b: compare("<", a, b),
    "less_equal": lambda a, b: compare("<=", a, b),
    "greater": lambda a, b: compare(">", a, b),
    "greater_equal": lambda a, b: compare(">=", a, b),
    "logical_and": lambda a, b: Logical("and", a, b),
    "logical_or": lambda a, b: Logical("or", a, b),
}


def _pow(a: Expr, b: Expr) -> Expr:
    from compiler.loopir.expr import Binary

    return Binary("pow", a, b, a.dtype)


def _make_binary(op: str) -> Compute:
    fn = _BINARY[op]

    def comp(ins: list[Tensor], attrs: dict, out: TensorType, name: str) -> list[Tensor]:
        a, b = ins
        _read = _reader(out.shape)
        return [compute(out.shape, lambda *i: fn(_read(a, i), _read(b, i)), name)]

    return comp


for _op in _BINARY:
    register_compute(_op)(_make_binary(_op))


@register_compute("where")
def _where(ins, attrs, out, name):
    c, a, b = ins
    _read = _reader(out.shape)
    return [compute(out.shape, lambda *i: select(_read(c, i), _read(a, i), _read(b, i)), name)]


@register_compute("cast")
def _cast(ins, attrs, out, name):
    (x,) = ins
    _read = _reader(out.shape)
    return [compute(out.shape, lambda *i: cast(_read(x, i), out.dtype), name)]


@register_compute("constant")
def _constant(ins, attrs, out, name):
    return [compute((), lambda: const(attrs["value"], attrs["dtype"]), name)]


# ----------------------------------------------------------------------- layout
@register_compute("broadcast_to")
def _broadcast_to(ins, attrs, out, name):
    (x,) = ins
    _read = _reader(out.shape)
    return [compute(out.shape, lambda *i: _read(x, i), name)]


def _unflatten(linear: Expr, shape: Sequence[int]) -> tuple[Expr, ...]:
    idx = []
    stride = math.prod(shape)
    for d in shape:
        stride //= d
        idx.append(const(0) if d == 1 else (linear // stride) % d)
    return tuple(idx)


def _flatten(idx: Sequence[Expr], shape: Sequence[int]) -> Expr:
    linear: Expr = const(0)
    for i, d in zip(idx, shape):
        linear = linear * d + i
    return linear


def _reshape_groups(dst: Sequence[int], src: Sequence[int]) -> list[tuple[list[int], list[int]]] | None:
    """Runs of destination and source dimensions with equal sizes (a reshape merging [H, W] into [H*W]
    maps those two dimensions to that one, and the others one to one); None for shapes with no
    dimensions or an empty one."""
    if not dst or not src or 0 in dst or 0 in src:
        return None
    groups: list[tuple[list[int], list[int]]] = []
    a = b = 0
    while a < len(dst) and b < len(src):
        ga, gb, pd, ps = [a], [b], dst[a], src[b]
        a, b = a + 1, b + 1
        while pd != ps:
            if pd < ps:
                ga.append(a)
                pd, a = pd * dst[a], a + 1
            else:
                gb.append(b)
                ps, b = ps * src[b], b + 1
        groups.append((ga, gb))
    ga, gb = groups[-1]
    groups[-1] = (ga + list(range(a, len(dst))), gb + list(range(b, len(src))))  # trailing 1s
    return groups


def _reshape_index(i: Sequence[Expr], dst: Sequence[int], src: Sequence[int]) -> tuple[Expr, ...]:
    """The source index of a reshape's output element ``i``: per run of dimensions of equal sizes (see
    :func:`_reshape_groups`), the run's linear index unflattened over its source dimensions, the
    outermost without a modulo, so a reshape that only merges or splits dimensions reads with affine
    indices (``x[n, c, 0, y * W + x]``) instead of divisions of the whole tensor's linear index."""
    groups = _reshape_groups(dst, src)
    if groups is None:
        return _unflatten(_flatten(i, dst), src)
    idx: list[Expr] = []
    for ga, gb in groups:
        linear = _flatten([i[k] for k in ga], [dst[k] for k in ga])
        sizes = [src[k] for k in gb]
        stride = math.prod(sizes)
        outer = True
        for d in sizes:
            stride //= d
            if d == 1:
                idx.append(const(0))
                continue
            q = linear // stride if stride > 1 else linear
            idx.append(q if outer else q % d)
            outer = False
    return tuple(idx)


@register_compute("reshape", "expand_dims", "squeeze")
def _reshape(ins, attrs, out, name):
    (x,) = ins
    return [compute(out.shape, lambda *i: x[_reshape_index(i, out.shape, x.shape)], name)]


@register_compute("transpose")
def _transpose(ins, attrs, out, name):
    (x,) = ins
    perm = attrs["perm"]

    def f(*i: Expr) -> Expr:
        idx: list[Expr] = [const(0)] * len(perm)
        for k, p in enumerate(perm):
            idx[p] = i[k]
        return x[tuple(idx)]

    return [compute(out.shape, f, name)]


@register_compute("concat")
def _concat(ins, attrs, out, name):
    axis = attrs["axis"]

    def f(*i: Expr) -> Expr:
        offsets = []
        acc = 0
        for t in ins:
            offsets.append(acc)
            acc += t.shape[axis]
        expr: Expr | None = None
        for t, off in reversed(list(zip(ins, offsets))):
            idx = list(i)
            idx[axis] = i[axis] - off
            value = t[tuple(idx)]
            expr = value if expr is None else select(i[axis].lt(off + t.shape[axis]), value, expr)
        assert expr is not None
        return expr

    return [compute(out.shape, f, name)]


@register_compute("slice")
def _slice(ins, attrs, out, name):
    (x,) = ins
    starts, steps = attrs["starts"], attrs["steps"]
    return [compute(out.shape, lambda *i: x[tuple(i[d] * steps[d] + starts[d] for d in range(len(i)))], name)]


@register_compute("pad")
def _pad(ins, attrs, out, name):
    (x,) = ins
    pads, rank = attrs["pads"], len(x.shape)

    def f(*i: Expr) -> Expr:
        conds, idx = [], []
        for d in range(rank):
            lo = pads[d]
            idx.append(i[d] - lo)
            if pads[d]:
                conds.append(i[d].ge(lo))
            if pads[d + rank]:
                conds.append(i[d].lt(lo + x.shape[d]))
        value = x[tuple(idx)]
        return select(logical_and(*conds), value, const(attrs["value"], x.dtype)) if conds else value

    return [compute(out.shape, f, name)]


@register_compute("gather")
def _gather(ins, attrs, out, name):
    data, ind = ins
    axis, n = attrs["axis"], data.shape[attrs["axis"]]
    k = len(ind.shape)

    def f(*i: Expr) -> Expr:
        raw = cast(ind[tuple(i[axis : axis + k])] if k else ind[()], "int32")
        pos = select(raw.lt(0), raw + n, raw)
        return data[(*i[:axis], pos, *i[axis + k :])]

    return [compute(out.shape, f, name)]


# ------------------------------------------------------------------- reductions
@register_compute("reduce_sum", "reduce_max", "reduce_min")
def _reduce(ins, attrs, out, name):
    (x,) = ins
    combiner = {"reduce_sum": "sum", "reduce_max": "max", "reduce_min": "min"}[attrs["__op__"]]
    return reduction_stages(x, attrs["axes"], attrs["keepdims"], combiner, out, name)


def reduction_stages(
    x: Tensor, axes: Sequence[int], keepdims: bool, combiner: str, out: TensorType, name: str
) -> list[Tensor]:
    rvs = [reduce_axis(x.shape[a], f"{name}_k{j}") for j, a in enumerate(axes)]
    acc_dtype = dtypes.sum_accumulator(x.dtype) if combiner == "sum" else x.dtype

    def f(*i: Expr) -> Expr:
        idx, it, rit = [], iter(i), iter(rvs)
        for d in range(len(x.shape)):
            if d in axes:
                idx.append(next(rit).var)
                if keepdims:
                    next(it)
            else:
                idx.append(next(it))
        return reduce(combiner, cast(x[tuple(idx)], acc_dtype), rvs)

    red = compute(out.shape, f, name if acc_dtype == x.dtype else f"{name}_acc")
    if acc_dtype == x.dtype:
        return [red]
    return [red, compute(out.shape, lambda *i: cast(red[i], x.dtype), name)]


# ----------------------------------------------------------------- contractions
@register_compute("matmul", "batch_matmul")
def _matmul(ins, attrs, out, name):
    a, b = ins
    ta, tb = attrs["transpose_a"], attrs["transpose_b"]
    kdim = a.shape[-2] if ta else a.shape[-1]
    k = reduce_axis(kdim, f"{name}_k")
    nb = len(out.shape) - 2

    def f(*i: Expr) -> Expr:
        batch, m, n = i[:nb], i[nb], i[nb + 1]
        ab = bcast_index(a.shape[:-2], batch, out.shape[:-2])
        bb = bcast_index(b.shape[:-2], batch, out.shape[:-2])
        av = a[(*ab, k.var, m) if ta else (*ab, m, k.var)]
        bv = b[(*bb, n, k.var) if tb else (*bb, k.var, n)]
        return reduce("sum", av * bv, [k])

    return [compute(out.shape, f, name)]


def _window(size_in: int, pos: Expr, lo: int, k: Expr, stride: int, dil: int) -> tuple[Expr, list[Expr]]:
    """Input coordinate of window element ``k`` at output ``pos``, and the in-bounds conditions."""
    coord = pos * stride + k * dil - lo
    conds: list[Expr] = []
    if lo:
        conds.append(coord.ge(0))
    conds.append(coord.lt(size_in))
    return coord, conds


TWO_STAGE_PAD_BYTES = 1 << 20  # about the L2 cache of the machines measured (see _conv_pad)


def two_stage_conv_pad(
    shape: Sequence[int], padding: Sequence[int], itemsize: int, depthwise: bool, same_rows: bool = False
) -> bool:
    """Whether :func:`_conv_pad` pads an input of ``shape`` [N, C, H, W] in two stages (rows, then
    columns) rather than one (see there). ``same_rows``: a stride-1 convolution whose output rows are as
    wide as its input's, which the CPU conv sketch can run on the rows stage alone (``row_tail`` flat: the
    columns stage inlined), so the size limit does not apply to it."""
    pt, pl, pb, pr = padding
    n_, c_, h_, w_ = shape
    hp, wp = h_ + pt + pb, w_ + pl + pr
    two_stage_bytes = n_ * c_ * ((hp + 2) * w_ + hp * wp) * itemsize
    too_big = two_stage_bytes > TWO_STAGE_PAD_BYTES and not depthwise and not same_rows
    return not (max(pl, pr) > w_ or max(pt, pb) >= h_ or too_big)


def _conv_pad(
    x: Tensor, padding: Sequence[int], name: str, depthwise: bool = False, same_rows: bool = False
) -> list[Tensor]:
    """The zero-padded copy of a convolution's input [N, C, H, W], in two stages whose every load is in
    bounds, so both vectorize along the row (a single ``select(inside, x[y - pt, x - pl], 0)`` reads
    before the first and after the last element at its corners, and stays scalar):

    - ``<name>_rows_pad`` [N, C, 1 + Hp + 1, W]: the rows padded (an extra zero row at each end), each row
      read at a clamped row index (``select(row inside, x[n, c, clamp(r), :], 0)``);
    - ``<name>_pad`` [N, C, Hp, Wp]: the columns padded, ``select(column inside, rows[n, c, y + 1,
      x - pl], 0)``, whose reads stay inside ``rows`` thanks to its extra rows.

    One stage (the select over ``x``) when a side's padding is wider than the image, or when the two
    stages' buffers together exceed ``TWO_STAGE_PAD_BYTES`` for a convolution that is not depthwise
    (``depthwise``: the CPU conv sketch makes its copy per channel tile, in a buffer of a few KiB, where
    both stages vectorize whatever the input's size).
    """
    pt, pl, pb, pr = padding
    n_, c_, h_, w_ = x.shape
    hp, wp = h_ + pt + pb, w_ + pl + pr
    zero = const(0, x.dtype)
    if not two_stage_conv_pad(x.shape, padding, dtypes.info(x.dtype).itemsize, depthwise, same_rows):

        def pad(n: Expr, c: Expr, yy: Expr, xx: Expr) -> Expr:
            conds = [yy.ge(pt), yy.lt(pt + h_), xx.ge(pl), xx.lt(pl + w_)]
            return select(logical_and(*conds), x[n, c, yy - pt, xx - pl], zero)

        return [compute((n_, c_, hp, wp), pad, f"{name}_pad")]

    def rows_pad(n: Expr, c: Expr, r: Expr, xx: Expr) -> Expr:
        inside = logical_and(r.ge(1 + pt), r.lt(1 + pt + h_))
        return select(inside, x[n, c, maximum(minimum(r - (1 + pt), h_ - 1), 0), xx], zero)

    rows = compute((n_, c_, hp + 2, w_), rows_pad, f"{name}_rows_pad")

    def cols_pad(n: Expr, c: Expr, yy: Expr, xx: Expr) -> Expr:
        return select(logical_and(xx.ge(pl), xx.lt(pl + w_)), rows[n, c, yy + 1, xx - pl], zero)

    return [rows, compute((n_, c_, hp, wp), cols_pad, f"{name}_pad")]


def same_conv_rows(x_shape: Sequence[int], w_shape: Sequence[int], attrs: dict) -> bool:
    """A stride-1, undilated convolution whose output rows are as wide as its input's (column padding
    KW - 1 in all, KW > 1): its padded copy's rows stage holds every row it reads, at the output's width."""
    _pt, pl, _pb, pr = attrs["padding"]
    kw = w_shape[3]
    return attrs["strides"][1] == 1 and tuple(attrs["dilation"]) == (1, 1) and kw > 1 and pl + pr == kw - 1


@register_compute("conv2d")
def _conv2d(ins, attrs, out, name):
    x, w = ins
    (sh, sw), (dh, dw), g = attrs["strides"], attrs["dilation"], attrs["groups"]
    pt, pl, _, _ = attrs["padding"]
    o, cg, kh, kw = w.shape
    og = o // g
    rc, rr, rs = reduce_axis(cg, f"{name}_rc"), reduce_axis(kh, f"{name}_rh"), reduce_axis(kw, f"{name}_rw")

    stages: list[Tensor] = []
    src, top, left = x, pt, pl
    if attrs["padding"] != (0, 0, 0, 0):
        # an explicit zero-padded copy (the "<name>_pad" stage): the CPU conv and contraction sketches keep
        # it, so the convolution's inner loop reads with plain affine indices; other schedules inline it
        stages = _conv_pad(
            x,
            attrs["padding"],
            name,
            depthwise=g > 1 and g == o == x.shape[1],
            same_rows=same_conv_rows(x.shape, w.shape, attrs),
        )
        src = stages[-1]
        top = left = 0

    def f(n: Expr, oc: Expr, y: Expr, xx: Expr) -> Expr:
        chan = rc.var if g == 1 else (oc // og) * cg + rc.var
        value = src[n, chan, y * sh + rr.var * dh - top, xx * sw + rs.var * dw - left]
        return reduce("sum", value * w[oc, rc.var, rr.var, rs.var], [rc, rr, rs])

    return [*stages, compute(out.shape, f, name)]


def _pool_read(x: Tensor, attrs: dict, n, c, y, xx, rr, rs, fill: Expr) -> Expr:
    (sh, sw), (pt, pl, _, _) = attrs["strides"], attrs["padding"]
    iy, cy = _window(x.shape[2], y, pt, rr.var, sh, 1)
    ix, cx = _window(x.shape[3], xx, pl, rs.var, sw, 1)
    value = x[n, c, iy, ix]
    if attrs["padding"] == (0, 0, 0, 0):
        return value
    return select(logical_and(*cy, *cx), value, fill)


@register_compute("max_pool2d")
def _max_pool(ins, attrs, out, name):
    (x,) = ins
    kh, kw = attrs["kernel"]
    rr, rs = reduce_axis(kh, f"{name}_rh"), reduce_axis(kw, f"{name}_rw")
    low = const(float("-inf"), x.dtype) if dtypes.is_float(x.dtype) else const(-(2**31), x.dtype)
    return [
        compute(
            out.shape,
            lambda n, c, y, xx: reduce("max", _pool_read(x, attrs, n, c, y, xx, rr, rs, low), [rr, rs]),
            name,
        )
    ]


@register_compute("avg_pool2d")
def _avg_pool(ins, attrs, out, name):
    (x,) = ins
    kh, kw = attrs["kernel"]
    (sh, sw), (pt, pl, _, _) = attrs["strides"], attrs["padding"]
    h, w = x.shape[2], x.shape[3]
    rr, rs = reduce_axis(kh, f"{name}_rh"), reduce_axis(kw, f"{name}_rw")
    total = compute(
        out.shape,
        lambda n, c, y, xx: reduce(
            "sum", _pool_read(x, attrs, n, c, y, xx, rr, rs, const(0, x.dtype)), [rr, rs]
        ),
        f"{name}_sum",
    )

    def count(y: Expr, xx: Expr) -> Expr:
        if attrs["count_include_pad"] or attrs["padding"] == (0, 0, 0, 0):
            return const(float(kh * kw), x.dtype)
        y0, x0 = y * sh - pt, xx * sw - pl
        ny = minimum(y0 + kh, as_expr(h)) - maximum(y0, as_expr(0))
        nx = minimum(x0 + kw, as_expr(w)) - maximum(x0, as_expr(0))
        return cast(ny * nx, x.dtype)

    return [total, compute(out.shape, lambda n, c, y, xx: total[n, c, y, xx] / count(y, xx), name)]


# ------------------------------------------------------------------ graph -> TE
def graph_to_te(graph: Graph, name: str | None = None) -> TEProgram:
    """Every node's compute; graph inputs and params become placeholders (kernel arguments)."""
    env: dict[Value, Tensor] = {}
    inputs: list[Tensor] = []
    for i, v in enumerate(list(graph.inputs) + list(graph.params)):
        t = placeholder(v.shape, v.dtype, _cname(v.name or f"in{i}", f"in{i}"))
        env[v] = t
        inputs.append(t)
    stages: list[Tensor] = []
    used_names = {t.name for t in inputs}
    for node in graph.nodes:
        fn = _COMPUTES.get(node.op)
        if fn is None:
            raise KilnError(f"{node.describe()}: op {node.op} has no compute; decompose the graph first")
        stage_name = _unique(_cname(node.name, node.op), used_names)
        attrs = dict(node.attrs, __op__=node.op)
        new = fn([env[v] for v in node.inputs], attrs, node.output.type, stage_name)
        for t in new:
            used_names.add(t.name)
        stages.extend(new)
        env[node.output] = new[-1]
    outputs = []
    for v in graph.outputs:
        t = env[v]
        if t.is_placeholder or t in outputs:  # an output that is an input, or repeated: copy it
            t = compute(t.shape, lambda *i, t=t: t[i] if i else t[()], _unique("out_copy", used_names))
            stages.append(t)
        outputs.append(t)
    return TEProgram(name or graph.name, inputs, stages, outputs)


def _cname(name: str, fallback: str) -> str:
    out = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return out if out and not out[0].isdigit() else f"t_{out or fallback}"


def _unique(name: str, used: set[str]) -> str:
    base, k = name, 1
    while name in used:
        name = f"{base}_{k}"
        k += 1
    used.add(name)
    return name
