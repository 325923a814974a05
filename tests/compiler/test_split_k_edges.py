"""Split-K as a fusion-plan edge (compiler/fusion.py ``split_k_edges``, compiler/plan_rewrite.py): on a CUDA
target a small-M, large-K matmul has an ``s<n>`` edge, on in the rules' plan, which the plan may turn off;
a large GEMM and every CPU target have none; the rewritten graph computes the numpy reference, alone and
together with a horizontal (Q/K/V) merge."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.build import plan_model
from compiler.builder import GraphBuilder
from compiler.errors import KilnError
from compiler.fusion import all_edges, default_plan, fuse
from compiler.passes import optimize
from compiler.passes.split_k import split_factor
from compiler.reference import random_inputs, run_reference
from compiler.target import Target
from tuner.plan_search import target_regions

CUDA = Target.cuda()
RNG = np.random.default_rng(0)


def projection(m: int, k: int, n: int, dtype=np.float32):
    """x [1, M, K] @ w [N, K]^T + bias, GELU (BERT's FFN layout)."""
    b = GraphBuilder("proj")
    x = b.input("x", (1, m, k), np.dtype(dtype).name)
    w = b.param("w", RNG.standard_normal((n, k)).astype(dtype))
    y = b.matmul(x, w, transpose_b=True)
    y = b.gelu(b.add(y, b.param("bias", RNG.standard_normal((n,)).astype(dtype))))
    return optimize(b.build([y]))


def qkv(m: int, k: int, n: int):
    """Three linear projections of one x (Q/K/V siblings with biases), summed."""
    b = GraphBuilder("qkv")
    x = b.input("x", (1, m, k))
    outs = []
    for name in "qkv":
        w = b.param(f"w{name}", RNG.standard_normal((n, k)).astype(np.float32))
        bias = b.param(f"b{name}", RNG.standard_normal((n,)).astype(np.float32))
        outs.append(b.add(b.matmul(x, w, transpose_b=True), bias))
    return optimize(b.build([b.add(b.add(outs[0], outs[1]), outs[2])]))


def split_edges(graph, target):
    return [e for e in all_edges(graph, target) if e.rule == "split_k"]


def check(graph, fused) -> None:
    x = random_inputs(graph, 1)
    for got, want in zip(run_reference(fused.graph, x), run_reference(graph, x)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


def test_a_small_m_gemm_has_a_split_edge_on_cuda_only():
    g = projection(128, 3072, 768)  # BERT's FFN-down: 6 tiles of 128x128 on 132 SMs
    (edge,) = split_edges(g, CUDA)
    assert edge.id.startswith("s") and edge.producer.op == "matmul" and edge.default is True
    assert split_edges(g, None) == split_edges(g, Target.host()) == [] and Target.host().sm_count is None
    cpu = [e for r in target_regions(g, Target.host()) for e in r.edges]
    assert all(e.rule != "split_k" for e in cpu)
    (region,) = target_regions(g, CUDA)
    assert region.rule_plan()[region.local_ids[edge.id]] is True  # offered to the plan search, on
    assert split_edges(projection(2048, 3072, 768), CUDA) == []  # 96 tiles: left alone
    assert split_edges(g, Target.cuda(sms=11)) == []  # 6 tiles fill more than half of an 11-SM GPU


def test_the_rules_split_on_cuda_and_the_plan_can_keep_the_gemm_whole():
    g = projection(8, 1024, 16)
    (edge,) = split_edges(g, CUDA)
    s = split_factor(8, 16, 1024, CUDA.sm_count)
    plan = plan_model(g, CUDA)  # the rules' plan: split
    kinds = [(grp.kind, [n.op for n in grp.nodes]) for grp in plan.fused.groups if not grp.is_view]
    assert [k for k, _ in kinds] == ["contraction", "reduction"], kinds
    (bmm,) = [n for n in plan.graph.nodes if n.op == "batch_matmul"]
    assert bmm.output.shape == (s, 8, 16) and s == 4
    assert {"reduce_sum", "add", "erf"} <= set(kinds[1][1])  # the epilogue fuses after the sum
    check(g, plan.fused)
    whole = plan_model(g, CUDA, plan={edge.id: False})
    assert [grp.kind for grp in whole.fused.groups if not grp.is_view] == ["contraction"]
    assert [grp.kind for grp in plan_model(g, Target.host()).fused.groups] == ["contraction"]
    assert whole.fused.decisions[edge.id] is False and plan.fused.decisions[edge.id] is True


def test_the_rules_keep_tensor_core_gemms_whole():
    """float16 (and float32 on a TF32 target) GEMMs run on tensor cores whole; their split partials would
    not: the edge is offered but off in the rules' plan."""
    g16 = projection(8, 1024, 16, np.float16)
    (edge,) = split_edges(g16, CUDA)
    assert edge.default is False
    assert "batch_matmul" not in [n.op for n in plan_model(g16, CUDA).graph.nodes]
    assert [e.default for e in split_edges(projection(8, 1024, 16), CUDA.with_tf32())] == [False]
    split = plan_model(g16, CUDA, plan={edge.id: True})  # the search may still try it
    assert [g.kind for g in split.fused.groups if not g.is_view] == ["contraction", "reduction"]


def test_a_cpu_plan_naming_a_split_edge_is_refused():
    g = projection(8, 1024, 16)
    (edge,) = split_edges(g, CUDA)
    with pytest.raises(KilnError, match=edge.id):
        fuse(g, {edge.id: True})


@pytest.mark.parametrize("split", ["all", "one", "none"])
def test_split_with_the_horizontal_merge_computes_the_reference(split):
    g = qkv(8, 512, 16)
    rule = default_plan(g, CUDA)
    (h,) = [k for k in rule if k.startswith("h")]
    splits = sorted(k for k in rule if k.startswith("s"))
    assert len(splits) == 3 and all(rule[k] for k in splits)
    plan = {**rule, h: True}
    if split != "all":
        plan.update({k: False for k in (splits[:1] if split == "one" else splits)})
    fused = fuse(g, plan, CUDA)
    ops = [n.op for n in fused.graph.nodes]
    assert ops.count("matmul") + ops.count("batch_matmul") == 1  # one merged GEMM
    assert ("batch_matmul" in ops) == (split == "all")  # split only when every sibling's edge is on
    check(g, fused)
    # vertical: the three splits without the merge, each GEMM its own partials
    alone = fuse(g, rule, CUDA)
    assert [n.op for n in alone.graph.nodes].count("batch_matmul") == 3
    check(g, alone)
