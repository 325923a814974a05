"""The CUDA backend gets the same fusion-plan space as the CPU: for every region of the zoo models (small
sizes), the groups of sampled plans either have CUDA sketches whose default schedules compute the numpy
reference in the SIMT interpreter (no GPU needed), or the plan is one the search skips for cuda (a group no
CUDA sketch schedules), never one that builds wrong code."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler.fusion import fuse
from compiler.target import Target
from tests.compiler.backends.cuda.util import CUDA, check_group
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
