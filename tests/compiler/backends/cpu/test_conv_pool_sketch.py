"""The CPU convolution + pooling sketch (``conv_pool`` groups): every config its space and ``check`` allow
computes the reference on the loop-IR interpreter (hypothesis draws the convolution, the pool and the
config); the fused plan of the zoo convnet and of the ONNX conv net compiles to C and matches the numpy
reference; the edge is offered to the CPU plan search and not to the CUDA one."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler.backends.cpu.sketches.conv_pool import CpuConvPoolSketch
from compiler.build import compile as kiln_compile
from compiler.builder import GraphBuilder
from compiler.errors import ScheduleError
from compiler.frontend.models import get_model
from compiler.fusion import Group, fuse, fusion_edges
from compiler.graph import Graph
from compiler.layouts import apply_input_layouts
from compiler.loopir import evaluate, lower_func
from compiler.passes import optimize
from compiler.reference import random_inputs, run_reference
from compiler.target import Target
from tests.compiler.property_graphs import inputs_for
from tests.targets import AVX2, AVX512
from tuner.plan_search import target_regions

SKETCH = CpuConvPoolSketch()
SETTINGS = settings(
    max_examples=int(os.environ.get("KILN_PROPERTY_EXAMPLES", "20")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def conv_pool_net(c: int, o: int, h: int, w: int, k: int, pad: int, pool: str, window: int) -> Graph:
    """conv2d (constant weight) + bias + ReLU, then a ``window`` x ``window`` max/avg pool of stride
    ``window``."""
    rng = np.random.default_rng(3)
    b = GraphBuilder("conv_pool")
    x = b.input("x", (1, c, h, w))
    y = b.conv2d(x, b.param("w", rng.standard_normal((o, c, k, k)).astype(np.float32)), padding=(pad, pad))
    y = b.relu(b.add(y, b.param("bias", rng.standard_normal((o, 1, 1)).astype(np.float32))))
    pooled = (b.max_pool2d if pool == "max" else b.avg_pool2d)(y, (window, window))
    return b.build([pooled])


def fused_plan(graph: Graph) -> dict[str, bool]:
    """The rules' plan with every conv -> pool edge (``pool_prologue`` into a pool after a conv) on."""
    return {
        e.id: True
        for e in fusion_edges(graph)
        if e.rule == "pool_prologue" and e.consumer.op in ("max_pool2d", "avg_pool2d")
    }


def conv_pool_groups(graph: Graph) -> list[Group]:
    return [g for g in fuse(graph, fused_plan(graph)).groups if g.kind == "conv_pool"]


@SETTINGS
@given(
    c=st.integers(1, 3),
    o=st.sampled_from([2, 4, 8]),
    h=st.sampled_from([4, 6]),
    w=st.sampled_from([4, 8, 16]),
    pad=st.integers(0, 1),
    pool=st.sampled_from(["max", "avg"]),
    window=st.sampled_from([1, 2]),
    target=st.sampled_from([AVX512, AVX2, Target.host()]),
    data=st.data(),
)
def test_every_legal_config_computes_the_reference(c, o, h, w, pad, pool, window, target, data):
    graph = optimize(conv_pool_net(c, o, h + 2 - 2 * pad, w + 2 - 2 * pad, 3, pad, pool, window))
    (group,) = conv_pool_groups(graph)
    assert SKETCH.applies(group)
    knobs = SKETCH.space(group, target)
    config = {kn.name: data.draw(st.sampled_from(kn.values), label=kn.name) for kn in knobs}
    try:
        SKETCH.check(group, config, target)
    except ScheduleError:
        config = SKETCH.default(group, target)
    func = lower_func(SKETCH.build(group, config, target).func)
    ins = inputs_for(group)
    (got,) = evaluate(func, apply_input_layouts(func.attrs, ins))
    (want,) = run_reference(group.subgraph, ins)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("target", [AVX512, AVX2], ids=["avx512", "avx2"])
def test_defaults_pass_their_check_and_illegal_configs_are_named(target):
    graph = optimize(conv_pool_net(3, 8, 8, 16, 3, 1, "max", 2))
    (group,) = conv_pool_groups(graph)
    config = SKETCH.default(group, target)
    assert config["pool_vector"] in (1, config["vector_x"])
    with pytest.raises(ScheduleError, match="pool_vector"):
        bad = {**config, "oc_tile": 1, "ry": 2, "vector_x": 4, "nr_x": 16, "pool_vector": 8}
        SKETCH.check(group, bad, target)
    with pytest.raises(ScheduleError, match="nr_x"):
        SKETCH.check(group, {**config, "nr_x": 7}, target)


def test_overlapping_or_padded_windows_are_not_fused_into_the_conv():
    rng = np.random.default_rng(0)
    b = GraphBuilder("overlap")
    x = b.input("x", (1, 2, 8, 8))
    y = b.relu(
        b.conv2d(x, b.param("w", rng.standard_normal((4, 2, 3, 3)).astype(np.float32)), padding=(1, 1))
    )
    graph = optimize(b.build([b.max_pool2d(y, (3, 3), strides=(2, 2), padding=(1, 1))]))
    groups = fuse(graph, fused_plan(graph)).groups
    assert [g.kind for g in groups if g.kind == "conv_pool"] == ["conv_pool"]  # the fusion rule allows it
    assert not any(SKETCH.applies(g) for g in groups)  # ... the CPU sketch does not
    cpu = [e for r in target_regions(graph, Target.host()) for e in r.edges if e.rule == "pool_prologue"]
    assert cpu == []


def test_convnet_offers_the_edge_on_cpu_only_and_its_fused_plan_matches_the_reference():
    graph = optimize(get_model("convnet"))
    (edge,) = [e for e in fusion_edges(graph) if e.rule == "pool_prologue"]
    assert (edge.producer.op, edge.consumer.op, edge.default) == ("relu", "max_pool2d", False)
    cpu = [e.id for r in target_regions(graph, Target.host()) for e in r.edges]
    assert edge.id in cpu
    cuda = [e.id for r in target_regions(graph, Target.cuda()) for e in r.edges]
    assert edge.id not in cuda
    x = random_inputs(graph, 1)
    assert len(conv_pool_groups(graph)) == 1
    model = kiln_compile(graph, "cpu", fused_plan(graph))
    np.testing.assert_allclose(model.run(x)[0], run_reference(graph, x)[0], rtol=1e-4, atol=1e-4)


def test_onnx_conv_net_fused_plan_matches_the_reference():
    pytest.importorskip("torch", reason="the ONNX conv net is exported from PyTorch")
    from compiler.frontend.onnx import load_onnx
    from tests.compiler.frontend.torch_nets import NETS, export

    module, x = NETS["conv_net"][1]("test")
    graph = optimize(load_onnx(export(module, x)))
    plan = fused_plan(graph)
    assert len(plan) == 2  # both conv-BN-ReLU-MaxPool stages
    assert len(conv_pool_groups(graph)) == 2
    model = kiln_compile(graph, "cpu", plan)
    inputs = [x.numpy()]
    np.testing.assert_allclose(model.run(inputs)[0], run_reference(graph, inputs)[0], rtol=1e-4, atol=1e-4)
