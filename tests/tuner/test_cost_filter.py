"""Cost-model pruning in the search (simulated timings), `kiln tune --cost-model analytic` as a process,
and `kiln cost-model eval` on a small database."""

from __future__ import annotations

import itertools
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import optuna
import pytest

from compiler.builder import GraphBuilder
from compiler.errors import KilnError, ScheduleError
from compiler.target import Target
from cost_model.evaluate import spearman
from cost_model.features import FEATURE_VERSION
from cost_model.model import RandomModel
from db.database import RecordIn, TuningDatabase
from db.status import Status
from tests.cost_model.test_model import make_db
from tuner.cost_filter import CostFilter, make_candidate_filter, sample_per_workload
from tuner.measure import Measurer
from tuner.measure.sim import SimulatedRunner
from tuner.search import TaskTuner
from tuner.space import config_json
from tuner.task import extract_tasks

CPU = Target.host()


def _task(rows: int = 32, cols: int = 96, name: str = "sm", target: Target = CPU):
    b = GraphBuilder(name)
    (task,) = extract_tasks(b.build([b.softmax(b.input("x", (rows, cols)))]), target)
    return task


def _latency(task, config) -> float:
    v = {1: 8.0, 4: 4.0, 8: 2.5, 16: 2.0}[config["vector"]]
    return 10.0 + v * 4 / (1 + config["accum"]) + (0 if config["parallel"] == "rows" else 1.5)


def _all_configs(task):
    space = task.space()
    return [
        dict(zip((k.name for k in space), vals)) for vals in itertools.product(*(k.values for k in space))
    ]


def _valid(task, config) -> bool:
    try:
        task.check(config)
    except Exception:
        return False
    return True


@pytest.fixture
def db():
    # in memory: Optuna then uses its in-memory storage too (asks through the RDB storage cost ~50 ms each)
    with TuningDatabase.open("sqlite://") as d:
        d.commit_target(CPU.key, CPU.to_json())
        yield d


def test_filter_returns_valid_subset_with_random_picks(db, pinned_target: Target):
    # a row of 40: at every vector width some vector x unroll combinations of the space do not divide it
    # (a row of 96 has such combinations only with AVX-512's 16 lanes)
    task = _task(32, 40, target=pinned_target)
    db.commit_target(pinned_target.key, pinned_target.to_json())
    configs = [*_all_configs(task), dict(task.default(), vector=3), {"vector": 4}]
    assert sum(not _valid(task, c) for c in configs) > 2  # invalid combinations and malformed configs
    flt = CostFilter(RandomModel(0), db, pinned_target, seed=1, epsilon=0.25)
    chosen = flt(task, configs, 8)
    keys = {config_json(c) for c in configs}
    assert len(chosen) == 8 and len({config_json(c) for c in chosen}) == 8
    assert all(config_json(c) in keys and _valid(task, c) for c in chosen)
    assert flt.stats["random_picks"] == 2 and flt.stats["invalid"] > 0
    assert config_json(task.default()) in {config_json(c) for c in chosen}  # the default is kept


def test_filter_with_only_invalid_candidates_returns_nothing(db):
    task = _task()
    default = task.default()
    # configs outside the knob space are invalid on every ISA (the space itself may have no invalid config
    # on an AVX2 host), plus whatever the host's checks reject
    bad = [dict(default, vector=3), dict(default, accum=7), {"vector": 4}]
    bad += [c for c in _all_configs(task) if not _valid(task, c)][:7]
    assert not any(_valid(task, c) for c in bad)
    flt, _ = make_candidate_filter("analytic", db, CPU, oversample=1)  # a pool of what was asked only
    assert flt(task, bad, len(bad)) == []


def test_filter_widens_the_asked_configs_with_valid_unmeasured_proposals(db):
    task = _task(32, 40)
    db.commit_workload(task.workload_key, task.group.canonical(), task.kind, task.flops, task.bytes)
    valid = [c for c in _all_configs(task) if _valid(task, c)]
    measured = valid[:6]
    db.commit_records(
        [RecordIn(task.workload_key, CPU.key, task.sketch.name, task.sketch.version, c, [_latency(task, c)],
                  Status.OK) for c in measured]
    )  # fmt: skip
    flt, asks = make_candidate_filter("analytic", db, CPU, oversample=6)
    assert asks == 1  # as many Optuna asks as TPE alone: the pool is widened locally
    asked = valid[6:8]
    chosen = flt(task, asked, 4)
    keys = {config_json(c) for c in chosen}
    assert len(chosen) == len(keys) == 4 and all(_valid(task, c) for c in chosen)
    assert not keys & {config_json(c) for c in measured}  # never a config the database has
    assert flt.stats["proposed"] == 24 - 2 and flt.stats["candidates"] == 24
    best = min(measured, key=lambda c: _latency(task, c))
    near = [c for c in flt_pool(flt, task, best) if sum(c[k] != best[k] for k in c) <= 2]
    assert near  # half the proposals are mutations of the best measured configs


