"""Every supported ONNX op: a one-node (or few-node) model built with onnx.helper, imported, and compared
with onnxruntime through every Kiln path, the compiled CPU model included (see onnx_util.kiln_outputs).
Ops whose signature changed between opsets are tested at opset 13 and at the newest one Kiln imports."""

from __future__ import annotations

import numpy as np
import pytest

from tests.compiler.frontend.onnx_util import (
    F32,
    NEWEST,
    TensorProto,
    check_model,
    helper,
    init,
    make_model,
    single_op,
    tinfo,
)

rng = np.random.default_rng(7)
I64, BOOL = TensorProto.INT64, TensorProto.BOOL


def w(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def ops_of(graph) -> set[str]:
    return {n.op for n in graph.nodes}


# ----------------------------------------------------------------- elementwise
UNARY = ["Neg", "Abs", "Exp", "Tanh", "Erf", "Sigmoid", "Relu", "HardSwish", "Softsign", "Elu", "Selu"]


@pytest.mark.parametrize("op", UNARY)
def test_unary(op):
    check_model(single_op(op, [("x", [3, 17], F32)], opset=14 if op == "HardSwish" else 13))


@pytest.mark.parametrize("op", ["Sqrt", "Log", "Reciprocal"])
def test_unary_positive(op):
    m = single_op(op, [("x", [3, 17], F32)])
    check_model(m, feeds={"x": rng.uniform(0.1, 4, (3, 17)).astype(np.float32)})


def test_not():
    check_model(single_op("Not", [("x", [4, 5], BOOL)], out_elem=BOOL))


@pytest.mark.parametrize(
    "op,attrs",
    [
        ("LeakyRelu", {"alpha": 0.2}),
        ("LeakyRelu", {}),
        ("HardSigmoid", {}),
        ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}),
        ("Softplus", {}),
    ],
)
def test_activation_attrs(op, attrs):
    g = check_model(single_op(op, [("x", [2, 33], F32)], **attrs), feeds={"x": w(2, 33, scale=4)})
    if op == "LeakyRelu":
        assert ops_of(g) == {"leaky_relu"}


@pytest.mark.parametrize("opset", [20, NEWEST])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_op(opset, approximate):
    g = check_model(single_op("Gelu", [("x", [4, 16], F32)], opset=opset, approximate=approximate))
    assert [n.op for n in g.nodes] == ["gelu"] and g.nodes[0].attrs["approximate"] == approximate


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Pow"])
def test_binary_broadcast(op):
    m = single_op(op, [("a", [2, 1, 5], F32), ("b", [3, 1], F32)])
    check_model(m, feeds={"a": rng.uniform(0.5, 2, (2, 1, 5)).astype(np.float32), "b": w(3, 1)})


@pytest.mark.parametrize("exponent", [2.0, 3.0, 0.5, 1.0, 1.7])
def test_pow_constant_exponent(exponent):
    m = single_op(
        "Pow", [("x", [4, 8], F32)], extra_inputs=["e"], initializers=[init("e", np.float32(exponent))]
    )
    g = check_model(m, feeds={"x": rng.uniform(0.1, 3, (4, 8)).astype(np.float32)})
    assert "power" not in ops_of(g) or exponent == 1.7


def test_pow_int_exponent_and_scalar_initializers():
    m = make_model(
        [
            helper.make_node("Pow", ["x", "two"], ["p"]),
            helper.make_node("Add", ["p", "one"], ["y"]),
        ],
        [tinfo("x", [3, 4])],
        [tinfo("y", [3, 4])],
        [init("two", np.array(2, np.int64)), init("one", np.array([1.0], np.float32))],
    )
    g = check_model(m)
    assert not g.params  # both size-1 initializers became scalar literals
    assert sum(n.op == "constant" for n in g.nodes) == 1


