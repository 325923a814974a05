"""Fusion plans searched per region (tuner/plan_search.py): the search finds a plan that beats the rules on a
simulated landscape, on the CPU and the CUDA target alike; the best plan is stored with the rules' latency;
compile applies it only when it beats the rules and reports and skips a stale one. Measurements are
simulated (tuner.measure.sim), and so is the whole-model timing on the CPU (``whole()``: a compiled model
costs the landscape's sum over its kernels, so the whole model agrees with the sum of kernels here;
tests/tuner/test_plan_whole.py covers where they disagree): no timing is involved."""

from __future__ import annotations

import re

import numpy as np
import pytest

from compiler.frontend.models import MODELS
from compiler.fusion import fuse
from compiler.passes import optimize
from compiler.reference import random_inputs, run_reference
from compiler.target import Target
from db.database import TuningDatabase
from tests.cli import kiln
from tuner.api import compile as kiln_compile
from tuner.api import tune
from tuner.measure import Measurer
from tuner.measure.sim import SimulatedBuilder, SimulatedRunner
from tuner.plan_search import database_plan, target_regions
from tuner.plan_whole import KernelCostTimer

CUDA = Target.cuda()


def small_mlp():
    return MODELS["mlp"].build(batch=4, d_in=8, hidden=8, out=4)


def group_cost(task, config) -> float:
    """A landscape where a GEMM with a relu in its epilogue is slow: 100 per contraction, 1 per other op,
    5 per kernel, 200 more for matmul + relu in one kernel."""
    return ops_cost([n.op for n in task.group.nodes])


def ops_cost(ops: list[str]) -> float:
    cost = 5.0 + sum(100.0 if op in ("matmul", "conv2d", "batch_matmul") else 1.0 for op in ops)
    if "relu" in ops and "matmul" in ops:
        cost += 200.0
    return cost


def whole() -> KernelCostTimer:
    """The whole-model timing of the same landscape: a compiled model costs the sum of its kernels'."""
    return KernelCostTimer(lambda kernel: ops_cost(kernel.extra["ops"]))


def simulated() -> Measurer:
    return Measurer(SimulatedBuilder(), SimulatedRunner(group_cost))


@pytest.fixture
def url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'k.db'}"


@pytest.mark.parametrize("target", [Target.host(), CUDA], ids=["cpu", "cuda"])
def test_search_finds_and_stores_a_plan_that_beats_the_rules(url, target):
    graph = small_mlp()
    summary = tune(
        graph, target, url, 96, measurer=simulated(), time_model=False, fusion="search", whole_timer=whole()
    )
    first, second = summary.plans
    assert first.rule_latency_us == pytest.approx(5 + 100 + 3 + 200)  # matmul, broadcast, add, relu
    assert first.latency_us < 120 and first.flipped and set(first.flipped) <= {"e0_2", "e2_3"}
    assert second.flipped == [] and second.latency_us == second.rule_latency_us
    assert summary.to_json()["plans"][0]["flipped"] == first.flipped
    with TuningDatabase.open(url) as db:
        rec = db.best_fusion_plan(first.region.key, target.key)
        assert rec.plan == first.plan and rec.rule_latency_us == first.rule_latency_us
        report = database_plan(db, optimize(graph), target)
    applied = [line for line in report.lines if line["status"] == "applied"]
    assert [line["region"] for line in applied] == [0] and report.plan
    assert len(fuse(optimize(graph), report.plan).groups) == 3


def test_groups_of_a_searched_plan_are_confirmed_like_the_schedule_tasks(url):
    """Compile applies the records of the groups only a stored plan makes, so the end of tuning confirms
    them against their defaults too (every non-default config is 20% faster here)."""
    graph = small_mlp()
    target = Target.host()

    def cost(task, config) -> float:
        return group_cost(task, config) * (1.0 if config == task.default() else 0.8)

    measurer = Measurer(SimulatedBuilder(), SimulatedRunner(cost))
    summary = tune(
        graph, target, url, 96, measurer=measurer, time_model=False, fusion="search", whole_timer=whole()
    )
    assert summary.plans[0].flipped
    schedule_tasks = {r.task.workload_key for r in summary.tasks}
    with TuningDatabase.open(url) as db:
        model = kiln_compile(graph, target, db=db)
    from_plan = [k for k in model.kernels if k.workload_key not in schedule_tasks]
    records = [k.extra["record"] for k in model.kernels if k.extra.get("origin") == "record"]
    assert from_plan and records
    assert all(r["confirmed"] and r["speedup"] == pytest.approx(1.25) for r in records)


