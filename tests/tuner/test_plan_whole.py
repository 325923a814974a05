"""A fusion plan checked on the whole compiled model (tuner/plan_whole.py, PlanSearch.check_whole/outcome):
a plan that wins the sum of kernels but loses as a whole model is not stored as better; one that wins both is
stored with both whole-model latencies and compile applies it; a build that fails or an output that differs
keeps the rules' plan with the reason logged. The kernels are measured by the simulated landscape of
test_plan_search and the whole model by an in-memory timer (a sum over the compiled model's kernels, plus a
cost per kernel where it must disagree with the sum of kernels): no timing is asserted."""

from __future__ import annotations

import logging

import pytest

from compiler.passes import optimize
from compiler.target import Target
from db.database import TuningDatabase
from tests.cli import kiln
from tests.tuner.test_plan_search import ops_cost, simulated, small_mlp
from tuner.api import tune
from tuner.plan_search import database_plan, target_regions
from tuner.plan_whole import InterleavedWholeTimer, KernelCostTimer

CPU = Target.host()


@pytest.fixture
def url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'k.db'}"


def _tune(url, timer, model=None):
    summary = tune(
        model or small_mlp(),
        CPU,
        url,
        96,
        measurer=simulated(),
        time_model=False,
        fusion="search",
        whole_timer=timer,
    )
    return summary.plans[0]


def test_a_plan_faster_by_the_sum_of_kernels_but_slower_as_a_whole_is_not_stored(url, caplog):
    """The relu out of the GEMM's epilogue wins the landscape's sum of kernels (119 vs 308), but every
    kernel of the compiled model costs 500 more (an intermediate written and read back, a call): the
    flipped plan's model (3 kernels) is slower than the rules' (2 kernels), so the rules' plan is stored,
    with the whole-model latency beside it, and compile keeps it."""
    caplog.set_level(logging.INFO, "kiln.plans")
    timer = KernelCostTimer(lambda kernel: ops_cost(kernel.extra["ops"]) + 500.0)
    found = _tune(url, timer)
    assert timer.calls >= 2  # the rules' plan and at least one finalist
    assert found.flipped == [] and found.latency_us == found.rule_latency_us
    assert found.whole_us == found.rule_whole_us and found.rule_whole_us is not None
    assert "whole model" in found.why and "flipped" in found.why
    assert "the rules' plan is kept" in caplog.text
    with TuningDatabase.open(url) as db:
        rec = db.best_fusion_plan(found.region.key, CPU.key)
        assert rec.plan == found.region.rule_plan() and rec.rule_whole_us == found.rule_whole_us
        report = database_plan(db, optimize(small_mlp()), CPU)
    assert report.plan == {} and not [line for line in report.lines if line["status"] == "applied"]


def test_a_plan_faster_as_a_whole_is_stored_and_applied(url):
    import json

    from compiler.frontend.models import get_model

    timer = KernelCostTimer(lambda kernel: ops_cost(kernel.extra["ops"]))
    found = _tune(url, timer, "mlp")
    assert found.flipped and found.why == ""
    assert found.whole_us < found.rule_whole_us
    with TuningDatabase.open(url) as db:
        rec = db.best_fusion_plan(found.region.key, CPU.key)
        assert rec.plan == found.plan
        assert (rec.whole_us, rec.rule_whole_us) == (found.whole_us, found.rule_whole_us)
        report = database_plan(db, optimize(get_model("mlp")), CPU)
    (applied,) = [line for line in report.lines if line["status"] == "applied"]
    assert applied["whole_us"] == found.whole_us and applied["rule_whole_us"] == found.rule_whole_us
    out = kiln("query", "plans", "--model", "mlp", "--target", "cpu", "--db", url, "--format", "json")
    assert out.returncode == 0, out.stderr
    (row,) = [r for r in json.loads(out.stdout) if r["status"] == "applied"]
    assert (row["whole_us"], row["rules_whole_us"]) == (found.whole_us, found.rule_whole_us)


@pytest.mark.parametrize("failure", ["build", "mismatch"])
def test_a_failed_or_mismatching_whole_model_keeps_the_rules_plan(url, caplog, monkeypatch, failure):
    """The model under the flipped plan fails to build, or computes something else than the reference: the
    rules' plan is stored (no whole-model latency: nothing was timed) and the reason is logged."""
    import compiler.build

    real = compiler.build.compile
    r0 = target_regions(optimize(small_mlp()), CPU)[0]
    rules = r0.to_global(r0.rule_plan())

    class Wrong:  # the compiled model, its outputs off by one
        def __init__(self, model) -> None:
            self.model, self.kernels = model, model.kernels

        def run(self, inputs):
            return [o + 1.0 for o in self.model.run(inputs)]

    def build(graph, target, plan=None, configs=None):
        model = real(graph, target, plan=plan, configs=configs)
        if plan is None or plan == rules:
            return model
        if failure == "build":
            raise compiler.build.ScheduleError("no schedule today")
        return Wrong(model)

    monkeypatch.setattr(compiler.build, "compile", build)
    timer = KernelCostTimer(lambda kernel: ops_cost(kernel.extra["ops"]))
    found = _tune(url, timer)
    assert timer.calls == 0
    assert found.flipped == [] and found.whole_us is None and found.rule_whole_us is None
    why = (
        "did not build: ScheduleError: no schedule today" if failure == "build" else "differs from the numpy"
    )
    assert why in found.why and why in caplog.text and "the rules' plan is kept" in caplog.text


def test_the_interleaved_timer_times_every_model_in_every_round(monkeypatch, tmp_path):
    """The real timer's contract (not its figures): one latency per round for every model."""
    from compiler.build import compile as build_model
    from compiler.reference import random_inputs

    monkeypatch.setenv("KILN_TIMING_LOCK", str(tmp_path / "lock"))
    graph = small_mlp()
    models = {"a": build_model(graph, CPU), "b": build_model(graph, CPU)}
    times = InterleavedWholeTimer(min_time=0.001).time(models, random_inputs(graph, 0), 3)
    assert set(times) == {"a", "b"} and all(len(v) == 3 and min(v) > 0 for v in times.values())
