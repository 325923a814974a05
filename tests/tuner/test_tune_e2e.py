"""`kiln tune` end to end on the CPU: records, runs, compile with the best records, resume, faults,
kill -9 in the middle (a real process), and records that no longer validate. The other commands run in
process through tests/cli.py."""

from __future__ import annotations

import json
import sqlite3
import warnings

import numpy as np
import pytest

from compiler.frontend.models import get_model
from compiler.reference import random_inputs, run_reference
from compiler.target import Target
from db.database import RecordIn, TuningDatabase
from db.status import Status
from tests.cli import kill_after_records, kiln
from tuner.api import compile as kiln_compile
from tuner.task import extract_tasks

CPU = Target.host()


def test_tune_query_compile_and_resume(tmp_path):
    url = f"sqlite:///{tmp_path / 'k.db'}"
    # no confirmation rounds: on a loaded machine they may keep the default (see the next test), and
    # this test is about records flowing from tune to query and compile
    out = kiln(
        "tune", "--model", "rmsnorm", "--trials", "10", "--batch", "5", "--db", url, "--confirm-rounds", "0"
    )
    assert out.returncode == 0, out.stderr
    assert "whole model rmsnorm" in out.stdout
    with TuningDatabase.open(url) as db:
        ((key, weight),) = db.model_tasks("rmsnorm")
        recs = db.find_records(key, CPU.key)
        assert len(recs) == 10 and weight == 1
        assert len(db.runs("rmsnorm")) == 1
    q = kiln("query", "best", "--model", "rmsnorm", "--target", "cpu", "--db", url, "--format", "json")
    assert q.returncode == 0, q.stderr
    assert json.loads(q.stdout)[0]["workload"] == key
    comp = kiln("compile", "--model", "rmsnorm", "--db", url, "-o", str(tmp_path / "m"))
    assert comp.returncode == 0 and "coverage: 1 of 1" in comp.stdout, comp.stdout + comp.stderr
    again = kiln("tune", "--model", "rmsnorm", "--trials", "5", "--batch", "5", "--db", url, "--no-summary")
    assert again.returncode == 0, again.stderr
    with TuningDatabase.open(url) as db:
        recs2 = db.find_records(key, CPU.key)
        configs = [json.dumps(r.config, sort_keys=True) for r in recs2]
        assert len(recs2) == 15 and len(set(configs)) == 15  # resumed: only new configs were measured


def test_tuned_model_is_correct_and_never_slower_by_construction(tmp_path):
    url = f"sqlite:///{tmp_path / 'k.db'}"
    assert (
        kiln(
            "tune", "--model", "softmax", "--trials", "12", "--batch", "6", "--db", url, "--no-summary"
        ).returncode
        == 0
    )
    graph = get_model("softmax")
    with TuningDatabase.open(url) as db:
        model = kiln_compile(graph, "cpu", db=db)
        (task,) = extract_tasks(graph, CPU)
        best = db.best(task.workload_key, CPU.key)
        default = [
            r
            for r in db.find_records(task.workload_key, CPU.key)
            if r.config == task.default() and r.status == Status.OK
        ]
        conf = db.latest_confirmation(task.workload_key, CPU.key)
    (kernel,) = model.kernels
    if conf is not None and conf.config == best.config and not conf.better:
        # measured again beside the default, the best record was not faster: compile keeps the default
        assert kernel.extra["origin"] == "default" and kernel.config == task.default()
        assert "not faster" in kernel.extra["record"]["kept_default"]
    else:
        assert kernel.extra["origin"] == "record" and kernel.config == best.config
        assert kernel.extra["record"]["confirmed"] or best.config == task.default()
    assert default and best.median_us <= default[0].median_us  # the default was measured first
    x = random_inputs(graph, 3)
    np.testing.assert_allclose(model.run(x)[0], run_reference(graph, x)[0], rtol=1e-5, atol=1e-6)