def test_rules_mode_and_a_small_auto_budget_search_nothing(url):
    assert (
        tune(small_mlp(), "cpu", url, 40, measurer=simulated(), time_model=False, fusion="rules").plans == []
    )
    assert tune(small_mlp(), "cpu", url, 8, measurer=simulated(), time_model=False).plans == []
    with TuningDatabase.open(url) as db:
        for region in target_regions(optimize(small_mlp()), Target.host()):
            assert db.best_fusion_plan(region.key, Target.host().key) is None


def _compile_checked(graph, db):
    model = kiln_compile(graph, Target.host(), db)
    x = random_inputs(graph, 0)
    for o, ref in zip(model.run(x), run_reference(graph, x)):
        np.testing.assert_allclose(o, ref, rtol=2e-4, atol=2e-4)
    return model


def test_compile_applies_a_better_plan_and_skips_stale_or_slower_ones(url, caplog):
    graph = small_mlp()
    target = Target.host()
    r0, r1 = target_regions(optimize(graph), target)
    with TuningDatabase.open(url) as db:
        db.commit_target(target.key, target.to_json())
        faster = {"rule_latency_us": 20.0, "whole_us": 40.0, "rule_whole_us": 50.0}
        db.commit_fusion_plan(r0.key, target.key, {"e0_2": True, "e2_3": False}, 10.0, **faster)
        db.commit_fusion_plan(r1.key, target.key, {"e0_2": False}, 30.0, rule_latency_us=20.0)  # slower
        model = _compile_checked(graph, db)
        status = {line["region"]: line["status"] for line in model.meta["fusion_plans"]}
        assert status == {0: "applied", 1: "rules"} and len(model.kernels) == 3
        # a plan naming an edge the region no longer has (the rules changed, or a hand-edited database)
        db.commit_fusion_plan(r0.key, target.key, {"e0_2": True, "e7_9": False}, 5.0, **faster)
        model = _compile_checked(graph, db)
    (stale,) = [line for line in model.meta["fusion_plans"] if line["status"] == "stale"]
    assert stale["region"] == 0 and "e7_9" in stale["why"]
    assert len(model.kernels) == 2  # skipped, never applied: the rules' groups
    assert "skipped" in caplog.text and "e7_9" in caplog.text


def test_plans_on_the_command_line(url):
    target = Target.host()
    summary = tune(
        "mlp", target, url, 96, measurer=simulated(), time_model=False, fusion="search", whole_timer=whole()
    )
    assert summary.plans[0].flipped
    out = kiln("query", "plans", "--model", "mlp", "--target", "cpu", "--db", url)
    assert out.returncode == 0, out.stderr
    assert "applied" in out.stdout and "1/2 regions of mlp use a searched fusion plan" in out.stdout
    shown = kiln("show", "--model", "mlp", "--stage", "groups", "--db", url)
    assert shown.returncode == 0, shown.stderr
    assert "fusion plan of region 0" in shown.stdout and "applied" in shown.stdout
    assert "3 groups" in shown.stdout
    plain = kiln("show", "--model", "mlp", "--stage", "groups")
    assert "2 groups" in plain.stdout


def test_search_merges_qkv_when_it_wins_and_compile_applies_it(url):
    """On a landscape where every contraction costs the same (one merged GEMM < three), the search measures
    the horizontal Q/K/V edge first among the flips, stores a plan with it, and compile applies it: the
    model runs one projection GEMM over the concatenated weights and computes the reference."""
    graph = MODELS["attention"].build(seq=4, d=8, heads=2)
    target = Target.host()
    summary = tune(
        graph, target, url, 160, measurer=simulated(), time_model=False, fusion="search", whole_timer=whole()
    )
    (found,) = summary.plans
    assert "h0_5_20" in found.flipped and found.latency_us < found.rule_latency_us
    with TuningDatabase.open(url) as db:
        model = _compile_checked(graph, db)
    assert [line["status"] for line in model.meta["fusion_plans"]] == ["applied"]
    projections = [k for k in model.kernels if re.fullmatch(r"g\d+_matmul", k.name)]
    assert len(projections) == 2  # Q/K/V merged + the output projection
    assert len(model.kernels) == len(kiln_compile(graph, target).kernels) - 2


