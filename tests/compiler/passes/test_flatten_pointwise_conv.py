"""flatten_pointwise_conv: a 1x1 stride-1 unpadded convolution runs on its image viewed as one row of
pixels, its elementwise epilogue moved into that view with it; every rewritten graph computes what the
original did, and other convolutions and operands it cannot move are left alone."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler.builder import GraphBuilder
from compiler.fusion import fuse
from compiler.passes import flatten_pointwise_conv, optimize
from compiler.reference import run_reference

RNG = np.random.default_rng(0)


def param(b: GraphBuilder, name: str, shape: tuple[int, ...]):
    return b.param(name, RNG.standard_normal(shape).astype(np.float32))


def inverted_residual(n: int = 1, c: int = 4, h: int = 6, w: int = 5, hidden: int = 12):
    """1x1 expand + bias + ReLU6, depthwise 3x3 + bias + ReLU6, 1x1 project + bias + residual."""
    b = GraphBuilder("ir")
    x = b.input("x", (n, c, h, w))
    y = b.add(b.conv2d(x, param(b, "w1", (hidden, c, 1, 1))), param(b, "b1", (hidden, 1, 1)))
    y = b.minimum(b.maximum(y, b.constant(0.0)), b.constant(6.0))
    y = b.conv2d(y, param(b, "w2", (hidden, 1, 3, 3)), padding=(1, 1), groups=hidden)
    y = b.relu(b.add(y, param(b, "b2", (1, hidden, 1, 1))))
    y = b.add(b.conv2d(y, param(b, "w3", (c, hidden, 1, 1))), param(b, "b3", (c, 1, 1)))
    return b.build([b.add(y, x)]), [RNG.standard_normal((n, c, h, w)).astype(np.float32)]


def convs(graph) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    return [(n.inputs[0].shape, n.inputs[1].shape) for n in graph.nodes if n.op == "conv2d"]


def assert_same(graph, rewritten, inputs) -> None:
    for got, want in zip(run_reference(rewritten, inputs), run_reference(graph, inputs)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_pointwise_convolutions_read_one_row_and_keep_their_epilogues():
    graph, inputs = inverted_residual()
    opt = optimize(graph)
    assert convs(opt) == [
        ((1, 4, 1, 30), (12, 4, 1, 1)),
        ((1, 12, 6, 5), (12, 1, 3, 3)),
        ((1, 12, 6, 5), (4, 12, 1, 1)),  # its chain ends in the graph output: left as it is
    ]
    assert_same(graph, opt, inputs)
    # each convolution's bias / activation / residual is still its fused epilogue: three kernels
    kernels = [g for g in fuse(opt).groups if not g.is_view]
    assert len(kernels) == 3
    assert all(g.anchor is not None and g.anchor.op == "conv2d" for g in kernels)


@pytest.mark.parametrize(
    "kwargs",
    [{"strides": (2, 2)}, {"padding": (1, 1)}, {"dilation": (2, 2)}],
    ids=["strided", "padded", "dilated"],
)
def test_other_convolutions_are_left_alone(kwargs):
    b = GraphBuilder("g")
    x = b.input("x", (1, 3, 6, 6))
    b_out = b.relu(b.conv2d(x, param(b, "w", (4, 3, 1, 1)), **kwargs))
    graph = b.build([b_out])
    assert flatten_pointwise_conv(graph).nodes[0].op == "conv2d"
    assert convs(flatten_pointwise_conv(graph))[0][0] == (1, 3, 6, 6)


def test_a_chain_ending_in_a_graph_output_is_left_alone():
    """The output would be a view of the flat value, copied out by the runtime on every call."""
    b = GraphBuilder("g")
    x = b.input("x", (1, 3, 4, 4))
    y = b.relu(b.conv2d(x, param(b, "w", (5, 3, 1, 1))))
    assert convs(optimize(b.build([y]))) == [((1, 3, 4, 4), (5, 3, 1, 1))]
    assert convs(optimize(b.build([b.transpose(y, (0, 1, 3, 2))]))) == [((1, 3, 1, 16), (5, 3, 1, 1))]


def test_an_operand_that_varies_over_pixels_is_reshaped_or_left_out():
    b = GraphBuilder("g")
    x = b.input("x", (2, 3, 4, 5))
    y = b.conv2d(x, param(b, "w", (3, 3, 1, 1)))
    y = b.add(y, param(b, "row", (5,)))  # varies along W: cannot broadcast against [N, O, 1, H*W]
    y = b.multiply(y, x)  # a full [N, O, H, W] tensor: reshaped (a view)
    graph = b.build([b.transpose(y, (0, 1, 3, 2))])
    inputs = [RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)]
    assert_same(graph, optimize(graph), inputs)


@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(1, 2),
    c=st.integers(1, 5),
    o=st.integers(1, 6),
    h=st.integers(1, 5),
    w=st.integers(1, 5),
    bias=st.sampled_from(["none", "[O,1,1]", "[1,O,1,1]"]),
    act=st.sampled_from(["relu", "relu6", "none"]),
    residual=st.booleans(),
    chained=st.booleans(),
    transposed=st.booleans(),
)
def test_every_rewrite_computes_the_original(n, c, o, h, w, bias, act, residual, chained, transposed):
    b = GraphBuilder("g")
    x = b.input("x", (n, c, h, w))
    y = b.conv2d(x, param(b, "w", (o, c, 1, 1)))
    if bias != "none":
        y = b.add(y, param(b, "bias", (o, 1, 1) if bias == "[O,1,1]" else (1, o, 1, 1)))
    if act == "relu":
        y = b.relu(y)
    elif act == "relu6":
        y = b.minimum(b.maximum(y, b.constant(0.0)), b.constant(6.0))
    if chained:
        y = b.conv2d(y, param(b, "w2", (c, o, 1, 1)))
        if residual:
            y = b.add(y, x)
    if transposed:  # not elementwise: the chain ends before the output, so the convolutions are flattened
        y = b.transpose(y, (0, 1, 3, 2))
    graph = b.build([y])
    inputs = [RNG.standard_normal((n, c, h, w)).astype(np.float32)]
    assert_same(graph, optimize(graph), inputs)
