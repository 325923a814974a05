"""The CUDA backend gets the same fusion-plan space as the CPU: for every region of the zoo models (small
sizes), the groups of sampled plans either have CUDA sketches whose default schedules compute the numpy
reference in the SIMT interpreter (no GPU needed), or the plan is one the search skips for cuda (a group no
CUDA sketch schedules), never one that builds wrong code."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler.backends.cuda.codegen import generate_cuda
from compiler.build import kernel_for
from compiler.frontend.models import get_model
from compiler.fusion import fuse
from compiler.passes import optimize
from compiler.target import Target
from tests.compiler.backends.cuda.conftest import compile_units
from tests.compiler.backends.cuda.util import CUDA, check_group, need_nvcc
from tests.compiler.test_fusion import PLAN_MODELS, small_model
from tuner.plan_search import plan_problem, target_regions


def test_cuda_offers_the_cpu_plan_space_less_what_it_cannot_schedule():
    for name in PLAN_MODELS:
        g = small_model(name)
        cpu = target_regions(g, Target.host())
        cuda = {r.key: r for r in target_regions(g, CUDA)}
        for r in cpu:
            offered = set(cuda[r.key].rule_plan()) if r.key in cuda else set()
            assert offered <= set(r.rule_plan()), name
            fixed = cuda[r.key].fixed if r.key in cuda else {}
            for e in r.edges:
                if r.local_ids[e.id] not in offered:
                    assert fixed.get(e.id, "").startswith("no sketch"), (name, e.id)


@pytest.mark.parametrize("name", PLAN_MODELS)
@settings(max_examples=2, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_sampled_plans_run_in_the_simt_interpreter(name, data):
    g = small_model(name)
    plan = {}
    for r in target_regions(g, CUDA):
        local = {k: data.draw(st.booleans(), label=f"r{r.index}:{k}") for k in sorted(r.rule_plan())}
        plan.update(r.to_global(local))
    problem = plan_problem(g, plan, CUDA)
    if problem is not None:  # the search skips such a plan for cuda (a reduction exporting a value it reads)
        assert "no sketch schedules group" in problem
        assert plan_problem(g, plan, Target.host()) is None
        return
    for group in fuse(g, plan).groups:
        if not group.is_view:
            check_group(group)


@pytest.mark.parametrize("name", ["attention", "encoder_layer"])
def test_horizontal_qkv_plan_runs_in_the_simt_interpreter(name):
    """The Q/K/V horizontal edge is a graph rewrite: the CUDA sketches schedule the merged GEMM and the
    batch_matmuls reading its slices, and compute the reference."""
    g = small_model(name)
    (r0, *_) = target_regions(g, CUDA)
    horizontal = [e.id for e in r0.edges if e.rule == "horizontal"]
    assert horizontal, "the CUDA plan space offers the Q/K/V edge"
    plan = {e: True for e in horizontal}
    assert plan_problem(g, plan, CUDA) is None
    for group in fuse(g, plan).groups:
        if not group.is_view:
            check_group(group)


def test_horizontal_qkv_plan_compiles_with_nvcc(tmp_path):
    """The full-size attention under the Q/K/V edge: every kernel (default schedules) through nvcc -cubin."""
    need_nvcc()
    g = optimize(get_model("attention"))
    plan = {r0e.id: True for r0e in target_regions(g, CUDA)[0].edges if r0e.rule == "horizontal"}
    groups = [grp for grp in fuse(g, plan).groups if not grp.is_view]
    funcs = [kernel_for(grp, CUDA, name=f"h_{grp.name}").func for grp in groups]
    resources = compile_units([generate_cuda(funcs, CUDA)], tmp_path)
    assert {f"h_{grp.name}" for grp in groups} <= set(resources)


def test_recompute_plans_run_in_the_simt_interpreter():
    """Recompute edges are a graph rewrite too: the copied producer's groups compute the reference on CUDA
    (or the plan is one the CUDA search skips, with the reason)."""
    from compiler.fusion import all_edges
    from tests.compiler.test_recompute import two_row_spaces

    for g in (two_row_spaces(), small_model("attention")):
        for e in [e for e in all_edges(g) if e.rule == "recompute"]:
            problem = plan_problem(g, {e.id: True}, CUDA)
            if problem is not None:
                assert "no sketch schedules group" in problem
                continue
            for group in fuse(g, {e.id: True}).groups:
                if not group.is_view:
                    check_group(group)