def small_m_projection():
    """x [1, 8, 1024] @ w [16, 1024]^T + bias, GELU: one 128x128 tile on 132 SMs, so split-K's edge is on."""
    from compiler.builder import GraphBuilder

    rng = np.random.default_rng(0)
    b = GraphBuilder("proj")
    x = b.input("x", (1, 8, 1024))
    y = b.matmul(x, b.param("w", rng.standard_normal((16, 1024)).astype(np.float32)), transpose_b=True)
    return b.build([b.gelu(b.add(y, b.param("bias", rng.standard_normal(16).astype(np.float32))))])


def test_cuda_search_flips_split_k_off_when_it_loses_and_compile_applies_it(url, caplog):
    """On CUDA the rules split a small-M GEMM (partials + a reduction); where an extra kernel only costs,
    the search stores the plan that keeps the GEMM whole, and the compile side (database_plan, plan_model)
    applies it; the CPU target never sees the edge. The whole model is not timed on CUDA: the sum of
    kernels decides, and the log says so."""
    import logging

    from compiler.build import plan_model

    caplog.set_level(logging.INFO, "kiln.plans")

    graph = small_m_projection()
    summary = tune(
        graph, CUDA, url, 64, measurer=simulated(), time_model=False, fusion="search", whole_timer=whole()
    )
    (found,) = summary.plans
    (split,) = [e for e in found.region.edges if e.rule == "split_k"]
    local = found.region.local_ids[split.id]
    assert found.flipped == [local] and found.plan[local] is False
    assert found.latency_us < found.rule_latency_us and found.whole_us is None
    assert "the whole model is not timed on cuda" in caplog.text
    with TuningDatabase.open(url) as db:
        report = database_plan(db, optimize(graph), CUDA)
        assert report.plan[split.id] is False and report.lines[0]["flipped"] == [local]
        assert database_plan(db, optimize(graph), Target.host()).plan == {}  # no plan for the cpu
    rules = plan_model(graph, CUDA)
    assert [g.kind for g in rules.fused.groups if not g.is_view] == ["contraction", "reduction"]
    applied = plan_model(graph, CUDA, plan=report.plan)
    assert [g.kind for g in applied.fused.groups if not g.is_view] == ["contraction"]
    assert [n.op for n in applied.graph.nodes].count("batch_matmul") == 0


def test_the_merged_qkv_gemm_starts_from_a_projections_best_config(url):
    """The Q/K/V GEMM merged by the horizontal edge has no measured group with its anchor (N = 3d): its
    first candidate is the best config of a projection GEMM (same op, other shape), not a random one."""
    from tuner.plan_search import PlanSearch, region_groups
    from tuner.samplers import to_params
    from tuner.search import TaskTuner
    from tuner.task import tasks_of_groups

    graph = optimize(MODELS["attention"].build(seq=8, d=32, heads=2))
    target = Target.host()
    (region,) = target_regions(graph, target)
    horizontal = next(e for e in region.edges if e.rule == "horizontal")
    rule = region.rule_plan()
    rule_tasks = tasks_of_groups(region_groups(graph, region, rule), target)
    merged_plan = {**rule, region.local_ids[horizontal.id]: True}
    merged_tasks = tasks_of_groups(region_groups(graph, region, merged_plan), target)
    with TuningDatabase.open(url) as db:

        def make(task):
            db.commit_workload(task.workload_key, task.group.canonical(), task.kind, task.flops, task.bytes)
            return TaskTuner(task, db, simulated())

        projection = next(t for t in rule_tasks if t.group.anchor.op == "matmul")
        tuned = make(projection)
        best = {**projection.default(), "unroll_k": 4, "order": "mn"}
        tuned.state.best_config = best
        search = PlanSearch(region, graph, target, {projection.workload_key: tuned}, make)
        merged = next(
            t
            for t in merged_tasks
            if t.group.anchor.op == "matmul" and t.workload_key not in {r.workload_key for r in rule_tasks}
        )
        started = search._tuner(merged)
        queued = [t for t in started.study.trials if t.state.name == "WAITING"]
        waiting = [t.system_attrs.get("fixed_params") for t in queued]
        assert waiting[-1] == to_params(started.space, best, started.how), waiting