def flt_pool(flt, task, best):
    import random

    from tuner.cost_filter import propose

    return propose(task, [best], 16, random.Random(0), exclude=set())


def test_tuning_with_the_cost_model_measures_only_valid_configs_and_learns(db):
    task = _task()
    db.commit_workload(task.workload_key, task.group.canonical(), task.kind, task.flops, task.bytes)
    runner = SimulatedRunner(_latency)
    measurer = Measurer(builder="simulated", runner=runner, target=CPU)
    flt, asks = make_candidate_filter("gbdt", db, CPU, seed=0, epsilon=0.125, oversample=4)
    tuner = TaskTuner(task, db, measurer, "tpe", 0, None, None, flt, asks)
    for _ in range(4):
        assert tuner.step(8) <= 8
    measured = [c for _, c in runner.history]
    assert len(measured) == len(set(measured)) == tuner.state.measured
    recs = db.find_records(task.workload_key, CPU.key)
    assert all(r.status == "ok" for r in recs)  # nothing invalid was measured (or recorded)
    assert flt.stats["random_picks"] >= 3 and flt.stats["model_picks"] > flt.stats["random_picks"]
    assert flt.model.n_samples >= 24 and flt.model.fits >= 1  # learned from the first rounds
    # the asked trials the model did not pick were told to Optuna as pruned; its own picks were added
    pruned = tuner.study.get_trials(states=(optuna.trial.TrialState.PRUNED,))
    complete = tuner.study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(pruned) >= 4 and flt.stats["proposed"] > 0
    told = {config_json(t.params) for t in complete if np.isfinite(t.value)}
    assert told == set(measured)  # every measured candidate, asked or proposed, is a trial of the study
    assert tuner.state.best_us <= tuner.state.default_us
    # what it learned ranks the whole space like the simulated timings do
    valid = [c for c in _all_configs(task) if _valid(task, c)]
    _, x = flt.features(task, valid)
    lat = np.asarray([_latency(task, c) for c in valid])
    assert spearman(flt.model.predict(x), lat) > 0.5


@pytest.mark.parametrize("background", [True, False])
def test_refit_and_next_proposals_happen_in_the_background_while_measuring(db, background):
    task = _task()
    db.commit_workload(task.workload_key, task.group.canonical(), task.kind, task.flops, task.bytes)
    measurer = Measurer(builder="simulated", runner=SimulatedRunner(_latency), target=CPU)
    flt, asks = make_candidate_filter("gbdt", db, CPU, seed=0, oversample=4, background=background)
    tuner = TaskTuner(task, db, measurer, "tpe", 0, None, None, flt, asks)
    tuner.step(8)  # the first round ranks with the prior; its 8 records are learned by the next call
    tuner.step(8)
    if background:  # learned without fitting; the fit runs (in a thread) while the batch is measured
        flt.wait()
        nxt = flt._next[task.workload_key]  # the next round's proposals, featurized already
        assert nxt and all(
            flt.extractor.peek(flt.extractor.key(task.group, task.target, c, task.sketch.name))[0]
            for c in nxt
        )
        assert flt.stats["background_s"] > 0
        assert flt.model.warmed  # the learning library was imported off the critical path
    assert flt.model.fits == 1 and flt.model.n_fit == 8
    tuner.step(8)
    flt.wait()
    assert flt.model.fits == 2 and tuner.state.measured == 24


def test_propose_mutation_share(db):
    import random

    from tuner.cost_filter import propose

    task = _task()
    best = task.default()
    for share in (0.0, 1.0):
        out = propose(task, [best], 12, random.Random(1), exclude={config_json(best)}, mutate=share)
        near = sum(sum(c[k] != best[k] for k in c) <= 2 for c in out)
        assert len(out) == 12 and all(_valid(task, c) for c in out)
        assert near == 12 if share == 1.0 else near < 12
    with pytest.raises(KilnError, match="mutate"):
        propose(task, [best], 4, random.Random(1), exclude=set(), mutate=1.5)


def test_mutations_use_the_last_batch_and_uniform_proposals_come_from_the_background(db, monkeypatch):
    """The background step prepares only uniform proposals (it runs before the batch's latencies exist);
    each round mutates, in line, the best configs including the last batch's."""
    import tuner.cost_filter as cf

    calls = []
    original = cf.propose

    def spy(task, best, n, rng, exclude, mutate=0.5):
        calls.append(([dict(c) for c in best], mutate))
        return original(task, best, n, rng, exclude, mutate)

    monkeypatch.setattr(cf, "propose", spy)
    task = _task()
    db.commit_workload(task.workload_key, task.group.canonical(), task.kind, task.flops, task.bytes)
    measurer = Measurer(builder="simulated", runner=SimulatedRunner(_latency), target=CPU)
    flt, asks = make_candidate_filter("analytic", db, CPU, seed=0, oversample=4, background=True)
    tuner = TaskTuner(task, db, measurer, "tpe", 0, None, None, flt, asks)
    for _ in range(2):
        tuner.step(8)
        flt.wait()
    records = db.find_records(task.workload_key, CPU.key)  # rounds 1 and 2
    best = min(float(r.median_us) for r in records if r.median_us)
    tuner.step(8)
    flt.wait()
    assert len(calls) == 6  # per round: in line, then the background step
    assert calls[0][1] == 0.5  # the first round has nothing prepared: half mutations (of nothing yet)
    assert all(not b for b, _ in calls[1::2])  # the background proposes uniform configs only
    inline = calls[2::2]
    assert all(m == 1.0 and b for b, m in inline)  # later rounds mutate in line...
    assert _latency(task, inline[-1][0][0]) == best  # ...the best including the last batch's records