@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
def test_compare(op):
    m = single_op(op, [("a", [4, 5], F32), ("b", [5], F32)], out_elem=BOOL)
    feeds = {
        "a": rng.integers(0, 3, (4, 5)).astype(np.float32),
        "b": rng.integers(0, 3, 5).astype(np.float32),
    }
    check_model(m, feeds=feeds)


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logic(op):
    check_model(single_op(op, [("a", [4, 5], BOOL), ("b", [1, 5], BOOL)], out_elem=BOOL))


@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean"])
def test_variadic(op):
    m = single_op(op, [("a", [3, 4], F32), ("b", [4], F32), ("c", [3, 1], F32)])
    check_model(m)
    check_model(single_op(op, [("a", [3, 4], F32)]))


def test_where_with_scalar_branch():
    m = single_op(
        "Where",
        [("c", [3, 4], BOOL), ("a", [3, 4], F32)],
        extra_inputs=["z"],
        initializers=[init("z", np.array(-1e9, np.float32))],
    )
    check_model(m)


def test_prelu_clip():
    m = single_op("PRelu", [("x", [2, 3, 4], F32)], extra_inputs=["s"], initializers=[init("s", w(3, 1))])
    check_model(m)
    m = single_op(
        "Clip",
        [("x", [2, 9], F32)],
        extra_inputs=["lo", "hi"],
        initializers=[init("lo", np.float32(0)), init("hi", np.float32(6))],
    )
    check_model(m, feeds={"x": w(2, 9, scale=5)})


@pytest.mark.parametrize("to", [TensorProto.INT32, TensorProto.INT64, TensorProto.FLOAT16, TensorProto.BOOL])
def test_cast(to):
    m = single_op("Cast", [("x", [3, 7], F32)], out_elem=to, to=to)
    check_model(m, feeds={"x": w(3, 7, scale=3)})


def test_cast_like_and_runtime_conv_weight():
    m = single_op(
        "CastLike", [("x", [3, 4], F32), ("t", [1], TensorProto.INT32)], out_elem=TensorProto.INT32, opset=15
    )
    check_model(m, feeds={"x": w(3, 4, scale=4), "t": np.zeros(1, np.int32)})
    check_model(single_op("Conv", [("x", [1, 2, 6, 6], F32), ("k", [3, 2, 3, 3], F32)], pads=[1, 1, 1, 1]))


def test_cast_to_same_type_is_identity():
    g = check_model(single_op("Cast", [("x", [3], F32)], to=F32))
    assert not g.nodes


# ------------------------------------------------------------------ matmuls
@pytest.mark.parametrize(
    "a,b",
    [
        ([4, 5], [5, 6]),
        ([2, 3, 4, 5], [2, 3, 5, 6]),
        ([2, 3, 4, 5], [5, 6]),
        ([3, 4, 5], [2, 1, 5, 6]),
        ([4, 5], [3, 5, 6]),
        ([5], [5, 6]),
        ([2, 4, 5], [5]),
        ([5], [5]),
    ],
)
def test_matmul_runtime_operands(a, b):
    check_model(single_op("MatMul", [("a", a, F32), ("b", b, F32)]))


@pytest.mark.parametrize("a", [[4, 5], [2, 3, 5], [5]])
def test_matmul_weight_becomes_linear(a):
    m = single_op("MatMul", [("x", a, F32)], extra_inputs=["W"], initializers=[init("W", w(5, 6))])
    g = check_model(m)
    assert ops_of(g) == {"linear"}
    assert g.params[0].shape == (6, 5)  # stored [out, in] like torch.nn.Linear


@pytest.mark.parametrize(
    "ta,tb,alpha,beta", [(0, 0, 1.0, 1.0), (1, 0, 0.5, 2.0), (0, 1, 1.0, 0.0), (1, 1, 2.0, 1.0)]
)
def test_gemm(ta, tb, alpha, beta):
    a_shape = [5, 4] if ta else [4, 5]
    b_arr = w(6, 5) if tb else w(5, 6)
    m = single_op(
        "Gemm",
        [("a", a_shape, F32)],
        extra_inputs=["B", "C"],
        initializers=[init("B", b_arr), init("C", w(1, 6))],
        transA=ta,
        transB=tb,
        alpha=alpha,
        beta=beta,
    )
    g = check_model(m)
    if (ta, alpha, beta) == (0, 1.0, 1.0):
        assert ops_of(g) == {"linear"}


