"""The attention-core fusion edge (compiler/attention.py): matched on the zoo and on torch-exported ONNX
attention (scale by multiply or divide, causal masks by Where, Add or a sliced buffer); off in the rules'
plan; on, one ``attention`` group holds QKᵀ .. P·V with the head layouts, alone or with the horizontal Q/K/V
edge, and the model computes the numpy reference; offered to the plan search on the CPU, never on CUDA."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.attention import match_cores
from compiler.backends import get_backend
from compiler.build import compile as kiln_compile
from compiler.builder import GraphBuilder
from compiler.errors import KilnError
from compiler.frontend.onnx import load_onnx
from compiler.fusion import Group, all_edges, attention_edges, default_plan, fuse, regions
from compiler.passes import optimize
from compiler.reference import random_inputs, run_reference
from compiler.target import Target
from tests.compiler.frontend import onnx_nets as L
from tests.compiler.test_fusion import small_model

CORE_OPS = [
    "batch_matmul",
    "multiply",
    "reduce_max",
    "broadcast_to",
    "subtract",
    "exp",
    "reduce_sum",
    "broadcast_to",
    "divide",
    "batch_matmul",
]


def _check(g, plan) -> None:
    x = random_inputs(g, 3)
    outs = kiln_compile(g, "cpu", plan=plan).run(x)
    for o, ref in zip(outs, run_reference(g, x)):
        np.testing.assert_allclose(o, ref, rtol=2e-4, atol=2e-4)


def _has_sketch(target: Target):
    backend = get_backend(target)

    def has(group: Group) -> bool:
        try:
            backend.sketch_for(group, target)
        except KilnError:
            return False
        return True

    return has


@pytest.mark.parametrize("name", ["attention", "encoder_layer"])
def test_zoo_core_is_one_group_with_its_head_layouts(name):
    g = small_model(name)
    (edge,) = attention_edges(g)
    assert edge.rule == "attention" and default_plan(g)[edge.id] is False  # the rules leave it off
    assert all(grp.kind != "attention" for grp in fuse(g).groups)
    fused = fuse(g, {edge.id: True})
    (core,) = [grp for grp in fused.groups if grp.kind == "attention"]
    assert [n.op for n in core.nodes if n.op not in ("reshape", "transpose")] == CORE_OPS
    assert (
        sorted(n.op for n in core.nodes if n.op in ("reshape", "transpose"))
        == ["reshape"] * 3 + ["transpose"] * 3
    )  # Q, K, V read through the head split, never copied
    assert len(fused.groups) == len(fuse(g).groups) - 2  # QKᵀ, softmax and P·V were three kernels
    _check(g, {edge.id: True})


def test_core_with_the_horizontal_qkv_edge_reads_slices_of_the_merged_gemm():
    g = small_model("attention")
    plan = {e.id: True for e in all_edges(g) if e.rule in ("attention", "horizontal")}
    assert len(plan) == 2
    fused = fuse(g, plan)
    (core,) = [grp for grp in fused.groups if grp.kind == "attention"]
    assert sum(n.op == "slice" for n in core.nodes) == 3
    assert [grp.kind for grp in fused.groups] == ["contraction", "attention", "contraction"]
    _check(g, plan)


ONNX_FORMS = {
    "attention (mul scale)": lambda: L.attention_model(8, 16, 2),
    "encoder layer (div scale)": lambda: L.encoder_model(8, 16, 2, 32),
    "gpt block, Where mask": lambda: L.gpt_model(2, 8, 16, 2, mask="where"),
    "gpt block, additive mask": lambda: L.gpt_model(1, 8, 16, 2, mask="add"),
    "gpt block, sliced mask buffer": lambda: L.gpt_model(1, 8, 16, 2, mask="bias_slice"),
}


@pytest.mark.parametrize("form", list(ONNX_FORMS))
def test_onnx_exported_attention_is_matched_and_computes_the_reference(form):
    g = optimize(load_onnx(ONNX_FORMS[form]()))
    (edge,) = attention_edges(g)
    fused = fuse(g, {edge.id: True})
    assert sum(grp.kind == "attention" for grp in fused.groups) == 1
    _check(g, {edge.id: True})


def test_onnx_split_scale_is_matched():
    """torch's scaled_dot_product_attention export scales Q and Kᵀ by sqrt(scale) each before the product;
    the optimizer moves the scaling onto the scores, where it is a score op of the core."""
    net = L.Net(3)
    y = L.attention(net, "x", 8, 16, 2, scale_style="split")
    g = optimize(load_onnx(net.model([("x", [1, 8, 16])], [y])))
    (core,) = match_cores(g)
    assert [n.op for n in core.chain] == ["multiply"]
    _check(g, {attention_edges(g)[0].id: True})


def _probs_graph(extra_output: bool, axis: int):
    b = GraphBuilder("probs")
    q, k, v = (b.input(n, (1, 2, 8, 4)) for n in "qkv")
    p = b.softmax(b.multiply(b.batch_matmul(q, k, transpose_b=True), 0.5), axis=axis)
    out = b.batch_matmul(p, v)
    return optimize(b.build([out, p] if extra_output else [out]))


def test_no_core_when_the_probabilities_are_read_elsewhere_or_softmax_runs_over_queries():
    assert len(attention_edges(_probs_graph(False, -1))) == 1
    assert attention_edges(_probs_graph(True, -1)) == []  # the probabilities are a model output
    assert attention_edges(_probs_graph(False, 2)) == []  # softmax over the query axis


def test_plan_search_regions_offer_the_edge_on_the_cpu_and_never_on_cuda():
    g = small_model("encoder_layer")
    (edge,) = attention_edges(g)
    cpu = Target.parse("cpu")
    offered = [e.id for r in regions(g, _has_sketch(cpu), cpu) for e in r.edges]
    assert edge.id in offered
    cuda = Target.parse("cuda/sm_90/NVIDIA H100 PCIe")
    cuda_regions = regions(g, _has_sketch(cuda), cuda)
    assert edge.id not in [e.id for r in cuda_regions for e in r.edges]
    fixed = {k: v for r in cuda_regions for k, v in r.fixed.items()}
    assert fixed[edge.id].startswith("no sketch")


@pytest.mark.parametrize("mask", ["where", "add"])
def test_a_masked_core_is_offered_in_its_region(mask):
    """In a region's own subgraph the mask (a model constant) is an input marked constant: the region still
    matches the core, so the plan search can flip it."""
    g = optimize(load_onnx(L.gpt_model(1, 8, 16, 2, mask=mask)))
    (edge,) = attention_edges(g)
    cpu = Target.parse("cpu")
    found = regions(g, _has_sketch(cpu), cpu)
    assert edge.id in [e.id for r in found for e in r.edges]