def test_asked_configs_are_ranked_in_the_round_that_asked_them(db):
    """Optuna's asked configs are featurized in line (not deferred to the next round's pool), so the model
    can pick them in the round TPE proposed them, background step or not."""
    task = _task()
    db.commit_workload(task.workload_key, task.group.canonical(), task.kind, task.flops, task.bytes)
    measurer = Measurer(builder="simulated", runner=SimulatedRunner(_latency), target=CPU)
    flt, asks = make_candidate_filter("analytic", db, CPU, seed=0, oversample=4, background=True)
    asked_rounds: list[list[dict]] = []

    def spy(t, configs, batch):
        asked_rounds.append([dict(c) for c in configs])
        picks = flt(t, configs, batch)
        # before the background step can touch anything: every valid asked config has its features
        for c in asked_rounds[-1]:
            try:
                t.check(c)
            except (ScheduleError, KilnError):
                continue
            assert flt.extractor.peek(flt.extractor.key(t.group, t.target, c, t.sketch.name))[0]
        return picks

    tuner = TaskTuner(task, db, measurer, "tpe", 0, None, None, spy, asks)
    for _ in range(3):
        tuner.step(8)
    flt.wait()
    assert len(asked_rounds) == 3 and all(asked_rounds)


def test_warm_start_learns_other_workloads_records_and_caches_features(db):
    first, second = _task(32, 96, "a"), _task(64, 160, "b")
    db.commit_workload(first.workload_key, first.group.canonical(), first.kind, first.flops, first.bytes)
    runner = SimulatedRunner(_latency)
    m = Measurer(builder="simulated", runner=runner, target=CPU)
    flt, k = make_candidate_filter("gbdt", db, CPU)
    t1 = TaskTuner(first, db, m, "tpe", 0, None, None, flt, k)
    for _ in range(3):
        t1.step(8)
    flt.learn(first)
    n_first = len(db.find_records(first.workload_key, CPU.key))
    assert len(db.features(FEATURE_VERSION)) == n_first  # features of measured records are cached
    db.commit_workload(second.workload_key, second.group.canonical(), second.kind, second.flops, second.bytes)
    fresh, _ = make_candidate_filter("gbdt", db, CPU)
    assert fresh.learn(second) == n_first  # a new filter starts from every record of the target
    assert fresh.model.fits >= 1


def test_kiln_tune_with_analytic_cost_model(tmp_path):
    url = f"sqlite:///{tmp_path / 'k.db'}"
    cmd = [sys.executable, "-m", "tuner.cli", "tune", "--model", "softmax", "--trials", "8", "--batch", "4"]
    out = subprocess.run(
        [*cmd, "--cost-model", "analytic", "--db", url, "--no-summary"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    with TuningDatabase.open(url) as d:
        ((key, _),) = d.model_tasks("softmax")
        recs = d.find_records(key, CPU.key)
        assert len(recs) == 8 and all(r.status == "ok" for r in recs)


def test_kiln_cost_model_eval_prints_metrics_and_writes_png(tmp_path):
    url = f"sqlite:///{tmp_path / 'k.db'}"
    make_db(url).close()
    png = tmp_path / "eval.png"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tuner.cli",
            "cost-model",
            "eval",
            "--db",
            url,
            "--target",
            "cpu",
            "--plot",
            str(png),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    for word in ("spearman", "top1", "top5", "leave-one-workload-out", "mean"):
        assert word in out.stdout
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "cost-model", "eval", "--db", url, "--target", "cuda"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "error" in bad.stderr


def test_warm_start_sample_per_workload():
    recs = [SimpleNamespace(workload_key="a", id=i) for i in range(100)]
    recs += [SimpleNamespace(workload_key="b", id=100 + i) for i in range(10)]
    out = sample_per_workload(recs, 20)
    a = [r.id for r in out if r.workload_key == "a"]
    assert len(a) == 20 and a[:5] == [0, 1, 2, 3, 4] and len(set(a)) == 20 and max(a) > 80
    assert [r.id for r in out if r.workload_key == "b"] == list(range(100, 110))