def test_gemm_runtime_b_no_c():
    check_model(single_op("Gemm", [("a", [4, 5], F32), ("b", [6, 5], F32)], transB=1))


@pytest.mark.parametrize(
    "eq,shapes",
    [
        ("ij,jk->ik", [[3, 4], [4, 5]]),
        ("ij,kj->ik", [[3, 4], [5, 4]]),
        ("bij,bjk->bik", [[2, 3, 4], [2, 4, 5]]),
        ("bhqd,bhkd->bhqk", [[2, 3, 4, 8], [2, 3, 5, 8]]),
        ("bhqk,bhkd->bhqd", [[2, 3, 4, 5], [2, 3, 5, 8]]),
        ("bid,jd->bij", [[2, 3, 4], [5, 4]]),
        ("...ij,...jk->...ik", [[2, 3, 4], [2, 4, 5]]),
        ("bqhd,bkhd->bhqk", [[2, 4, 3, 8], [2, 5, 3, 8]]),
        ("ij->ji", [[3, 4]]),
        ("ij->i", [[3, 4]]),
        ("i,j->ij", [[3], [4]]),
        ("ij,jk,kl->il", [[2, 3], [3, 4], [4, 5]]),
    ],
)
def test_einsum(eq, shapes):
    inputs = [(f"x{i}", s, F32) for i, s in enumerate(shapes)]
    g = check_model(single_op("Einsum", inputs, equation=eq, opset=13))
    if eq == "bhqd,bhkd->bhqk":
        assert [n.op for n in g.nodes] == ["batch_matmul"] and g.nodes[0].attrs["transpose_b"]


# ----------------------------------------------------------- conv and pooling
@pytest.mark.parametrize(
    "attrs,x,wshape",
    [
        ({"pads": [1, 1, 1, 1]}, [2, 4, 9, 9], [6, 4, 3, 3]),
        ({"strides": [2, 1], "pads": [0, 1, 2, 0], "dilations": [1, 2]}, [1, 4, 9, 8], [6, 4, 3, 2]),
        ({"group": 2, "pads": [1, 1, 1, 1]}, [1, 4, 7, 7], [6, 2, 3, 3]),
        ({"group": 4}, [1, 4, 7, 7], [4, 1, 3, 3]),
        ({"auto_pad": "SAME_UPPER", "strides": [2, 2]}, [1, 3, 8, 7], [4, 3, 3, 3]),
        ({"auto_pad": "SAME_LOWER"}, [1, 3, 8, 7], [4, 3, 2, 2]),
        ({"auto_pad": "VALID"}, [1, 3, 8, 7], [4, 3, 3, 3]),
        ({"pads": [1, 2], "strides": [2]}, [2, 3, 11], [4, 3, 3]),
    ],
)
@pytest.mark.parametrize("bias", [False, True])
def test_conv(attrs, x, wshape, bias):
    extra = ["W", "B"] if bias else ["W"]
    inits = [init("W", w(*wshape, scale=0.3)), init("B", w(wshape[0]))]
    m = single_op("Conv", [("x", x, F32)], extra_inputs=extra, initializers=inits[: len(extra)], **attrs)
    check_model(m)


def test_batchnorm_inference():
    c = 5
    inits = [
        init("s", w(c)),
        init("b", w(c)),
        init("m", w(c)),
        init("v", rng.uniform(0.5, 2, c).astype(np.float32)),
    ]
    for opset in (13, 15, NEWEST):
        m = single_op(
            "BatchNormalization",
            [("x", [2, c, 4, 4], F32)],
            extra_inputs=["s", "b", "m", "v"],
            initializers=inits,
            opset=opset,
            epsilon=1e-3,
        )
        assert ops_of(check_model(m)) == {"batch_norm"}


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize(
    "attrs",
    [
        {"kernel_shape": [2, 2], "strides": [2, 2]},
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
        {"kernel_shape": [3, 2], "strides": [1, 2], "pads": [1, 0, 1, 1]},
        {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
        {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]},
        {"kernel_shape": [3, 3]},
    ],
)
def test_pool(op, attrs):
    check_model(single_op(op, [("x", [2, 3, 8, 9], F32)], **attrs))