def _busy_merged_gemm(extra: float):
    """``group_cost`` with the merged Q/K/V GEMM measured ``extra`` slower the first GROUP_TRIALS times (the
    plan search's own trials: a busy moment of a loaded machine) and at its true cost afterwards."""
    from tuner.plan_search import GROUP_TRIALS

    seen: dict[str, int] = {}

    def cost(task, config) -> float:
        c = group_cost(task, config)
        a = task.group.anchor
        if a is not None and a.op == "matmul" and a.inputs[1].shape[0] == 3 * 8:
            seen[task.workload_key] = seen.get(task.workload_key, 0) + 1
            if seen[task.workload_key] <= GROUP_TRIALS:
                c += extra
        return c

    return Measurer(SimulatedBuilder(), SimulatedRunner(cost)), seen


@pytest.mark.parametrize("extra", [250.0, 1000.0])
def test_a_plan_that_lost_by_a_little_is_confirmed_and_kept(url, extra):
    """The Q/K/V plan truly wins (448 vs 659) but its merged GEMM was measured slower during the search:
    scored 6% above the rules it is still re-measured side by side with the rules' groups and kept; scored
    far above (more than CONFIRM_WITHIN) it is not re-measured and the rules stay."""
    graph = MODELS["attention"].build(seq=4, d=8, heads=2)
    measurer, seen = _busy_merged_gemm(extra)
    summary = tune(
        graph,
        Target.host(),
        url,
        120,
        measurer=measurer,
        time_model=False,
        fusion="search",
        whole_timer=whole(),
    )
    (found,) = summary.plans
    if extra < 300:
        assert found.flipped == ["h0_5_20"] and found.latency_us < found.rule_latency_us
        assert list(seen.values()) == [8 + 3]  # the search's trials, then the confirmation's rounds
    else:
        assert found.flipped == [] and found.latency_us == found.rule_latency_us


def test_a_plan_within_min_gain_of_the_rules_is_not_applied(url):
    """A plan that measures only 0.5% faster than the rules' (less than MIN_GAIN; the relu out of the first
    GEMM's epilogue: 99.5 vs 100) is not stored as better."""
    from tuner.plan_search import MIN_GAIN

    def cost(task, config) -> float:  # a matmul with the relu 100, without 50; a kernel without matmul 49.5
        ops = [n.op for n in task.group.nodes]
        if "matmul" in ops:
            return 100.0 if "relu" in ops else 50.0
        return 49.5

    assert MIN_GAIN > 0.005  # the flip below gains 0.5%

    graph = small_mlp()
    measurer = Measurer(SimulatedBuilder(), SimulatedRunner(cost))
    plans = tune(
        graph,
        Target.host(),
        url,
        96,
        measurer=measurer,
        time_model=False,
        fusion="search",
        whole_timer=whole(),
    ).plans
    assert all(p.flipped == [] and p.latency_us == p.rule_latency_us for p in plans)


def test_confirmation_scores_a_group_by_its_default_when_the_default_was_measured_busy(url):
    """The d x d projection GEMMs (Q/K/V: one workload of weight 3; the output projection another) run
    fastest with their default config, but the search measured each default during a busy moment (+1000), so
    their best records are a slow config (+300). The confirmation re-measures the best config and the
    default of every group whose weight differs between the rules' plan and the Q/K/V plan: the Q/K/V
    projections count with their default (3 x 300 less); the output projection, the same in both plans, is
    not re-measured and adds its +300 to both."""
    seen: dict[str, int] = {}

    def cost(task, config) -> float:
        c = group_cost(task, config)
        a = task.group.anchor
        if a is not None and a.op == "matmul" and a.inputs[1].shape[0] == 8:  # the d x d projection
            if config != task.default():
                return c + 300.0
            seen[task.workload_key] = seen.get(task.workload_key, 0) + 1
            if seen[task.workload_key] == 1:
                return c + 1000.0
        return c

    graph = MODELS["attention"].build(seq=4, d=8, heads=2)
    measurer = Measurer(SimulatedBuilder(), SimulatedRunner(cost))
    summary = tune(
        graph,
        Target.host(),
        url,
        160,
        measurer=measurer,
        time_model=False,
        fusion="search",
        whole_timer=whole(),
    )
    (found,) = summary.plans
    assert found.rule_latency_us == pytest.approx(659.0 + 300.0)
    assert found.flipped == ["h0_5_20"] and found.latency_us == pytest.approx(448.0 + 300.0)
