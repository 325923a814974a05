"""Property tests over the CUDA knob spaces: a config drawn at random for a random small shape either
fails ``check`` or, built, lowered and run in the SIMT interpreter (lockstep threads, barrier, race and
warp-shuffle checks), computes the numpy reference."""

from __future__ import annotations

import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler.builder import GraphBuilder
from compiler.errors import ScheduleError
from compiler.fusion import fuse
from compiler.graph import Graph
from compiler.passes import optimize
from compiler.sketches import sketch_for
from tests.compiler.cuda.util import CUDA, check_group

SETTINGS = settings(
    max_examples=int(os.environ.get("KILN_CUDA_PROPERTY_EXAMPLES", "12")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=os.environ.get("KILN_PROPERTY_RANDOM") is None,
)


def check_all_groups(graph: Graph, data: st.DataObject, kind: str) -> None:
    seen = 0
    for group in fuse(optimize(graph)).groups:
        if group.kind != kind or group.is_view:
            continue
        seen += 1
        sketch = sketch_for(group)
        config = {
            k.name: data.draw(st.sampled_from(k.values), label=k.name) for k in sketch.space(group, CUDA)
        }
        try:
            sketch.check(group, config, CUDA)
        except ScheduleError:
            continue  # rejected up front: allowed
        check_group(group, config)
    assert seen, f"no {kind} group in the test graph"


UNARY = ["exp", "tanh", "relu", "sigmoid", "erf", "neg"]


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
    b = GraphBuilder("pw")
    shape = (2, rows, cols) if three_d else (rows, cols)
    x = b.input("x", shape)
    y = b.add(x, b.param("b", np.linspace(-1, 1, cols, dtype=np.float32))) if bias else x
    for op in ops:
        y = b.apply(op, y)
    y = b.where(b.greater(y, 0.25), y, b.multiply(y, 2.0))
    check_all_groups(b.build([y]), data, "pointwise")


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
    pad = min(pad, k - 1)
    b = GraphBuilder("pool")
    x = b.input("x", (1, 2, hw, hw + 1))
    y = b.avg_pool2d(x, (k, k), (s, s), (pad, pad)) if avg else b.max_pool2d(x, (k, k), (s, s), (pad, pad))
    check_all_groups(b.build([b.relu(y)]), data, "pointwise")


REDUCERS = ["softmax", "log_softmax", "layer_norm", "rms_norm", "reduce_sum", "reduce_mean", "reduce_max"]


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
    b = GraphBuilder("red")
    shape = (2, rows, cols) if lead else (rows, cols)
    x = b.input("x", shape)
    w = b.param("w", np.linspace(0.5, 1.5, cols, dtype=np.float32))
    if op == "layer_norm":
        y = b.layer_norm(x, w, b.param("bb", np.linspace(-1, 1, cols, dtype=np.float32)))
    elif op == "rms_norm":
        y = b.rms_norm(x, w)
    elif op in ("softmax", "log_softmax"):
        y = b.apply(op, x, axis=-1)
    else:  # plain reductions, over the last axis or (non-row form) over the first
        y = b.apply(op, x, axes=[0] if axis0 else [-1], keepdims=not axis0)
    check_all_groups(b.build([y]), data, "reduction")


@SETTINGS
@given(
    m=st.integers(1, 40),
    n=st.integers(1, 40),
    k=st.integers(1, 24),
    ta=st.booleans(),
    tb=st.booleans(),
    epilogue=st.sampled_from(["none", "bias", "bias_relu", "residual"]),
    data=st.data(),
)
def test_matmul(m, n, k, ta, tb, epilogue, data):
    b = GraphBuilder("mm")
    a = b.input("a", (k, m) if ta else (m, k))
    w = b.input("w", (n, k) if tb else (k, n))
    y = b.matmul(a, w, transpose_a=ta, transpose_b=tb)
    if epilogue.startswith("bias"):
        y = b.add(y, b.param("bias", np.linspace(-1, 1, n, dtype=np.float32)))
    if epilogue == "bias_relu":
        y = b.relu(y)
    if epilogue == "residual":
        y = b.add(y, b.input("r", (m, n)))
    check_all_groups(b.build([y]), data, "contraction")


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
    b = GraphBuilder("bmm")
    a = b.input("a", (*batch, m, k))
    wb = (1,) * len(batch) if bcast else batch
    w = b.input("w", (*wb, n, k) if tb else (*wb, k, n))
    check_all_groups(b.build([b.multiply(b.batch_matmul(a, w, transpose_b=tb), 0.5)]), data, "contraction")


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
    c = c * groups
    b = GraphBuilder("conv")
    x = b.input("x", (1, c, hw, hw))
    w = b.param("w", np.random.default_rng(1).standard_normal((o, c // groups, k, k)).astype(np.float32))
    y = b.conv2d(x, w, strides=(s, s), padding=(pad, pad), groups=groups)
    y = b.relu(b.add(y, b.param("bias", np.ones((o, 1, 1), np.float32))))
    check_all_groups(b.build([y]), data, "contraction")