@pytest.mark.parametrize(
    "attrs",
    [
        {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1},
        {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1, "count_include_pad": 1},
    ],
)
def test_avg_pool_count_include_pad(attrs):
    check_model(single_op("AveragePool", [("x", [1, 2, 7, 7], F32)], **attrs))


def test_pool_1d():
    check_model(single_op("MaxPool", [("x", [2, 3, 10], F32)], kernel_shape=[3], strides=[2]))


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [[2, 3, 5, 6], [2, 3, 7]])
def test_global_pool(op, shape):
    g = check_model(single_op(op, [("x", shape, F32)]))
    if op == "GlobalAveragePool" and len(shape) == 4:
        assert ops_of(g) == {"global_avg_pool2d"}


# ----------------------------------------------------- softmax and normalization
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [-1, 1])
def test_softmax(op, axis):
    check_model(single_op(op, [("x", [2, 5, 7], F32)], axis=axis))


@pytest.mark.parametrize("opset", [17, NEWEST])
@pytest.mark.parametrize("axis,bias", [(-1, True), (-2, True), (-1, False)])
def test_layer_normalization(opset, axis, bias):
    shape = [2, 3, 8]
    inner = shape[axis:]
    inits = [init("g", w(*inner)), init("b", w(*inner))]
    extra = ["g", "b"] if bias else ["g"]
    m = single_op(
        "LayerNormalization",
        [("x", shape, F32)],
        extra_inputs=extra,
        initializers=inits[: len(extra)],
        opset=opset,
        axis=axis,
        epsilon=1e-6,
    )
    assert ops_of(check_model(m)) == {"layer_norm"}


# ------------------------------------------------------------------- reductions
REDUCERS = [
    "ReduceL1",
    "ReduceMean",
    "ReduceSum",
    "ReduceMax",
    "ReduceMin",
    "ReduceL2",
    "ReduceSumSquare",
    "ReduceLogSumExp",
]


@pytest.mark.parametrize("op", REDUCERS)
@pytest.mark.parametrize("opset", [13, NEWEST])
@pytest.mark.parametrize(
    "axes,keepdims",
    [
        ([1], 1),
        ([0, 2], 0),
        ([-1], 0),
        (None, 1),
    ],
)
def test_reduce(op, opset, axes, keepdims):
    as_input = opset >= 18 or (op == "ReduceSum" and opset >= 13)
    attrs = {"keepdims": keepdims}
    extra, inits = [], []
    if axes is not None and as_input:
        extra, inits = ["axes"], [init("axes", np.array(axes, np.int64))]
    elif axes is not None:
        attrs["axes"] = axes
    m = single_op(op, [("x", [3, 4, 5], F32)], extra_inputs=extra, initializers=inits, opset=opset, **attrs)
    check_model(m)


def test_reduce_noop_with_empty_axes():
    m = single_op("ReduceSum", [("x", [3, 4], F32)], noop_with_empty_axes=1)
    g = check_model(m)
    assert not g.nodes


# ------------------------------------------------------------------ layout ops
def test_flatten_reshape_transpose():
    m = make_model(
        [
            helper.make_node("Flatten", ["x"], ["f"], axis=2),
            helper.make_node("Reshape", ["f", "shape"], ["r"]),
            helper.make_node("Transpose", ["r"], ["y"], perm=[2, 0, 1]),
        ],
        [tinfo("x", [2, 3, 4, 5])],
        [tinfo("y", None)],
        [init("shape", np.array([0, -1, 5], np.int64))],
    )
    check_model(m)


