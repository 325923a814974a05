"""Fusion: the groups the rules make, edge ids, plans and workload keys."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from compiler.builder import GraphBuilder
from compiler.errors import KilnError
from compiler.frontend.models import get_model
from compiler.fusion import default_plan, fuse, fusion_edges, group_from_workload
from compiler.passes import optimize
from compiler.reference import random_inputs, run_reference


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
