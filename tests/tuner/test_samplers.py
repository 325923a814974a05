"""How results are told to Optuna: the sketch's check before measurement for every method, failures as
infeasible trials that TPE learns from (tuner/samplers.py), simulated timings."""

from __future__ import annotations

import json
import math

import optuna
import pytest

from compiler.builder import GraphBuilder
from compiler.target import Target
from db.database import TuningDatabase
from tuner.measure import Measurer
from tuner.measure.sim import SimulatedRunner
from tuner.samplers import FAILED_CONSTRAINT, add_result, distributions, screen, tell, to_params
from tuner.search import TaskTuner
from tuner.space import config_json
from tuner.task import extract_tasks

CPU = Target.host()


def _task(rows: int = 32, cols: int = 40):
    # a row of 40: at every vector width some vector x accum combinations do not divide it
    b = GraphBuilder("sm")
    (task,) = extract_tasks(b.build([b.softmax(b.input("x", (rows, cols)))]), CPU)
    return task


def _latency(task, config) -> float:
    return 10.0 + {1: 8.0, 4: 4.0, 8: 2.5, 16: 2.0}[config["vector"]] + config["accum"]


@pytest.fixture
def db():
    with TuningDatabase.open("sqlite://") as d:
        d.commit_target(CPU.key, CPU.to_json())
        yield d


def test_screen_names_why_a_config_is_invalid():
    task = _task()
    good = task.default()
    reasons = screen(task, [good, dict(good, vector=3), {"vector": 4}])
    assert reasons[0] is None and all(isinstance(r, str) and r for r in reasons[1:])


@pytest.mark.parametrize("sampler", ["tpe", "random"])
def test_invalid_configs_are_screened_and_told_as_infeasible(db, sampler):
    task = _task()
    db.commit_workload(task.workload_key, task.group.canonical(), task.kind, task.flops, task.bytes)
    runner = SimulatedRunner(_latency)
    measurer = Measurer(builder="simulated", runner=runner, target=CPU)
    tuner = TaskTuner(task, db, measurer, sampler, 0)
    for _ in range(6):
        tuner.step(8)
    measured = [c for _, c in runner.history]
    assert measured and len(measured) == tuner.state.measured
    assert all(screen(task, [json.loads(c)])[0] is None for c in measured)  # nothing invalid ran
    recs = db.find_records(task.workload_key, CPU.key)
    assert sorted(config_json(r.config) for r in recs) == sorted(measured)  # records = measurements only
    trials = tuner.study.get_trials(deepcopy=False)
    assert not [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    infeasible = [t for t in trials if t.constraints.get(FAILED_CONSTRAINT, 0) > 0]
    # each invalid config counts once; the sampler asking it again is told again (a trial, not an error)
    distinct = {json.dumps(t.params, sort_keys=True) for t in infeasible}
    assert infeasible and len(distinct) == tuner.state.errors["invalid_config"]
    assert all(t.state == optuna.trial.TrialState.COMPLETE and math.isinf(t.value) for t in infeasible)
    assert all(screen(task, [dict(t.params)])[0] for t in infeasible)  # exactly the invalid asks


def test_cmaes_is_told_fail_and_proposals_are_added_as_finished_trials():
    task = _task()
    space = task.space()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    dists = distributions(space, "index")
    t = study.ask(dists)
    tell(study, t, None, "cmaes")
    assert study.trials[-1].state == optuna.trial.TrialState.FAIL
    add_result(study, dists, to_params(space, task.default(), "index"), 12.5, "tpe")
    add_result(study, dists, to_params(space, task.default(), "index"), None, "tpe")
    ok, bad = study.trials[-2:]
    assert ok.state == bad.state == optuna.trial.TrialState.COMPLETE
    assert ok.value == 12.5 and not ok.constraints and bad.constraints == {FAILED_CONSTRAINT: 1.0}
