"""Horizontal fusion (compiler/horizontal.py): sibling GEMMs sharing their A operand become one GEMM over
concatenated weights when the plan turns their ``h...`` edge on; the outputs are slices of the merged
buffer read by their consumers' groups (no copy kernel), and the model still computes the numpy reference."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.build import compile as kiln_compile
from compiler.builder import GraphBuilder
from compiler.fusion import all_edges, default_plan, fuse, regions
from compiler.passes import optimize
from compiler.reference import random_inputs, run_reference
from tests.compiler.test_fusion import small_model


def _horizontal(g) -> dict[str, bool]:
    return {e.id: True for e in all_edges(g) if e.rule == "horizontal"}


def _check(g, plan) -> None:
    x = random_inputs(g, 3)
    outs = kiln_compile(g, "cpu", plan=plan).run(x)
    for o, ref in zip(outs, run_reference(g, x)):
        np.testing.assert_allclose(o, ref, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("name", ["attention", "encoder_layer"])
def test_qkv_become_one_gemm_read_through_views(name):
    g = small_model(name)
    plan = _horizontal(g)
    assert list(plan) == ["h0_5_20"] and default_plan(g)["h0_5_20"] is False  # the rules leave it off
    before = [n.op for n in g.nodes]
    fused = fuse(g, plan)
    assert [n.op for n in g.nodes] == before  # the given graph is not rewritten in place
    gemms = [grp for grp in fused.groups if grp.anchor is not None and grp.anchor.op == "matmul"]
    d = g.inputs[0].shape[-1]
    assert gemms[0].outputs[0].shape[-1] == 3 * d  # one GEMM over [Wq; Wk; Wv], bias in its epilogue
    assert [n.op for n in gemms[0].nodes] == ["matmul", "broadcast_to", "add"]
    assert len(gemms) == len([grp for grp in fuse(g).groups if grp.anchor.op == "matmul"]) - 2
    slices = [n for grp in fused.groups for n in grp.nodes if n.op == "slice"]
    assert len(slices) == 3 and all(
        grp.kind == "contraction" for grp in fused.groups if any(n.op == "slice" for n in grp.nodes)
    )  # each slice is a strided view in a batch_matmul's prologue, never a copy kernel
    assert {fused.source(n).name for n in gemms[0].nodes} == {"matmul", "broadcast_to", "add"}
    _check(g, plan)


def test_horizontal_edge_with_vertical_flips_keeps_the_plans_decisions():
    g = small_model("attention")
    # e0_2: the first projection's bias add unfused -> the merged GEMM's bias add is a kernel of its own
    fused = fuse(g, {**_horizontal(g), "e0_2": False})
    kinds = [[n.op for n in grp.nodes] for grp in fused.groups]
    assert ["matmul"] in kinds
    assert any(k[:2] == ["broadcast_to", "add"] and "slice" in k for k in kinds)  # a pointwise kernel
    _check(g, {**_horizontal(g), "e0_2": False})


def test_siblings_without_a_common_bias_merge_the_gemms_only():
    b = GraphBuilder("siblings")
    x = b.input("x", (4, 8))
    rng = np.random.default_rng(0)
    w1 = b.param("w1", rng.standard_normal((8, 6)).astype(np.float32))
    w2 = b.param("w2", rng.standard_normal((8, 10)).astype(np.float32))
    y1 = b.add(b.matmul(x, w1), b.param("b1", rng.standard_normal(6).astype(np.float32)))
    y2 = b.relu(b.matmul(x, w2))
    g = optimize(b.build([y1, y2]))
    plan = _horizontal(g)
    assert len(plan) == 1
    fused = fuse(g, plan)
    (mm,) = [n for n in fused.graph.nodes if n.op == "matmul"]
    assert mm.inputs[1].shape == (8, 16) and len(fused.graph.params) == 2  # [w1 | w2] and b1
    _check(g, plan)
    (r,) = regions(g)
    assert any(e.rule == "horizontal" for e in r.edges)


def test_siblings_need_the_same_operand_and_constant_weights():
    b = GraphBuilder("not_siblings")
    x, z = b.input("x", (4, 8)), b.input("z", (4, 8))
    w = b.param("w", np.ones((8, 4), np.float32))
    y = b.add(b.matmul(x, w), b.matmul(z, w))  # different A
    y2 = b.matmul(x, b.input("wv", (8, 4)))  # a weight that is not a model constant
    g = optimize(b.build([y, y2]))
    assert not [e for e in all_edges(g) if e.rule == "horizontal"]
