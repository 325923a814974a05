"""Property tests over the CUDA knob spaces: a config drawn at random for a random small shape either
fails ``check`` or, built, lowered and run in the SIMT interpreter (lockstep threads, barrier, race and
warp-shuffle checks), computes the numpy reference."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler.graph import Graph
from tests.compiler.backends.cuda.util import CUDA, check_group
from tests.compiler.property_graphs import (
    EPILOGUES,
    REDUCERS,
    UNARY,
    batch_matmul_graph,
    conv_graph,
    legal_configs,
    matmul_graph,
    pointwise_graph,
    pooling_graph,
    reduction_graph,
)

SETTINGS = settings(
    max_examples=int(os.environ.get("KILN_CUDA_PROPERTY_EXAMPLES", "12")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=os.environ.get("KILN_PROPERTY_RANDOM") is None,
)


def check_all_groups(graph: Graph, data: st.DataObject, kind: str) -> None:
    for group, _sketch, config in legal_configs(graph, data, kind, CUDA):
        check_group(group, config)


@SETTINGS
@given(
    rows=st.integers(1, 5),
    cols=st.sampled_from([1, 3, 4, 8, 12, 16, 32]),
    ops=st.lists(st.sampled_from(UNARY), min_size=1, max_size=3),
    bias=st.booleans(),
    three_d=st.booleans(),
    data=st.data(),
)
def test_pointwise(rows, cols, ops, bias, three_d, data):
    check_all_groups(pointwise_graph(rows, cols, ops, bias, three_d), data, "pointwise")


@SETTINGS
@given(
    hw=st.integers(3, 7),
    k=st.integers(1, 3),
    s=st.integers(1, 2),
    pad=st.integers(0, 1),
    avg=st.booleans(),
    data=st.data(),
)
def test_pooling(hw, k, s, pad, avg, data):
    check_all_groups(pooling_graph(hw, k, s, pad, avg), data, "pointwise")


@SETTINGS
@given(
    op=st.sampled_from(REDUCERS),
    rows=st.integers(1, 4),
    cols=st.sampled_from([4, 8, 12, 16, 32, 48, 64, 96]),
    lead=st.booleans(),
    axis0=st.booleans(),
    data=st.data(),
)
def test_reduction(op, rows, cols, lead, axis0, data):
    check_all_groups(reduction_graph(op, rows, cols, lead, axis0), data, "reduction")


@SETTINGS
@given(
    m=st.integers(1, 40),
    n=st.integers(1, 40),
    k=st.integers(1, 24),
    ta=st.booleans(),
    tb=st.booleans(),
    epilogue=st.sampled_from(EPILOGUES),
    data=st.data(),
)
def test_matmul(m, n, k, ta, tb, epilogue, data):
    check_all_groups(matmul_graph(m, n, k, ta, tb, epilogue), data, "contraction")


@SETTINGS
@given(
    batch=st.sampled_from([(1,), (3,), (2, 2)]),
    m=st.integers(1, 12),
    n=st.integers(1, 12),
    k=st.integers(1, 9),
    tb=st.booleans(),
    bcast=st.booleans(),
    data=st.data(),
)
def test_batch_matmul(batch, m, n, k, tb, bcast, data):
    check_all_groups(batch_matmul_graph(batch, m, n, k, tb, bcast), data, "contraction")


@SETTINGS
@given(
    c=st.integers(1, 3),
    o=st.sampled_from([2, 4, 8]),
    hw=st.integers(3, 6),
    k=st.integers(1, 3),
    s=st.integers(1, 2),
    pad=st.integers(0, 1),
    groups=st.sampled_from([1, 2]),
    data=st.data(),
)
def test_conv2d(c, o, hw, k, s, pad, groups, data):
    check_all_groups(conv_graph(c, o, hw, k, s, pad, groups), data, "contraction")


@SETTINGS
@given(m=st.integers(1, 24), k=st.integers(1, 12), data=st.data())
def test_matmul_of_a_tensor_with_its_own_transpose(m, k, data):
    """Both operands are one buffer (x @ x^T): operands are told apart by their side of the product."""
    from compiler.builder import GraphBuilder

    b = GraphBuilder("gram")
    x = b.input("x", (m, k))
    check_all_groups(b.build([b.matmul(x, x, transpose_b=True)]), data, "contraction")