@pytest.mark.parametrize("opset", [13, NEWEST])
def test_reshape_allowzero(opset):
    attrs = {"allowzero": 1} if opset >= 14 else {}
    m = single_op(
        "Reshape",
        [("x", [2, 3, 4], F32)],
        extra_inputs=["s"],
        initializers=[init("s", np.array([4, -1, 3], np.int64))],
        opset=opset,
        **attrs,
    )
    check_model(m)


@pytest.mark.parametrize("opset", [13, NEWEST])
def test_squeeze_unsqueeze_axes_input(opset):
    m = make_model(
        [
            helper.make_node("Unsqueeze", ["x", "ax"], ["u"]),
            helper.make_node("Squeeze", ["u", "ax2"], ["s"]),
            helper.make_node("Squeeze", ["s"], ["y"]),
        ],
        [tinfo("x", [3, 1, 4])],
        [tinfo("y", [3, 4])],
        [init("ax", np.array([0, -1], np.int64)), init("ax2", np.array([0], np.int64))],
        opset=opset,
    )
    check_model(m)


@pytest.mark.parametrize("opset", [13, NEWEST])
@pytest.mark.parametrize("kind", ["sizes", "equal", "num_outputs"])
def test_split(opset, kind):
    if kind == "num_outputs" and opset < 18:
        pytest.skip("num_outputs is an opset 18 attribute")
    if kind == "equal" and opset >= 18:
        pytest.skip("opset 18 needs split sizes or num_outputs")
    extra, inits, attrs = [], [], {"axis": 1}
    if kind == "sizes":
        extra, inits = ["split"], [init("split", np.array([2, 5, 3], np.int64))]
    if kind == "num_outputs":
        attrs["num_outputs"] = 3
    dim = 10 if kind != "equal" else 9
    m = single_op(
        "Split",
        [("x", [2, dim], F32)],
        extra_inputs=extra,
        initializers=inits,
        opset=opset,
        n_outputs=3,
        **attrs,
    )
    check_model(m)


@pytest.mark.parametrize(
    "starts,ends,axes,steps",
    [
        ([1], [3], [1], None),
        ([0, -3], [2, 100], [0, 2], [1, 1]),
        ([-1], [-100000], [2], [-2]),
        ([2, 1], [9223372036854775807, 3], [-1, 0], [2, 1]),
    ],
)
def test_slice(starts, ends, axes, steps):
    names = ["starts", "ends", "axes"] + (["steps"] if steps else [])
    arrs = [starts, ends, axes] + ([steps] if steps else [])
    inits = [init(n, np.array(a, np.int64)) for n, a in zip(names, arrs)]
    check_model(single_op("Slice", [("x", [3, 4, 6], F32)], extra_inputs=names, initializers=inits))


@pytest.mark.parametrize("indices", [np.array(2), np.array([0, -1, 2]), np.array([[1, 0], [2, 2]])])
@pytest.mark.parametrize("axis", [0, 1])
def test_gather_constant_indices(indices, axis):
    m = single_op(
        "Gather",
        [("x", [3, 4, 5], F32)],
        extra_inputs=["i"],
        initializers=[init("i", indices.astype(np.int64))],
        axis=axis,
    )
    check_model(m)


def test_gather_embedding_lookup():
    m = make_model(
        [helper.make_node("Gather", ["E", "ids"], ["y"])],
        [tinfo("ids", [2, 6], I64)],
        [tinfo("y", [2, 6, 4])],
        [init("E", w(8, 4))],
    )
    g = check_model(m)
    assert ops_of(g) == {"gather"}


