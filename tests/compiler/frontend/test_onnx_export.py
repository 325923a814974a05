"""The ONNX exporter: every built-in zoo model and a table of small graphs covering every registered op are
exported, checked (``onnx.checker`` with full shape inference), run in onnxruntime and compared with the
numpy reference; the zoo also round-trips through the importer to the same optimized graph."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the ONNX exporter tests need the onnx package (extra 'onnx')")
ort = pytest.importorskip("onnxruntime", reason="the ONNX exporter tests run models in onnxruntime")

from compiler.builder import GraphBuilder  # noqa: E402
from compiler.frontend import onnx_export  # noqa: E402
from compiler.frontend.models import MODELS, get_model  # noqa: E402
from compiler.frontend.onnx import load_onnx  # noqa: E402
from compiler.frontend.onnx_export import (  # noqa: E402
    OnnxExportError,
    export_onnx,
    ort_feeds,
    ort_session,
    slice_bounds,
)
from compiler.graph import Graph, Value  # noqa: E402
from compiler.ops import all_ops  # noqa: E402
from compiler.passes import optimize  # noqa: E402
from compiler.reference import random_inputs, run_reference  # noqa: E402

# 13: the oldest exported; 17: LayerNormalization; 18: Reduce* axes as inputs; 20: Gelu; 23: RMSNormalization
OPSETS = (13, 17, 18, 20, 23)
IMPORT_OPSETS = (13, 17, 21)  # the importer reads opsets 13..21


def assert_close(got: np.ndarray, ref: np.ndarray, what: str) -> None:
    """max|err| <= 1e-4 * max(1, max|ref|) for floats (inf/nan in the same places); exact otherwise."""
    got, ref = np.asarray(got), np.asarray(ref)
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != reference {ref.shape}"
    assert got.dtype == ref.dtype, f"{what}: dtype {got.dtype} != reference {ref.dtype}"
    if np.issubdtype(ref.dtype, np.floating):
        finite = np.isfinite(ref)
        assert (np.isfinite(got) == finite).all(), f"{what}: inf/nan in different places"
        assert (got[~finite] == ref[~finite]).all() or np.isnan(ref[~finite]).all(), f"{what}: inf differ"
        if finite.any():
            err = float(np.abs(got[finite].astype(np.float64) - ref[finite]).max())
            scale = max(1.0, float(np.abs(ref[finite]).max()))
            assert err <= 1e-4 * scale, f"{what}: max|err| {err:.3g} > 1e-4 * {scale:.3g}"
    else:
        np.testing.assert_array_equal(got, ref, err_msg=what)


def check_export(
    graph: Graph, opset: int = 17, inputs: Sequence[np.ndarray] | None = None
) -> onnx.ModelProto:
    """Export, check with full shape inference, run in onnxruntime, compare with the numpy reference."""
    model = export_onnx(graph, opset)
    onnx.checker.check_model(model, full_check=True)  # strict shape/type inference agrees with Kiln's types
    sess = ort_session(graph, threads=1, opset=opset)
    inputs = list(random_inputs(graph) if inputs is None else inputs)
    got = sess.run(None, ort_feeds(sess, inputs))
    ref = run_reference(graph, inputs)
    assert len(got) == len(ref)
    for i, (a, r) in enumerate(zip(got, ref)):
        assert_close(a, r, f"{graph.name} (opset {opset}) output {i}")
    return model


# ----------------------------------------------------------------------------------------------- zoo
@pytest.mark.parametrize("name", list(MODELS))
def test_zoo_model_matches_reference(name):
    model = check_export(get_model(name))
    node_names = [n.name for n in model.graph.node]
    assert len(set(node_names)) == len(node_names)


@pytest.mark.parametrize("opset", IMPORT_OPSETS)
@pytest.mark.parametrize("name", list(MODELS))
def test_zoo_round_trip(name, opset):
    """export -> load_onnx -> optimize is the graph optimize makes of the original, weights included: the
    importer recognizes every form the exporter writes (LayerNormalization or its decomposition, the
    decomposed RMSNorm, Gelu or its erf formula, Gemm / MatMul+Add as linear, Transpose+MatMul as a
    transpose flag)."""
    g = get_model(name)
    back = optimize(load_onnx(export_onnx(g, opset)))
    expected = optimize(g)
    assert back.structural_hash() == expected.structural_hash(), f"\n{back}\n--- expected ---\n{expected}"
    assert back.params_hash() == expected.params_hash()


def test_composite_spellings():
    """What each composite exports to at opset 17 (and where the spelling depends on the opset)."""

    def ops(fn: Callable[[GraphBuilder, Value], Value], opset: int = 17, shape=(2, 8, 16)) -> list[str]:
        b = GraphBuilder("g")
        x = b.input("x", shape)
        return [n.op_type for n in export_onnx(b.build([fn(b, x)]), opset).graph.node]

    d = 16
    p = np.ones(d, np.float32)
    assert ops(lambda b, x: b.softmax(x)) == ["Softmax"]
    assert ops(lambda b, x: b.log_softmax(x)) == ["LogSoftmax"]
    assert ops(lambda b, x: b.layer_norm(x, b.param("g", p), b.param("b", p))) == ["LayerNormalization"]
    assert "LayerNormalization" not in ops(lambda b, x: b.layer_norm(x, b.param("g", p), b.param("b", p)), 13)
    rms = ["Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul"]
    assert ops(lambda b, x: b.rms_norm(x, b.param("w", p))) == rms
    assert ops(lambda b, x: b.rms_norm(x, b.param("w", p)), 23) == ["RMSNormalization"]
    assert ops(lambda b, x: b.gelu(x)) == ["Div", "Erf", "Add", "Mul", "Mul"]
    assert ops(lambda b, x: b.gelu(x), 20) == ["Gelu"]
    w, bias = np.ones((4, d), np.float32), np.ones(4, np.float32)

    def linear(b: GraphBuilder, x: Value) -> Value:
        return b.linear(x, b.param("w", w), b.param("b", bias))

    assert ops(linear) == ["MatMul", "Add"]  # x @ W^T (a transposed initializer) + bias
    assert ops(linear, shape=(8, d)) == ["Gemm"]
    assert ops(lambda b, x: b.reduce_mean(x, axes=[1])) == ["ReduceMean"]
    assert ops(lambda b, x: b.hard_swish(x)) == ["HardSwish"]
    assert ops(lambda b, x: b.hard_swish(x), 13) == ["HardSigmoid", "Mul"]
    assert ops(lambda b, x: b.global_avg_pool2d(x), shape=(1, 2, 3, 4)) == ["GlobalAveragePool"]
    c = np.ones(2, np.float32)

    def bn(b: GraphBuilder, x: Value, axis: int = 1) -> Value:
        return b.batch_norm(x, *(b.param(k, c) for k in "gbmv"), axis=axis)

    assert ops(bn, shape=(1, 2, 3, 4)) == ["BatchNormalization"]
    assert "BatchNormalization" not in ops(lambda b, x: bn(b, x, 3), shape=(1, 3, 4, 2))


# ----------------------------------------------------------------------------- op table
@dataclass
class Case:
    """A small graph (``build(b) -> outputs``) and, optionally, inputs other than random_inputs."""

    name: str
    build: Callable[[GraphBuilder], Sequence[Value]]
    inputs: Callable[[Graph], list[np.ndarray]] | None = None

    def graph(self) -> Graph:
        b = GraphBuilder(self.name)
        return b.build(list(self.build(b)))


_rng = np.random.default_rng(0)


def _w(*shape: int) -> np.ndarray:
    return _rng.standard_normal(shape).astype(np.float32)


def _pos(b: GraphBuilder, x: Value) -> Value:
    """|x| + 0.1: inputs for log, sqrt, reciprocal, power bases."""
    return b.add(b.abs(x), 0.1)


S = (3, 5)
CASES: list[Case] = []


def case(name: str, inputs: Callable[[Graph], list[np.ndarray]] | None = None):
    def deco(fn: Callable[[GraphBuilder], Sequence[Value]]) -> Callable:
        CASES.append(Case(name, fn, inputs))
        return fn

    return deco


for _op in ("neg", "abs", "exp", "tanh", "erf", "sigmoid", "relu", "silu"):
    case(_op)(lambda b, op=_op: [b.apply(op, b.input("x", S))])
for _op in ("log", "sqrt", "rsqrt", "reciprocal"):
    case(_op)(lambda b, op=_op: [b.apply(op, _pos(b, b.input("x", S)))])
for _op in ("add", "subtract", "multiply", "maximum", "minimum"):
    case(_op)(
        lambda b, op=_op: [
            b.apply(op, b.input("x", S), b.input("y", (5,))),
            b.apply(op, 2.0, b.input("z", S)),
        ]
    )
for _op in ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal"):
    case(f"{_op}_int")(lambda b, op=_op: [b.apply(op, b.input("x", S, "int32"), b.input("y", (5,), "int32"))])
    case(f"{_op}_float")(lambda b, op=_op: [b.apply(op, b.input("x", S), b.param("y", _w(5)))])
    case(f"{_op}_bool")(lambda b, op=_op: [b.apply(op, b.input("x", S, "bool"), b.input("y", S, "bool"))])
for _op in ("logical_and", "logical_or"):
    case(_op)(lambda b, op=_op: [b.apply(op, b.input("x", S, "bool"), b.input("y", (1, 5), "bool"))])
case("logical_not")(lambda b: [b.logical_not(b.input("x", S, "bool"))])


@case("divide")
def _divide(b):
    x = b.input("x", S)
    return [b.divide(x, _pos(b, b.input("y", (5,)))), b.divide(1.0, _pos(b, x))]


@case("divide_int")
def _divide_int(b):  # truncating division of negative numbers; the divisor is never 0
    x, y = b.input("x", S, "int32"), b.input("y", S, "int64")
    return [b.divide(b.subtract(x, 4), b.add(x, 1)), b.divide(b.subtract(y, 9), b.add(y, 1))]


@case("power")
def _power(b):
    return [b.power(_pos(b, b.input("x", S)), b.input("y", S)), b.power(b.input("z", S), 2.0)]


@case("int8_ops")
def _int8_ops(b):  # Pow and Neg lack 8-bit kernels; relu on ints; reduce_sum wraps in int8
    x, u = b.input("x", S, "int8"), b.input("u", S, "uint8")
    xs = b.subtract(x, b.constant(3, "int8"))
    return [
        b.power(x, b.constant(3, "int8")),
        b.neg(u),
        b.relu(xs),
        b.relu(b.input("z", S, "int64")),
        b.reduce_sum(b.multiply(x, x), axes=[1]),
        b.abs(xs),
    ]


@case("where")
def _where(b):
    c, x = b.input("c", S, "bool"), b.input("x", S)
    return [b.where(c, x, 0.0), b.where(b.input("d", (5,), "bool"), b.input("y", (3, 1)), x)]


@case(
    "cast", inputs=lambda g: [(np.arange(15, dtype=np.float32).reshape(S) - 7) * 0.75, *random_inputs(g)[1:]]
)
def _cast(b):
    x, i = b.input("x", S), b.input("i", S, "int32")
    return [
        b.cast(x, "int32"),  # truncates toward zero
        b.cast(x, "bool"),
        b.cast(x, "float64"),
        b.cast(x, "float16"),
        b.cast(i, "float32"),
        b.cast(i, "int8"),
        b.cast(b.cast(i, "bool"), "float32"),
    ]


@case("constant_outputs")
def _constant_outputs(b):  # constants, an input and a repeated value as graph outputs
    x = b.input("x", S)
    y = b.exp(x)
    return [
        b.constant(2.5),
        b.constant(7, "int64"),
        b.constant(True, "bool"),
        x,
        y,
        y,
        b.add(x, b.constant(1.0)),
    ]


@case("params_as_outputs")
def _params_as_outputs(b):
    p = b.param("w", _w(5))
    return [p, b.add(b.input("x", S), p), p]


@case("broadcast_to")
def _broadcast_to(b):
    return [b.broadcast_to(b.input("x", (3, 1)), (2, 3, 5)), b.broadcast_to(b.constant(1.5), (4,))]


@case("reshape")
def _reshape(b):
    return [b.reshape(b.input("x", (2, 3, 4)), (4, -1)), b.reshape(b.input("s", ()), (1, 1))]


@case("transpose")
def _transpose(b):
    x = b.input("x", (2, 3, 4))
    return [b.transpose(x), b.transpose(x, (1, 2, 0))]


@case("expand_dims")
def _expand_dims(b):
    x = b.input("x", S)
    return [b.expand_dims(x, [0, -1]), b.expand_dims(x, 1)]


@case("squeeze")
def _squeeze(b):
    x = b.input("x", (1, 3, 1, 5))
    return [b.squeeze(x), b.squeeze(x, [2]), b.squeeze(b.input("y", S))]


@case("concat")
def _concat(b):
    return [b.concat([b.input("x", S), b.input("y", (3, 2)), b.input("z", (3, 1))], axis=-1)]


@case("slice")
def _slice(b):
    x = b.input("x", (6, 7, 5))
    return [
        b.slice(x, [1, 0], [5, 7], axes=[0, 2], steps=[1, 2]),
        b.slice(x, [-1], [-8], axes=[1], steps=[-1]),  # reversed, through index 0
        b.slice(x, [5, 6], [0, 0], axes=[0, 1], steps=[-2, -3]),
        b.slice(x, [2], [100], axes=[2], steps=[4]),
        b.slice(x, [0], [7], axes=[1]),  # the whole tensor
    ]


@case("slice_empty")
def _slice_empty(b):  # an empty intermediate: a constant, and concat skips it
    x = b.input("x", S)
    empty = b.slice(x, [2], [2], axes=[0])
    return [b.concat([empty, x], axis=0), b.reduce_sum(empty, axes=[0])]


@case("pad")
def _pad(b):
    return [
        b.pad(b.input("x", S), [1, 0, 2, 3], value=1.5),
        b.pad(b.input("i", S, "int32"), [0, 2, 1, 0], value=-3.0),
        b.pad(b.input("z", S), [0, 0, 0, 0]),
    ]


@case("gather")
def _gather(b):
    data = b.input("data", (6, 4))
    idx = b.input("idx", (2, 3), "int32")  # random ints in [0, 8): 6 and 7 clipped below
    safe = b.minimum(idx, b.constant(5, "int32"))
    neg = b.param("neg", np.array([-1, 0, -4], np.int64))
    return [b.gather(data, safe, axis=0), b.gather(data, neg, axis=1), b.gather(data, b.constant(2, "int64"))]


for _op in ("reduce_sum", "reduce_max", "reduce_min", "reduce_mean"):

    @case(_op)
    def _reduce(b, op=_op):
        x = b.input("x", (2, 3, 4))
        out = [b.apply(op, x, axes=[1]), b.apply(op, x, axes=[0, 2], keepdims=True), b.apply(op, x)]
        if op != "reduce_mean":
            out.append(b.apply(op, b.input("i", (2, 3, 4), "int32"), axes=[-1]))
        out.append(b.apply(op, b.input("s", ())))  # rank 0: nothing to reduce
        return out


@case("matmul")
def _matmul(b):
    a, c = b.input("a", (4, 3)), b.input("c", (3, 4))
    w = b.param("w", _w(5, 4))
    return [
        b.matmul(a, c),
        b.matmul(c, c, transpose_a=True),
        b.matmul(a, a, transpose_b=True),
        b.matmul(a, w, transpose_a=True, transpose_b=True),
    ]


@case("batch_matmul")
def _batch_matmul(b):
    a, c = b.input("a", (2, 1, 4, 3)), b.input("c", (1, 5, 3, 6))
    return [
        b.batch_matmul(a, c),
        b.batch_matmul(a, b.input("d", (2, 5, 4, 6)), transpose_a=True),
        b.batch_matmul(c, b.input("e", (2, 1, 2, 6)), transpose_b=True),
        b.batch_matmul(c, b.input("g", (2, 5, 6, 3)), transpose_a=True, transpose_b=True),
    ]


@case("conv2d")
def _conv2d(b):
    x = b.input("x", (2, 4, 9, 8))
    return [
        b.conv2d(x, b.param("w1", _w(6, 4, 3, 3)), padding=(1, 1)),
        b.conv2d(
            x, b.param("w2", _w(4, 2, 3, 2)), strides=(2, 1), padding=(1, 0, 2, 1), dilation=(1, 2), groups=2
        ),
        b.conv2d(x, b.input("w3", (3, 4, 1, 1))),
    ]


@case("max_pool2d")
def _max_pool2d(b):
    x = b.input("x", (1, 2, 7, 6))
    return [
        b.max_pool2d(x, (2, 2)),
        b.max_pool2d(x, (3, 2), strides=(2, 1), padding=(1, 0, 1, 1)),
        b.max_pool2d(b.input("i", (1, 2, 5, 5), "int32"), (3, 3), strides=(2, 2), padding=(1, 1)),
        b.max_pool2d(b.input("u", (1, 2, 5, 5), "uint8"), (2, 2)),
    ]


@case("avg_pool2d")
def _avg_pool2d(b):
    x = b.input("x", (1, 2, 7, 6))
    return [
        b.avg_pool2d(x, (2, 2)),
        b.avg_pool2d(x, (3, 3), strides=(2, 2), padding=(1, 1, 0, 2)),
        b.avg_pool2d(x, (3, 3), strides=(2, 1), padding=(1, 1), count_include_pad=True),
        b.avg_pool2d(b.input("i", (1, 2, 6, 6), "int32"), (3, 3), padding=(1, 1)),
        # negative means truncate toward zero, as the reference's cast does
        b.avg_pool2d(
            b.subtract(b.input("j", (1, 2, 6, 5), "int64"), 5), (2, 3), strides=(2, 1), padding=(1, 1)
        ),
        b.avg_pool2d(b.input("u", (1, 2, 5, 5), "uint8"), (2, 2), padding=(1, 1), count_include_pad=True),
    ]


@case("global_avg_pool2d")
def _gap(b):
    return [b.global_avg_pool2d(b.input("x", (2, 3, 5, 4)))]


@case("softmax")
def _softmax(b):
    x = b.input("x", (2, 3, 4))
    return [b.softmax(x), b.softmax(x, axis=0), b.softmax(b.multiply(x, 30.0), axis=1)]


@case("log_softmax")
def _log_softmax(b):
    x = b.input("x", (2, 3, 4))
    return [b.log_softmax(x), b.log_softmax(x, axis=1)]


@case("layer_norm")
def _layer_norm(b):
    x = b.input("x", (2, 3, 8))
    return [
        b.layer_norm(x, b.param("g", _w(8)), b.param("b", _w(8)), eps=1e-12),
        b.layer_norm(x, b.param("g2", _w(3, 8)), b.param("b2", _w(3, 8)), axis=1),
        b.layer_norm(x, b.input("g3", (8,)), b.input("b3", (8,))),
    ]


@case("rms_norm")
def _rms_norm(b):
    x = b.input("x", (2, 3, 8))
    return [b.rms_norm(x, b.param("w", _w(8))), b.rms_norm(x, b.param("w2", _w(3, 8)), axis=1, eps=1e-3)]


@case("linear")
def _linear(b):
    x2, x3 = b.input("x2", (4, 6)), b.input("x3", (2, 3, 6))
    w, bias = b.param("w", _w(5, 6)), b.param("bias", _w(5))
    wi = b.input("wi", (5, 6))
    return [
        b.linear(x2, w, bias),
        b.linear(x2, w),
        b.linear(x3, w, bias),
        b.linear(x3, w),  # the transposed initializer is shared
        b.linear(b.input("x1", (6,)), w, bias),
        b.linear(x3, wi, b.input("bi", (5,))),
        b.linear(x2, wi),
    ]


@case("batch_norm")
def _batch_norm(b):
    def params(c: int, tag: str) -> list[Value]:
        var = np.abs(_w(c)) + 0.5
        return [b.param(f"{tag}{k}", v) for k, v in zip("gbm", (_w(c), _w(c), _w(c)))] + [
            b.param(f"{tag}v", var)
        ]

    return [
        b.batch_norm(b.input("x", (2, 3, 4, 5)), *params(3, "a")),
        b.batch_norm(b.input("y", (4, 3)), *params(3, "c"), eps=1e-3),
        b.batch_norm(b.input("z", (2, 3, 4)), *params(4, "d"), axis=-1),  # channels last: decomposed
    ]


@case("gelu")
def _gelu(b):
    x = b.multiply(b.input("x", (4, 16)), 3.0)
    return [b.gelu(x), b.gelu(x, approximate="tanh")]


@case("activations")
def _activations(b):
    x = b.multiply(b.input("x", (4, 16)), 4.0)
    return [
        b.leaky_relu(x),
        b.leaky_relu(x, alpha=1.5),
        b.hard_sigmoid(x),
        b.hard_sigmoid(x, alpha=0.3, beta=0.4),
        b.hard_swish(x),
    ]


@case("float64")
def _float64(b):
    x = b.input("x", (3, 8), "float64")
    return [b.softmax(b.exp(x)), b.layer_norm(x, b.param("g", np.ones(8)), b.param("b", np.zeros(8)))]


@case("names")
def _names(b):  # names with characters ONNX tooling dislikes, and repeats, come out sanitized and unique
    x = b.input("in/put:0", S)
    y = b.input("in put 0", S)
    p1, p2 = b.param("w", _w(5)), b.param("w", _w(5))
    return [b.add(b.add(x, p1, name="add:1"), b.multiply(y, p2, name="add:1"))]


def test_every_registered_op_has_an_export_case():
    covered = {op for c in CASES for op in c.graph().op_histogram()}
    missing = sorted(op.name for op in all_ops() if op.name not in covered)
    assert not missing, f"registered ops without an export test case: {missing}"


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("c", CASES, ids=lambda c: c.name)
def test_op_matches_reference(c, opset):
    g = c.graph()
    check_export(g, opset, c.inputs(g) if c.inputs else None)


COMPOSITES = sorted(op.name for op in all_ops() if op.is_composite)


@pytest.mark.parametrize("op", COMPOSITES)
def test_composite_without_handler_exports_its_decomposition(op, monkeypatch):
    """The fallback for a composite with no dedicated ONNX spelling: its Kiln decomposition."""
    monkeypatch.delitem(onnx_export._HANDLERS, op)
    cases = [c for c in CASES if op in c.graph().op_histogram()]
    assert cases
    for c in cases:
        g = c.graph()
        model = check_export(g, 17, c.inputs(g) if c.inputs else None)
        assert model.graph.node


def test_primitive_without_handler_is_an_error(monkeypatch):
    monkeypatch.delitem(onnx_export._HANDLERS, "exp")
    b = GraphBuilder("g")
    g = b.build([b.exp(b.input("x", S), name="e")])
    with pytest.raises(OnnxExportError, match="node 'e' \\(op exp\\): no ONNX export for op 'exp'"):
        export_onnx(g)


# --------------------------------------------------------------------------------- details
def test_names_are_sanitized_and_unique():
    g = next(c for c in CASES if c.name == "names").graph()
    model = export_onnx(g)
    assert [i.name for i in model.graph.input] == ["in_put_0", "in_put_0_1"]
    assert sorted(t.name for t in model.graph.initializer) == ["w", "w_1"]
    values = [o for n in model.graph.node for o in n.output] + [i.name for i in model.graph.input]
    values += [t.name for t in model.graph.initializer]
    assert len(set(values)) == len(values)
    assert {"add_1", "add_1_1"} <= {n.name for n in model.graph.node}


def test_slice_bounds():
    # Kiln's normalized (starts, sizes, steps) back to ONNX (starts, ends, axes, steps)
    assert slice_bounds((6, 7), (1, 0), (4, 7), (1, 1)) == ([1], [5], [0], [1])
    assert slice_bounds((6, 7), (0, 6), (6, 7), (1, -1)) == ([6], [-8], [1], [-1])
    assert slice_bounds((6, 7), (5, 0), (3, 7), (-2, 1)) == ([5], [-7], [0], [-2])
    assert slice_bounds((6, 7), (5, 0), (2, 7), (-2, 1)) == ([5], [1], [0], [-2])
    assert slice_bounds((10,), (0,), (4,), (3,)) == ([0], [10], [0], [3])
    assert slice_bounds((6, 7), (0, 0), (6, 7), (1, 1)) == ([], [], [], [])


def test_ort_session_options():
    g = get_model("mlp")
    sess = ort_session(g, threads=3)
    opts = sess.get_session_options()
    assert opts.intra_op_num_threads == 3
    assert opts.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
    assert opts.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert [i.name for i in sess.get_inputs()] == ["x"] and [o.name for o in sess.get_outputs()] == ["fc2"]
    assert ort_session(g).get_session_options().intra_op_num_threads == 0  # onnxruntime's default
    for bad in (0, -1, 1.5, True):
        with pytest.raises(OnnxExportError, match="threads"):
            ort_session(g, threads=bad)
    with pytest.raises(OnnxExportError, match="inputs"):
        ort_feeds(sess, [])


def test_opset_out_of_range():
    g = get_model("softmax")
    for opset in (12, onnx.defs.onnx_opset_version() + 1):
        with pytest.raises(OnnxExportError, match="opset"):
            export_onnx(g, opset)


def test_model_metadata():
    model = export_onnx(get_model("layernorm"))
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    assert model.ir_version == 8 and model.producer_name == "kiln" and model.graph.name == "layernorm"
    assert [i.name for i in model.graph.initializer] == ["gamma", "beta"]
    (inp,) = model.graph.input
    assert [d.dim_value for d in inp.type.tensor_type.shape.dim] == [4096, 768]
