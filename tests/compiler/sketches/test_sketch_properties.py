"""Property tests: for every sketch, a config drawn at random from its space on a random small shape is
either rejected up front by ``check`` or, once built, lowered and interpreted, computes the reference."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler.builder import GraphBuilder
from compiler.errors import ScheduleError
from compiler.fusion import fuse
from compiler.graph import Graph
from compiler.loopir import evaluate, lower_func
from compiler.passes import optimize
from compiler.reference import run_reference
from compiler.sketches import sketch_for
from compiler.target import Target

CPU = Target.host()
SETTINGS = settings(
    max_examples=int(os.environ.get("KILN_PROPERTY_EXAMPLES", "30")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def check_all_groups(graph: Graph, data: st.DataObject, kind: str) -> None:
    g = optimize(graph)
    seen = 0
    for group in fuse(g).groups:
        if group.kind != kind or group.is_view:
            continue
        seen += 1
        sketch = sketch_for(group)
        space = sketch.space(group, CPU)
        config = {k.name: data.draw(st.sampled_from(k.values), label=k.name) for k in space}
        try:
            sketch.check(group, config, CPU)
        except ScheduleError:
            continue  # rejected up front: allowed
        sch = sketch.build(group, config, CPU)  # must not fail for a config that passed check
        func = lower_func(sch.func)
        sub = group.subgraph
        rng = np.random.default_rng(0)
        ins = [
            rng.standard_normal(v.shape).astype(v.dtype) if v.dtype != "bool" else rng.random(v.shape) < 0.5
            for v in sub.inputs
        ]
        from compiler.layouts import apply_input_layouts

        outs = evaluate(func, apply_input_layouts(func.attrs, ins))
        refs = run_reference(sub, ins)
        for o, r in zip(outs, refs):
            o64, r64 = o.astype(np.float64), r.astype(np.float64)
            finite = np.isfinite(r64)
            same_special = (o64[~finite] == r64[~finite]) | (np.isnan(o64[~finite]) & np.isnan(r64[~finite]))
            assert same_special.all(), f"{sketch.name} {config}: inf/nan positions differ\n{sch.show_trace()}"
            scale = max(1.0, float(np.abs(r64[finite]).max(initial=0.0)))
            err = float(np.abs(o64[finite] - r64[finite]).max(initial=0.0))
            assert err <= 2e-5 * scale, f"{sketch.name} {config}: max err {err}\n{sch.show_trace()}"
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
    incl=st.booleans(),
    data=st.data(),
)
def test_pooling(hw, k, s, pad, avg, incl, data):
    pad = min(pad, k - 1)
    b = GraphBuilder("pool")
    x = b.input("x", (1, 2, hw, hw + 1))
    y = (
        b.avg_pool2d(x, (k, k), (s, s), (pad, pad), count_include_pad=incl)
        if avg
        else b.max_pool2d(x, (k, k), (s, s), (pad, pad))
    )
    check_all_groups(b.build([b.relu(y)]), data, "pointwise")


REDUCERS = ["softmax", "log_softmax", "layer_norm", "rms_norm", "reduce_sum", "reduce_mean", "reduce_max"]


@SETTINGS
@given(
    op=st.sampled_from(REDUCERS),
    rows=st.integers(1, 4),
    cols=st.sampled_from([4, 8, 12, 16, 32, 48, 64]),
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
    m=st.integers(1, 12),
    n=st.integers(1, 20),
    k=st.integers(1, 9),
    ta=st.booleans(),
    tb=st.booleans(),
    epilogue=st.sampled_from(["none", "bias", "bias_relu", "residual"]),
    weight=st.booleans(),
    data=st.data(),
)
def test_matmul(m, n, k, ta, tb, epilogue, weight, data):
    b = GraphBuilder("mm")
    a = b.input("a", (k, m) if ta else (m, k))
    wshape = (n, k) if tb else (k, n)
    # a constant weight can be pre-packed at compile time (pack_b=2), a runtime input cannot
    w = (
        b.param("w", np.linspace(-1, 1, n * k, dtype=np.float32).reshape(wshape))
        if weight
        else b.input("w", wshape)
    )
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
    m=st.integers(1, 8),
    n=st.integers(1, 12),
    k=st.integers(1, 6),
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
    c=st.integers(1, 4),
    o=st.sampled_from([2, 4, 8]),
    hw=st.integers(3, 7),
    k=st.integers(1, 3),
    s=st.integers(1, 2),
    pad=st.integers(0, 1),
    dil=st.integers(1, 2),
    groups=st.sampled_from([1, 2]),
    data=st.data(),
)
def test_conv2d(c, o, hw, k, s, pad, dil, groups, data):
    c = c * groups
    if dil * (k - 1) + 1 > hw + 2 * pad:
        dil = 1
    b = GraphBuilder("conv")
    x = b.input("x", (1, c, hw, hw))
    w = b.param("w", np.random.default_rng(1).standard_normal((o, c // groups, k, k)).astype(np.float32))
    y = b.conv2d(x, w, strides=(s, s), padding=(pad, pad), dilation=(dil, dil), groups=groups)
    y = b.relu(b.add(y, b.param("bias", np.ones((o, 1, 1), np.float32))))
    check_all_groups(b.build([y]), data, "contraction")


@pytest.mark.parametrize("kind", ["pointwise", "reduction", "contraction"])
def test_defaults_pass_their_own_check(kind):
    from compiler.frontend.models import MODELS

    for spec in MODELS.values():
        for group in fuse(optimize(spec.graph())).groups:
            if group.kind == kind:
                sk = sketch_for(group)
                sk.check(group, sk.default(group, CPU), CPU)
