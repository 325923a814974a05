"""Fusion: the groups the rules make, edge ids, plans and workload keys."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler.attention import attention_group_problem, match_core
from compiler.backends import sketch_for
from compiler.builder import GraphBuilder
from compiler.errors import KilnError
from compiler.frontend.models import MODELS, get_model
from compiler.fusion import default_plan, fuse, fusion_edges, group_from_workload, group_problem, regions
from compiler.passes import optimize
from compiler.reference import random_inputs, run_reference
from compiler.target import Target

CPU = Target.host()


def _groups(graph):
    return fuse(optimize(graph)).groups


@pytest.mark.parametrize("name", ["softmax", "rmsnorm", "layernorm"])
def test_norms_and_softmax_are_one_reduction_group(name):
    groups = _groups(get_model(name))
    assert len(groups) == 1 and groups[0].kind == "reduction"


def test_matmul_bias_relu_is_one_contraction_group():
    b = GraphBuilder()
    x = b.input("x", (8, 16))
    y = b.relu(
        b.add(b.matmul(x, b.param("w", np.ones((16, 4), np.float32))), b.param("b", np.ones(4, np.float32)))
    )
    (g,) = _groups(b.build([y]))
    assert (
        g.kind == "contraction"
        and next(n.op for n in g.nodes) == "matmul"
        and "relu" in [n.op for n in g.nodes]
    )


def test_no_elementwise_prologue_inside_a_contraction():
    b = GraphBuilder()
    x = b.input("x", (8, 16))
    y = b.matmul(b.exp(x), b.param("w", np.ones((16, 4), np.float32)))
    kinds = [(g.kind, [n.op for n in g.nodes]) for g in _groups(b.build([y]))]
    assert kinds == [("pointwise", ["exp"]), ("contraction", ["matmul"])]


def test_layout_prologue_fuses_into_batch_matmul():
    groups = _groups(get_model("attention"))
    qk = next(g for g in groups if g.anchor is not None and g.anchor.op == "batch_matmul")
    assert {"transpose", "reshape"} & {n.op for n in qk.nodes}


def test_edge_ids_are_stable_across_processes_and_names():
    code = (
        "from compiler.frontend.models import get_model; from compiler.passes import optimize;"
        "from compiler.fusion import default_plan;"
        "print(sorted(default_plan(optimize(get_model('encoder_layer'))).items()))"
    )
    outs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        for _ in range(2)
    }
    assert len(outs) == 1
    here = sorted(default_plan(optimize(get_model("encoder_layer"))).items())
    assert str(here) == outs.pop().strip()


def test_plan_overrides_defaults_and_rejects_unknown_edges():
    g = optimize(get_model("bias_gelu"))
    assert len(fuse(g).groups) == 1
    edges = fusion_edges(g)
    plan = {e.id: False for e in edges}
    split = fuse(g, plan)
    assert len(split.groups) == len([n for n in g.nodes if n.op != "constant"])
    with pytest.raises(KilnError, match="does not have"):
        fuse(g, {"e999_1000": True})
    # every plan gives the same results
    x = random_inputs(g)
    from compiler.build import compile as kiln_compile

    for p in (None, plan):
        out = kiln_compile(g, "cpu", plan=p).run(x)
        np.testing.assert_allclose(out[0], run_reference(g, x)[0], rtol=1e-5, atol=1e-5)


def test_workload_keys_shared_and_rebuildable():
    groups = _groups(get_model("encoder_layer"))
    keys = [g.workload_key for g in groups]
    assert len(set(keys)) < len(keys)  # key/value projections and the two LayerNorms share keys
    for g in groups:
        back = group_from_workload(g.canonical())
        assert back.workload_key == g.workload_key and back.kind == g.kind


def test_default_plan_matches_edges():
    g = optimize(get_model("convnet"))
    assert set(default_plan(g)) == {e.id for e in fusion_edges(g)}


# ------------------------------------------------------------------ regions and plans
# The zoo's structures at small sizes: the same regions and optional edges (checked below), quick to compile.
SMALL = {
    "softmax": {"rows": 3, "cols": 8},
    "softmax_large": {"rows": 3, "cols": 8},
    "rmsnorm": {"rows": 3, "d": 8},
    "layernorm": {"rows": 3, "d": 8},
    "bias_gelu": {"rows": 3, "d": 8},
    "matmul": {"n": 8},
    "mlp": {"batch": 4, "d_in": 8, "hidden": 8, "out": 4},
    "attention": {"seq": 4, "d": 8, "heads": 2},
    "encoder_layer": {"seq": 4, "d": 8, "ff": 16, "heads": 2},
    "convnet": {"batch": 2, "hw": 8, "c1": 4, "c2": 4},
    "resblock": {"c": 4, "hw": 6},
}


def small_model(name: str):
    return optimize(MODELS[name].build(**SMALL[name]))


def _shape_of_regions(graph):
    return [(sorted(r.rule_plan().items()), len(r.nodes)) for r in regions(graph)]


def test_small_zoo_models_have_the_zoo_regions():
    assert set(SMALL) == set(MODELS)
    for name in MODELS:
        assert _shape_of_regions(small_model(name)) == _shape_of_regions(optimize(get_model(name))), name


def test_regions_partition_the_graph_and_groups_stay_inside_one_region():
    g = optimize(get_model("encoder_layer"))
    found = regions(g)
    # the Q/K/V horizontal edge joins the attention's regions and the output projection/FFN's one
    # (44 edges, 3 of them recompute)
    assert [len(r.edges) for r in found] == [48, 4]  # 48: with the attention core's edge
    seen = [id(n) for r in found for n in r.nodes]
    assert len(seen) == len(set(seen))
    owner = {id(n): r.index for r in found for n in r.nodes}
    for group in fuse(g).groups:
        assert len({owner.get(id(n), -1 - k) for k, n in enumerate(group.nodes)}) == 1 or not any(
            id(n) in owner for n in group.nodes
        )
    (qkv,) = [e for e in found[0].edges if e.rule == "horizontal"]
    assert not qkv.default and [qkv.producer.name, qkv.consumer.name] == ["matmul", "matmul_2"]
    # a bias broadcast stays fused (its unfused form copies a weight); a flip that changes nothing is fixed
    r = found[0]
    assert "e1_2" in r.fixed and "weight" in r.fixed["e1_2"]
    assert r.fixed["e12_13"] == "flipping it alone changes no group"


def test_region_plan_translation_rejects_unknown_edges():
    (r0, r1) = regions(optimize(get_model("mlp")))
    assert r0.rule_plan() == {"e0_2": True, "e2_3": True} and r1.rule_plan() == {"e0_2": True}
    assert r1.to_global({"e0_2": False}) == {"e4_6": False}
    assert r0.flipped({"e0_2": True, "e2_3": False}) == ["e2_3"]
    with pytest.raises(KilnError, match="does not have: e9_9"):
        r0.to_global({"e9_9": True})


def _check_groups(fused) -> None:
    """Valid groups: each a legal group, in an order where every group's inputs come from earlier ones."""
    made: set[int] = set()
    for group in fused.groups:
        if group.kind == "attention":  # an attention core with its layout prologues (compiler/attention.py)
            core = match_core(fused.graph, group.anchor)
            assert core is not None and attention_group_problem(fused.graph, group.nodes, core) is None, group
        else:
            assert group_problem(group.nodes) is None, group
        for v in group.inputs:
            assert v.producer is None or id(v) in made, f"{group} reads {v} before it is made"
        made.update(id(v) for v in group.outputs)
        made.update(id(n.output) for n in group.nodes)


PLAN_MODELS = [m for m in MODELS if m not in ("matmul", "softmax_large")]  # no edges / softmax's twin


@pytest.mark.parametrize("name", PLAN_MODELS)
@settings(max_examples=3, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_sampled_plan_compiles_and_matches_numpy(name, data):
    from compiler.build import compile as kiln_compile

    g = small_model(name)
    plan = {}
    for r in regions(g, lambda group: sketch_exists(group, CPU)):
        local = {k: data.draw(st.booleans(), label=f"r{r.index}:{k}") for k in sorted(r.rule_plan())}
        plan.update(r.to_global(local))
    fused = fuse(g, plan)
    _check_groups(fused)
    x = random_inputs(g, 1)
    outs = kiln_compile(g, "cpu", plan=plan).run(x)
    for o, ref in zip(outs, run_reference(g, x)):
        np.testing.assert_allclose(o, ref, rtol=2e-4, atol=2e-4)


def sketch_exists(group, target) -> bool:
    try:
        sketch_for(group, target)
    except KilnError:
        return False
    return True
