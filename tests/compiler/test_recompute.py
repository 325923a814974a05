"""Recompute vs materialize (compiler/recompute.py, compiler/plan_rewrite.py): a cheap producer read by
several groups is copied into each reader when the plan turns its ``r<p>`` edge on; the value is then never
an output of any group (nothing materializes it) and the model still computes the numpy reference."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler.build import compile as kiln_compile
from compiler.builder import GraphBuilder
from compiler.fusion import all_edges, fuse, regions
from compiler.passes import optimize
from compiler.reference import random_inputs, run_reference
from tests.compiler.test_fusion import small_model


def two_row_spaces():
    """exp(x) read by a row reduction and a column reduction: two groups (different rows), so the rules
    materialize exp(x) as an output of the first and read it back in the second."""
    b = GraphBuilder("two_row_spaces")
    x = b.input("x", (6, 10))
    e = b.exp(b.multiply(x, 0.5))
    return optimize(b.build([b.reduce_sum(e, 1), b.reduce_max(e, 0)]))


def _check(g, plan) -> None:
    x = random_inputs(g, 2)
    outs = kiln_compile(g, "cpu", plan=plan).run(x)
    for o, ref in zip(outs, run_reference(g, x)):
        np.testing.assert_allclose(o, ref, rtol=2e-4, atol=2e-4)


def test_recomputed_producer_is_never_materialized():
    g = two_row_spaces()
    (edge,) = [e for e in all_edges(g) if e.rule == "recompute" and e.producer.op == "exp"]
    assert not edge.default
    rules = fuse(g)
    assert any(v.producer.op == "exp" for grp in rules.groups for v in grp.outputs)  # materialized
    fused = fuse(g, {edge.id: True})
    assert [sum(n.op == "exp" for n in grp.nodes) for grp in fused.groups] == [1, 1]
    assert not any(v.producer.op == "exp" for grp in fused.groups for v in grp.outputs)
    assert {fused.source(n).name for grp in fused.groups for n in grp.nodes if n.op == "exp"} == {"exp"}
    (region,) = regions(g)
    assert region.local_ids[edge.id] in region.rule_plan()  # offered to the plan search
    _check(g, {edge.id: True})


@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_recompute_with_other_flips_compiles_and_matches_numpy(data):
    g = two_row_spaces()
    plan = {}
    for r in regions(g):
        local = {k: data.draw(st.booleans(), label=k) for k in sorted(r.rule_plan())}
        plan.update(r.to_global(local))
    _check(g, plan)


def test_zoo_recompute_edges_are_offered_where_they_change_groups():
    """Softmax's scaled scores (read by its max and its subtract) and LayerNorm's input (read by its mean and
    its centring) live in one group under the rules: copying them changes nothing and is not offered; in
    attention, copying the 1/sqrt(d) scale into softmax (so the QK^T kernel writes the raw scores for it)
    does change the groups and is offered; every zoo candidate, turned on, computes the reference."""
    offered = {}
    for name in ("attention", "encoder_layer", "layernorm", "softmax"):
        g = small_model(name)
        found = [e for e in all_edges(g) if e.rule == "recompute"]
        assert found, name
        offered[name] = sorted(
            r.describe_edge(r.local_ids[e.id]) for r in regions(g) for e in r.edges if e.rule == "recompute"
        )
        for e in found:
            _check(g, {e.id: True})
    assert offered["layernorm"] == offered["softmax"] == []
    assert offered["attention"] == ["r12 multiply->subtract (recompute)"]
    # + the residual adds copied into the LayerNorms after them (the GEMM then writes its own result)
    assert offered["encoder_layer"] == [
        "r12 multiply->subtract (recompute)",
        "r31 add->subtract (recompute)",
        "r52 add->subtract (recompute)",
    ]