def test_concat_expand_tile_pad():
    m = make_model(
        [
            helper.make_node("Concat", ["a", "c"], ["cat"], axis=1),
            helper.make_node("Expand", ["cat", "shape"], ["e"]),
            helper.make_node("Tile", ["e", "reps"], ["t"]),
            helper.make_node("Pad", ["t", "pads", "val"], ["y"]),
        ],
        [tinfo("a", [3, 2])],
        [tinfo("y", None)],
        [
            init("c", w(3, 1)),
            init("shape", np.array([2, 1, 1], np.int64)),
            init("reps", np.array([1, 2, 1], np.int64)),
            init("pads", np.array([0, 1, 0, 0, -1, 2], np.int64)),
            init("val", np.float32(0.5)),
        ],
    )
    check_model(m)


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, -1, 2])
def test_trilu_runtime(upper, k):
    extra, inits = ([], []) if k is None else (["k"], [init("k", np.array(k, np.int64))])
    m = single_op(
        "Trilu", [("x", [2, 5, 6], F32)], extra_inputs=extra, initializers=inits, upper=upper, opset=14
    )
    g = check_model(m)
    assert ops_of(g) == {"where", "constant"}


def test_identity_dropout_constant():
    m = make_model(
        [
            helper.make_node("Identity", ["x"], ["i"]),
            helper.make_node("Dropout", ["i", "ratio"], ["d"]),
            helper.make_node("Constant", [], ["c"], value=helper.make_tensor("cv", F32, [4], [1, 2, 3, 4])),
            helper.make_node("Add", ["d", "c"], ["y"]),
        ],
        [tinfo("x", [3, 4])],
        [tinfo("y", [3, 4])],
        [init("ratio", np.float32(0.1))],
    )
    g = check_model(m)
    assert ops_of(g) == {"add"}


def test_shape_subgraph_folds():
    """The shape arithmetic exporters emit for x.view(B, S, H, D) / transpose is evaluated at import."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
        helper.make_node("Gather", ["s", "one"], ["t"], axis=0),
        helper.make_node("Unsqueeze", ["b", "ax0"], ["b1"]),
        helper.make_node("Unsqueeze", ["t", "ax0"], ["t1"]),
        helper.make_node("Div", ["d", "heads"], ["hd"]),
        helper.make_node("Concat", ["b1", "t1", "h1", "hd"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node(
            "ConstantOfShape", ["two"], ["ones"], value=helper.make_tensor("v", F32, [1], [1.0])
        ),
        helper.make_node("Range", ["r0", "r1", "r2"], ["rng"]),
        helper.make_node("Cast", ["rng"], ["rngf"], to=F32),
        helper.make_node("Mul", ["ones", "rngf"], ["scale"]),
        helper.make_node("Transpose", ["r"], ["tr"], perm=[0, 2, 1, 3]),
        helper.make_node("Mul", ["tr", "scale"], ["y"]),
    ]
    inits = [
        init("zero", np.array(0, np.int64)),
        init("one", np.array(1, np.int64)),
        init("ax0", np.array([0], np.int64)),
        init("h1", np.array([2], np.int64)),
        init("d", np.array([8], np.int64)),
        init("heads", np.array([2], np.int64)),
        init("two", np.array([4, 4], np.int64)),
        init("r0", np.array(0, np.int64)),
        init("r1", np.array(4, np.int64)),
        init("r2", np.array(1, np.int64)),
    ]
    m = make_model(nodes, [tinfo("x", [3, 4, 8])], [tinfo("y", [3, 2, 4, 4])], inits)
    g = check_model(m)
    assert ops_of(g) == {"reshape", "transpose", "multiply"}


def test_model_local_functions_are_inlined():
    fn = helper.make_function(
        "local",
        "Swish",
        ["a"],
        ["b"],
        [helper.make_node("Sigmoid", ["a"], ["s"]), helper.make_node("Mul", ["a", "s"], ["b"])],
        [helper.make_opsetid("", 13)],
    )
    graph = helper.make_graph(
        [helper.make_node("Swish", ["x"], ["y"], domain="local")],
        "g",
        [tinfo("x", [3, 4])],
        [tinfo("y", [3, 4])],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("local", 1)],
        functions=[fn],
        ir_version=8,
    )
    assert ops_of(check_model(model)) == {"silu"}
