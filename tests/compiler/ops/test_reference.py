"""Every op's numpy reference checked against an independent computation: python scalar math and
explicit loops on small inputs. A test fails if an op is registered without a case here."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from compiler.builder import GraphBuilder
from compiler.ops import all_ops
from compiler.reference import run_reference

rng = np.random.default_rng(1234)


def f32(*shape, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, shape).astype(np.float32)


def scalar_map(fn, *arrays):
    """Apply a python scalar function elementwise with numpy broadcasting, in float64."""
    bcast = np.broadcast_arrays(*[a.astype(np.float64) if a.dtype.kind == "f" else a for a in arrays])
    out = np.empty(bcast[0].shape, dtype=object)
    for idx in np.ndindex(out.shape):
        out[idx] = fn(*(a[idx].item() for a in bcast))
    return out


def run_op(op, arrays, params=(), **attrs):
    b = GraphBuilder(op)
    values = [b.input(f"x{i}", a.shape, a.dtype) for i, a in enumerate(arrays)]
    values += [b.param(f"p{i}", p) for i, p in enumerate(params)]
    out = b.apply(op, *values, **attrs)
    return run_reference(b.build([out]), list(arrays))[0]


def sig(x):
    return 1 / (1 + math.exp(-x))


UNARY_CASES = {
    "neg": (lambda x: -x, {}),
    "abs": (abs, {}),
    "exp": (math.exp, {}),
    "log": (math.log, {"lo": 0.1, "hi": 5}),
    "sqrt": (math.sqrt, {"lo": 0.0, "hi": 5}),
    "rsqrt": (lambda x: 1 / math.sqrt(x), {"lo": 0.1, "hi": 5}),
    "reciprocal": (lambda x: 1 / x, {"lo": 0.5, "hi": 5}),
    "tanh": (math.tanh, {}),
    "erf": (math.erf, {"lo": -4, "hi": 4}),
    "sigmoid": (sig, {"lo": -20, "hi": 20}),
    "relu": (lambda x: max(x, 0.0), {}),
    "silu": (lambda x: x * sig(x), {}),
}


@pytest.mark.parametrize("op", sorted(UNARY_CASES))
def test_unary(op):
    fn, rng_kw = UNARY_CASES[op]
    x = f32(3, 17, **rng_kw)
    got = run_op(op, [x])
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, scalar_map(fn, x).astype(np.float64), rtol=2e-6, atol=1e-7)


BINARY_CASES = {
    "add": lambda a, b: a + b,
    "subtract": lambda a, b: a - b,
    "multiply": lambda a, b: a * b,
    "divide": lambda a, b: a / b,
    "power": lambda a, b: a**b,
    "maximum": max,
    "minimum": min,
}


@pytest.mark.parametrize("op", sorted(BINARY_CASES))
def test_binary_broadcasting(op):
    a = f32(4, 1, 5, lo=0.5, hi=2)
    b = f32(3, 1, lo=0.5, hi=2)
    got = run_op(op, [a, b])
    assert got.shape == (4, 3, 5)
    np.testing.assert_allclose(got, scalar_map(BINARY_CASES[op], a, b).astype(np.float64), rtol=3e-6)


def test_integer_divide_truncates_toward_zero():
    a = np.array([7, -7, 7, -7, 6], np.int32)
    b = np.array([2, 2, -2, -2, 3], np.int32)
    np.testing.assert_array_equal(run_op("divide", [a, b]), [3, -3, -3, 3, 2])


COMPARE_CASES = {
    "equal": lambda a, b: a == b,
    "not_equal": lambda a, b: a != b,
    "less": lambda a, b: a < b,
    "less_equal": lambda a, b: a <= b,
    "greater": lambda a, b: a > b,
    "greater_equal": lambda a, b: a >= b,
}


@pytest.mark.parametrize("op", sorted(COMPARE_CASES))
def test_compare(op):
    a = rng.integers(0, 3, (5, 4)).astype(np.float32)
    b = rng.integers(0, 3, (4,)).astype(np.float32)
    got = run_op(op, [a, b])
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, scalar_map(COMPARE_CASES[op], a, b).astype(bool))


@pytest.mark.parametrize(
    "op,fn", [("logical_and", lambda a, b: a and b), ("logical_or", lambda a, b: a or b)]
)
def test_logical_binary(op, fn):
    a, b = rng.random((3, 4)) < 0.5, rng.random((4,)) < 0.5
    np.testing.assert_array_equal(run_op(op, [a, b]), scalar_map(fn, a, b).astype(bool))


def test_logical_not_where_cast_constant():
    a = rng.random((3, 4)) < 0.5
    np.testing.assert_array_equal(run_op("logical_not", [a]), scalar_map(lambda v: not v, a).astype(bool))
    x, y = f32(3, 4), f32(4)
    np.testing.assert_array_equal(
        run_op("where", [a, x, y]), scalar_map(lambda c, p, q: p if c else q, a, x, y)
    )
    v = np.array([-2.7, -0.5, 0.5, 2.7], np.float32)
    np.testing.assert_array_equal(run_op("cast", [v], dtype="int32"), [int(t) for t in v.tolist()])
    b = GraphBuilder()
    g = b.build([b.constant(0.1, "float32")])
    out = run_reference(g, [])[0]
    assert out.shape == () and out.dtype == np.float32 and out == np.float32(0.1)


def test_layout_ops():
    x = f32(2, 3, 4)
    got = run_op("broadcast_to", [f32(3, 1)], shape=(2, 3, 4))
    assert got.shape == (2, 3, 4) and (got[1, :, 2] == got[0, :, 0]).all()
    flat = [x[i, j, k] for i, j, k in itertools.product(range(2), range(3), range(4))]
    np.testing.assert_array_equal(run_op("reshape", [x], shape=(4, -1)).ravel(), flat)
    t = run_op("transpose", [x], perm=(2, 0, 1))
    for i, j, k in itertools.product(range(2), range(3), range(4)):
        assert t[k, i, j] == x[i, j, k]
    assert run_op("expand_dims", [x], axes=(0, -1)).shape == (1, 2, 3, 4, 1)
    assert run_op("squeeze", [f32(1, 3, 1)]).shape == (3,)
    a, c = f32(2, 1, 4), f32(2, 2, 4)
    cat = run_op("concat", [a, c], axis=1)
    assert (cat[:, :1] == a).all() and (cat[:, 1:] == c).all()


def test_slice_pad_gather():
    x = f32(6, 5)
    b = GraphBuilder()
    xi = b.input("x", x.shape)
    s1 = b.slice(xi, [1, -1], [5, 0], axes=[0, 1], steps=[2, -2])
    g = b.build([s1])
    got = run_reference(g, [x])[0]
    expect = [[x[i, j] for j in range(4, 0, -2)] for i in range(1, 5, 2)]
    np.testing.assert_array_equal(got, expect)
    p = run_op("pad", [x], pads=(1, 0, 2, 3), value=-1.0)
    assert p.shape == (9, 8) and p[0, 0] == -1 and p[1, 0] == x[0, 0] and p[-1, -1] == -1
    idx = np.array([[2, 0], [-1, 1]], np.int64)
    gat = run_op("gather", [x, idx], axis=1)
    assert gat.shape == (6, 2, 2)
    for i, a, c in itertools.product(range(6), range(2), range(2)):
        assert gat[i, a, c] == x[i, idx[a, c] % 5]


@pytest.mark.parametrize(
    "op,fn",
    [
        ("reduce_sum", sum),
        ("reduce_max", max),
        ("reduce_min", min),
        ("reduce_mean", lambda v: sum(v) / len(v)),
    ],
)
def test_reductions(op, fn):
    x = f32(3, 4, 5)
    got = run_op(op, [x], axes=(0, 2), keepdims=True)
    assert got.shape == (1, 4, 1)
    for j in range(4):
        vals = [float(x[i, j, k]) for i in range(3) for k in range(5)]
        assert got[0, j, 0] == pytest.approx(fn(vals), rel=1e-5, abs=1e-6)
    assert run_op(op, [x]).shape == ()


def test_matmul_and_batch_matmul():
    a, b = f32(3, 5), f32(4, 5)
    got = run_op("matmul", [a, b], transpose_b=True)
    for i, j in itertools.product(range(3), range(4)):
        assert got[i, j] == pytest.approx(sum(float(a[i, k]) * float(b[j, k]) for k in range(5)), rel=1e-5)
    x, y = f32(2, 1, 3, 5), f32(1, 4, 5, 2)
    bm = run_op("batch_matmul", [x, y])
    assert bm.shape == (2, 4, 3, 2)
    for p, q, i, j in itertools.product(range(2), range(4), range(3), range(2)):
        ref = sum(float(x[p, 0, i, k]) * float(y[0, q, k, j]) for k in range(5))
        assert bm[p, q, i, j] == pytest.approx(ref, rel=1e-5, abs=1e-6)


def naive_conv(x, w, stride, pad, dil, groups):
    n, _c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    pt, pl, pb, pr = pad
    oh = (h + pt + pb - dil[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + pl + pr - dil[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, o, oh, ow))
    og = o // groups
    for b_, oc, i, j in itertools.product(range(n), range(o), range(oh), range(ow)):
        g = oc // og
        acc = 0.0
        for ci, r, s in itertools.product(range(cg), range(kh), range(kw)):
            y, xx = i * stride[0] - pt + r * dil[0], j * stride[1] - pl + s * dil[1]
            if 0 <= y < h and 0 <= xx < wd:
                acc += float(x[b_, g * cg + ci, y, xx]) * float(w[oc, ci, r, s])
        out[b_, oc, i, j] = acc
    return out


@pytest.mark.parametrize(
    "stride,pad,dil,groups", [((1, 1), (1, 1, 1, 1), (1, 1), 1), ((2, 1), (0, 1, 2, 0), (1, 2), 2)]
)
def test_conv2d(stride, pad, dil, groups):
    x, w = f32(2, 4, 7, 6), f32(6, 4 // groups, 3, 2)
    got = run_op("conv2d", [x, w], strides=stride, padding=pad, dilation=dil, groups=groups)
    np.testing.assert_allclose(got, naive_conv(x, w, stride, pad, dil, groups), rtol=1e-5, atol=1e-5)


def naive_pool(x, k, s, pad, kind, include_pad=False):
    n, c, h, w = x.shape
    pt, pl, pb, pr = pad
    oh, ow = (h + pt + pb - k[0]) // s[0] + 1, (w + pl + pr - k[1]) // s[1] + 1
    out = np.zeros((n, c, oh, ow))
    for b_, ch, i, j in itertools.product(range(n), range(c), range(oh), range(ow)):
        vals = []
        for r, t in itertools.product(range(k[0]), range(k[1])):
            y, xx = i * s[0] - pt + r, j * s[1] - pl + t
            if 0 <= y < h and 0 <= xx < w:
                vals.append(float(x[b_, ch, y, xx]))
        if kind == "max":
            out[b_, ch, i, j] = max(vals)
        else:
            out[b_, ch, i, j] = sum(vals) / (k[0] * k[1] if include_pad else len(vals))
    return out


def test_pooling():
    x = f32(2, 3, 7, 8)
    mp = run_op("max_pool2d", [x], kernel=(3, 3), strides=(2, 2), padding=(1, 1))
    np.testing.assert_array_equal(mp, naive_pool(x, (3, 3), (2, 2), (1, 1, 1, 1), "max"))
    for include in (False, True):
        ap = run_op(
            "avg_pool2d", [x], kernel=(2, 3), strides=(1, 2), padding=(1, 1), count_include_pad=include
        )
        np.testing.assert_allclose(ap, naive_pool(x, (2, 3), (1, 2), (1, 1, 1, 1), "avg", include), rtol=1e-5)
    gp = run_op("global_avg_pool2d", [x])
    np.testing.assert_allclose(
        gp[..., 0, 0], [[np.mean(x[i, c].astype(np.float64)) for c in range(3)] for i in range(2)], rtol=1e-5
    )


def test_composites_against_scalar_formulas():
    x = f32(3, 6)
    sm = run_op("softmax", [x])
    lsm = run_op("log_softmax", [x])
    for i in range(3):
        row = [float(v) for v in x[i]]
        z = sum(math.exp(v) for v in row)
        np.testing.assert_allclose(sm[i], [math.exp(v) / z for v in row], rtol=1e-5)
        np.testing.assert_allclose(lsm[i], [v - math.log(z) for v in row], rtol=1e-5, atol=1e-6)
    g, bta = f32(6), f32(6)
    ln = run_op("layer_norm", [x], params=(g, bta), eps=1e-5)
    rms = run_op("rms_norm", [x], params=(g,), eps=1e-6)
    for i in range(3):
        row = [float(v) for v in x[i]]
        mu = sum(row) / 6
        var = sum((v - mu) ** 2 for v in row) / 6
        np.testing.assert_allclose(
            ln[i],
            [(v - mu) / math.sqrt(var + 1e-5) * float(g[j]) + float(bta[j]) for j, v in enumerate(row)],
            rtol=1e-5,
            atol=1e-6,
        )
        ms = sum(v * v for v in row) / 6
        np.testing.assert_allclose(
            rms[i], [v / math.sqrt(ms + 1e-6) * float(g[j]) for j, v in enumerate(row)], rtol=1e-5, atol=1e-6
        )
    w, bias = f32(4, 6), f32(4)
    lin = run_op("linear", [x], params=(w, bias))
    for i, o in itertools.product(range(3), range(4)):
        ref = sum(float(x[i, k]) * float(w[o, k]) for k in range(6)) + float(bias[o])
        assert lin[i, o] == pytest.approx(ref, rel=1e-5, abs=1e-6)
    xi = f32(2, 3, 2, 2)
    gm, bt, mu, var = f32(3), f32(3), f32(3), f32(3, lo=0.5, hi=1.5)
    bn = run_op("batch_norm", [xi], params=(gm, bt, mu, var), eps=1e-5)
    for n, c, h, ww in itertools.product(range(2), range(3), range(2), range(2)):
        ref = (float(xi[n, c, h, ww]) - float(mu[c])) / math.sqrt(float(var[c]) + 1e-5) * float(
            gm[c]
        ) + float(bt[c])
        assert bn[n, c, h, ww] == pytest.approx(ref, rel=1e-5, abs=1e-6)
    ge = run_op("gelu", [x])
    gt = run_op("gelu", [x], approximate="tanh")
    k = math.sqrt(2 / math.pi)
    np.testing.assert_allclose(
        ge,
        scalar_map(lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))), x).astype(np.float64),
        rtol=1e-5,
        atol=1e-7,
    )
    np.testing.assert_allclose(
        gt,
        scalar_map(lambda v: 0.5 * v * (1 + math.tanh(k * (v + 0.044715 * v**3))), x).astype(np.float64),
        rtol=1e-5,
        atol=1e-7,
    )


ACTIVATION_CASES = {
    "leaky_relu": (lambda x: x if x >= 0 else 0.1 * x, {"alpha": 0.1}),
    "hard_sigmoid": (lambda x: max(0.0, min(1.0, 0.25 * x + 0.4)), {"alpha": 0.25, "beta": 0.4}),
    "hard_swish": (lambda x: x * max(0.0, min(1.0, x / 6 + 0.5)), {}),
}


@pytest.mark.parametrize("op", sorted(ACTIVATION_CASES))
def test_activations(op):
    fn, attrs = ACTIVATION_CASES[op]
    x = f32(4, 13, lo=-8, hi=8)
    got = run_op(op, [x], **attrs)
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, scalar_map(fn, x).astype(np.float64), rtol=2e-6, atol=1e-7)


COVERED = (
    set(UNARY_CASES)
    | set(ACTIVATION_CASES)
    | set(BINARY_CASES)
    | set(COMPARE_CASES)
    | {
        "logical_and",
        "logical_or",
        "logical_not",
        "where",
        "cast",
        "constant",
        "broadcast_to",
        "reshape",
        "transpose",
        "expand_dims",
        "squeeze",
        "concat",
        "slice",
        "pad",
        "gather",
        "reduce_sum",
        "reduce_max",
        "reduce_min",
        "reduce_mean",
        "matmul",
        "batch_matmul",
        "conv2d",
        "max_pool2d",
        "avg_pool2d",
        "global_avg_pool2d",
        "softmax",
        "log_softmax",
        "layer_norm",
        "rms_norm",
        "linear",
        "batch_norm",
        "gelu",
    }
)


def test_every_registered_op_has_a_reference_case():
    assert {op.name for op in all_ops()} - COVERED == set()


@pytest.mark.parametrize("dtype", ["float16", "int32", "int64"])
def test_other_dtypes(dtype):
    a = (rng.standard_normal((4, 5)) * 3).astype(dtype)
    b = (rng.standard_normal((5,)) * 3).astype(dtype)
    got = run_op("maximum", [a, b])
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, scalar_map(max, a, b).astype(dtype))
    s = run_op("reduce_sum", [a], axes=(1,))
    assert s.dtype == np.dtype(dtype)
    np.testing.assert_allclose(s.astype(np.float64), a.astype(np.float64).sum(axis=1), rtol=2e-3)