def test_faulty_candidates_are_recorded_and_never_chosen(tmp_path):
    from tests.tuner.fault_sketch import EXPECTED, FAULTS, fault_codegen, fault_task
    from tuner.measure import Measurer
    from tuner.search import TaskTuner

    url = f"sqlite:///{tmp_path / 'k.db'}"
    task = fault_task(CPU, shape=(16, 64))
    with TuningDatabase.open(url) as db:
        db.commit_target(CPU.key, CPU.to_json())
        db.commit_workload(task.workload_key, task.group.canonical(), task.kind, task.flops, task.bytes)
        with Measurer(
            "local",
            "local",
            CPU,
            builder_options={"codegen": fault_codegen, "timeout_s": 8},
            runner_options={"timeout_s": 3},
        ) as m:
            tuner = TaskTuner(task, db, m, "random", seed=1)
            for fault in FAULTS:  # every fault at least once, then random ones
                tuner.study.enqueue_trial({"fault": fault, "vector": 8, "parallel": "none"})
            for _ in range(3):
                tuner.step(len(FAULTS))
        recs = db.find_records(task.workload_key, CPU.key)
        seen = {r.config["fault"]: r.status.value for r in recs}
        for fault in FAULTS:
            if fault == "invalid":  # screened by the sketch's check before measurement: never recorded
                assert fault not in seen and tuner.state.errors[EXPECTED[fault]] >= 1
                continue
            assert seen[fault] == EXPECTED[fault], (fault, seen[fault])
        best = db.best(task.workload_key, CPU.key)
        assert best is not None and best.config["fault"] == "none"


def test_kill_9_mid_run_leaves_a_consistent_database(tmp_path):
    path = tmp_path / "k.db"
    url = f"sqlite:///{path}"
    # a real process, killed with SIGKILL in the middle of the run
    args = ("tune", "--model", "layernorm", "--trials", "400", "--batch", "4", "--db", url, "--no-summary")
    kill_after_records(path, *args)
    with sqlite3.connect(path) as c:
        assert c.execute("pragma integrity_check").fetchone()[0] == "ok"
        before = c.execute("select count(*) from kiln_records").fetchone()[0]
    assert before >= 8 and before % 4 == 0  # whole batches only: at most the in-flight batch is lost
    out = kiln("tune", "--model", "layernorm", "--trials", "4", "--batch", "4", "--db", url, "--no-summary")
    assert out.returncode == 0, out.stderr
    with sqlite3.connect(path) as c:
        after = c.execute("select count(*) from kiln_records").fetchone()[0]
        tables = {row[0] for row in c.execute("select name from sqlite_master where type = 'table'")}
        claims = c.execute("select count(*) from kiln_leases where kind = 'config'").fetchone()[0]
    assert after == before + 4 and "trials" not in tables  # no Optuna study in the database to repair
    assert claims <= 4  # at most the killed worker's in-flight batch, claimed until its leases expire


def test_record_that_no_longer_validates_is_skipped_with_a_warning(tmp_path):
    url = f"sqlite:///{tmp_path / 'k.db'}"
    graph = get_model("layernorm")
    (task,) = extract_tasks(graph, CPU)
    with TuningDatabase.open(url) as db:
        db.commit_target(CPU.key, CPU.to_json())
        db.commit_workload(task.workload_key, task.group.canonical(), task.kind, task.flops, task.bytes)
        bad = dict(task.default(), vector=3)  # not a legal value any more
        db.commit_record(
            RecordIn(task.workload_key, CPU.key, task.sketch.name, task.sketch.version, bad, [1.0], Status.OK)
        )
        foreign = dict(task.default())
        db.commit_record(RecordIn(task.workload_key, CPU.key, "contraction", 1, foreign, [0.5], Status.OK))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = kiln_compile(graph, "cpu", db=db)
    assert model.kernels[0].extra["origin"] == "default"
    text = " ".join(str(w.message) for w in caught)
    assert "vector" in text and "sketch" in text


@pytest.mark.parametrize(
    "bad", [["--trials", "0"], ["--time-budget", "soon"], ["--tasks", "zzzz", "--trials", "2"]]
)
def test_tune_argument_errors_are_clean(tmp_path, bad):
    out = kiln("tune", "--model", "softmax", "--db", f"sqlite:///{tmp_path / 'k.db'}", *bad)
    assert out.returncode == 2 and "Traceback" not in out.stderr
