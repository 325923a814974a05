"""Search and scheduling with simulated timings (no hardware): default first, no re-measurement,
resume from the database, early stop, every sampler, budget sharing between tasks."""

from __future__ import annotations

import pytest

from compiler.builder import GraphBuilder
from compiler.target import Target
from db.database import TuningDatabase
from db.status import Status
from tuner.measure import Measurer
from tuner.measure.sim import SimulatedRunner
from tuner.scheduler import Budget, TaskScheduler, model_latency
from tuner.search import TaskTuner
from tuner.space import config_json
from tuner.task import extract_tasks

CPU = Target.host()


def _task(rows: int = 8, cols: int = 64, name: str = "sm"):
    b = GraphBuilder(name)
    (task,) = extract_tasks(b.build([b.softmax(b.input("x", (rows, cols)))]), CPU)
    return task


def _latency(task, config) -> float:
    """A smooth synthetic landscape: wider vectors and more accumulators are faster; parallel helps."""
    v = {1: 8.0, 4: 4.0, 8: 2.5, 16: 2.0}[config["vector"]]
    return task.weight * (10.0 + v * 4 / (1 + config["accum"]) + (0 if config["parallel"] == "rows" else 1.5))


@pytest.fixture
def db(tmp_path):
    url = f"sqlite:///{tmp_path / 'tune.db'}"
    with TuningDatabase.open(url) as d:
        d.commit_target(CPU.key, CPU.to_json())
        yield d


def _tuner(db, task, runner, sampler="tpe", seed=0, early_stop=None):
    db.commit_workload(task.workload_key, task.group.canonical(), task.kind, task.flops, task.bytes)
    measurer = Measurer(builder="simulated", runner=runner, target=CPU)
    return TaskTuner(task, db, measurer, sampler, seed, early_stop)


def test_default_first_records_everything_and_never_worse(db):
    task = _task()
    runner = SimulatedRunner(_latency)
    t = _tuner(db, task, runner)
    for _ in range(4):
        t.step(6)
    first = runner.history[0][1]
    assert first == config_json(task.default())
    assert t.state.default_us is not None and t.state.best_us <= t.state.default_us
    assert len(db.find_records(task.workload_key, CPU.key)) == len(runner.history) == t.state.measured
    assert len(set(runner.history)) == len(runner.history)  # nothing measured twice
    best = db.best(task.workload_key, CPU.key)
    assert best is not None and best.median_us == pytest.approx(t.state.best_us)


def test_resume_reuses_records_and_continues_the_study(db):
    task = _task()
    r1 = SimulatedRunner(_latency)
    t1 = _tuner(db, task, r1)
    t1.step(8)
    measured = {c for _, c in r1.history}
    r2 = SimulatedRunner(_latency)
    t2 = _tuner(db, task, r2)
    assert t2.state.best_us == pytest.approx(t1.state.best_us)
    t2.step(8)
    assert not measured & {c for _, c in r2.history}  # a resumed run measures only new configs
    assert len(t2.study.trials) > len(t1.study.trials) - 1


def test_errors_are_recorded_not_raised(db):
    task = _task()

    def flaky(t, config):
        if config["accum"] == 4:
            return Status.RUNTIME_ERROR, "simulated crash"
        return _latency(t, config)

    t = _tuner(db, task, SimulatedRunner(flaky), sampler="random", seed=3)
    for _ in range(5):
        t.step(6)
    recs = db.find_records(task.workload_key, CPU.key)
    bad = [r for r in recs if r.status == Status.RUNTIME_ERROR]
    assert bad and all(r.error == "simulated crash" for r in bad)
    best = db.best(task.workload_key, CPU.key)
    assert best is not None and best.config["accum"] != 4


def test_early_stop(db):
    task = _task()
    t = _tuner(db, task, SimulatedRunner(lambda task, c: 5.0), early_stop=6)
    steps = 0
    while not t.state.done and steps < 20:
        t.step(3)
        steps += 1
    assert t.state.done and t.state.measured <= 12


@pytest.mark.parametrize("sampler", ["tpe", "random", "cmaes", "gp"])
def test_every_sampler_runs(db, sampler):
    if sampler == "gp":
        pytest.importorskip("torch", reason="Optuna's GP sampler needs torch, which is not installed")
    task = _task(cols=32 if sampler == "gp" else 64)
    t = _tuner(db, task, SimulatedRunner(_latency), sampler=sampler)
    for _ in range(3):
        t.step(4)
    assert t.state.best_us is not None and t.state.measured >= 4


def test_scheduler_budget_and_allocation(db):
    heavy, light = _task(16, 64, "heavy"), _task(2, 16, "light")
    heavy.weight = 10
    runner = SimulatedRunner(_latency)
    tuners = [_tuner(db, heavy, runner, seed=1), _tuner(db, light, runner, seed=2)]
    sched = TaskScheduler(tuners, Budget(trials=40), batch=4, epsilon=0.0)
    assert sched.run() == 40
    counts = [t.state.measured for t in tuners]
    assert sum(counts) == 40 and counts[0] > counts[1]  # the heavy task gets most of the budget
    assert model_latency(tuners, "best") <= model_latency(tuners, "default")


def test_scheduler_time_budget(db):
    """A time budget stops the scheduler after the batch running when it ran out (a fake clock that
    advances one second per batch measured, so the test does not depend on how fast this machine is)."""
    now = [0.0]
    runner = SimulatedRunner(_latency)
    tuners = [_tuner(db, _task(), runner)]

    def on_round(tuner, n):
        now[0] += 1.0

    sched = TaskScheduler(tuners, Budget(seconds=3.0), batch=2, on_round=on_round, clock=lambda: now[0])
    n = sched.run()
    assert n == 6  # three batches of 2: the clock reached the budget after the third
    assert now[0] == 3.0


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
@pytest.mark.parametrize("cost_model", [None, "analytic"])
def test_a_sampler_stuck_on_measured_configs_does_not_end_the_search_early(db, cost_model):
    """TPE that has settled keeps proposing configs it was told already; the task is done only once every
    valid config of the space has a record, not after a few repeated proposals (with or without a cost
    model filtering the candidates)."""
    import itertools

    import optuna

    from tuner.cost_filter import make_candidate_filter
    from tuner.samplers import screen

    task = _task(rows=2, cols=16, name="tiny")
    runner = SimulatedRunner(_latency)
    t = _tuner(db, task, runner)
    if cost_model is not None:
        t.candidate_filter, _ = make_candidate_filter(cost_model, db, CPU, oversample=2)
        t.oversample = 2
    fixed = dict(task.default())
    t.study.sampler = optuna.samplers.PartialFixedSampler(fixed, optuna.samplers.RandomSampler(seed=0))
    space = task.space()
    every = [dict(zip([k.name for k in space], vs)) for vs in itertools.product(*(k.values for k in space))]
    valid = {config_json(c) for c in every if screen(task, [c])[0] is None}
    steps = 0
    while not t.state.done and steps < len(valid):
        t.step(16)
        steps += 1
    measured = [c for _, c in runner.history]
    assert t.state.done
    assert len(measured) == len(set(measured)) and set(measured) == valid
