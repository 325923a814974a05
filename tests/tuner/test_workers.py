"""Several `tune` workers sharing one database (simulated measurement of fixed latency, tuner.sim_worker):
they start in the same second on an empty database, join one run, take different tasks, never measure a
config twice; one of them killed with SIGKILL while it measures a batch loses at most that batch, and
the others finish the run's budget. 3 workers on PostgreSQL, 2 on a SQLite file."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from compiler.frontend import load_model
from compiler.target import Target
from db.database import TuningDatabase
from db.engine import make_engine
from tests import postgres
from tuner.measure import Measurer
from tuner.measure.sim import SimulatedBuilder, SimulatedRunner
from tuner.search import TaskTuner
from tuner.sim_worker import fixed_latency
from tuner.task import extract_tasks
from tuner.workers import DatabaseShare

ROOT = Path(__file__).resolve().parents[2]
MODEL, PER_TASK, BATCH, TTL = "encoder_layer", 6, 4, "2"

postgres_server = postgres.postgres_server  # the PostgreSQL fixtures of tests/postgres.py
postgres_templates = postgres.postgres_templates
postgres_url = postgres.postgres_url


def _start(url: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "tuner.sim_worker", "--db", url, "--model", MODEL]
    argv += ["--trials-per-task", str(PER_TASK), "--batch", str(BATCH), "--seconds", "0.15"]
    env = {**os.environ, "KILN_LEASE_TTL": TTL}
    pipe = subprocess.PIPE
    return subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=pipe, stderr=pipe, text=True, start_new_session=True
    )


def _claims_of(url: str, pid: int) -> int:
    """How many config claims the worker with process id ``pid`` holds now (0 before the table exists)."""
    engine = make_engine(url)
    try:
        with contextlib.suppress(Exception), engine.connect() as conn:
            return conn.execute(
                text("SELECT count(*) FROM kiln_leases WHERE kind = 'config' AND owner LIKE :o"),
                {"o": f"%:{pid}:%"},
            ).scalar()
        return 0
    finally:
        engine.dispose()


@pytest.fixture(params=[("sqlite_file", 2), ("postgresql", 3)], ids=["sqlite-2", "postgresql-3"])
def shared(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, int]:
    backend, workers = request.param
    if backend == "sqlite_file":
        return f"sqlite:///{tmp_path / 'shared.db'}", workers
    return request.getfixturevalue("postgres_url"), workers


def test_workers_share_a_run_and_survive_a_kill(shared: tuple[str, int]) -> None:
    url, n = shared
    procs = [_start(url) for _ in range(n)]  # the same second, on an empty database
    victim = procs[-1]
    try:
        deadline = time.monotonic() + 120
        held = 0
        while time.monotonic() < deadline and victim.poll() is None:
            held = _claims_of(url, victim.pid)
            if held:
                os.killpg(victim.pid, signal.SIGKILL)  # in the middle of measuring its batch
                break
            time.sleep(0.02)
        assert 0 < held <= BATCH, "the victim never held a batch"
        victim.wait(timeout=30)
        outs = [p.communicate(timeout=180) for p in procs[:-1]]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err
    summaries = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    tasks = extract_tasks(load_model(MODEL), Target.host())
    budget = PER_TASK * len(tasks)
    with TuningDatabase.open(url) as db:
        (run,) = db.runs(MODEL)  # every worker joined one run
        assert {s["run_id"] for s in summaries} == {run.id}
        assert run.finished_at is not None and run.budget["outcome"] == "complete"
        counts = db.run_record_counts(run.id)
        assert sum(counts.values()) == budget  # the victim's lost batch was measured by the others
        assert set(counts) == {t.workload_key for t in tasks}  # every task was tuned
        identity = [
            (r.workload_key, r.target_key, r.sketch, r.sketch_version, json.dumps(r.config, sort_keys=True))
            for r in db.find_records()
        ]
        assert len(identity) == len(set(identity))  # no config measured twice
        with db.engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM kiln_leases")).scalar() == 0
    assert sum(s["measured"] for s in summaries) <= budget


def test_workers_take_different_tasks_and_configs(tmp_path: Path) -> None:
    """Two workers in one process: the second takes another task while the first holds one, and a
    config the first claimed is not handed to the second."""
    url = f"sqlite:///{tmp_path / 'k.db'}"
    target = Target.host()
    tasks = extract_tasks(load_model("mlp"), target)
    with TuningDatabase.open(url) as db:
        db.commit_target(target.key, target.to_json())
        for t in tasks:
            db.commit_workload(t.workload_key, t.group.canonical(), t.kind, t.flops, t.bytes)
        a, b = DatabaseShare(db, heartbeat=False), DatabaseShare(db, heartbeat=False)
        measurer = Measurer(SimulatedBuilder(), SimulatedRunner(fixed_latency))
        ta = [TaskTuner(t, db, measurer, seed=0, share=a) for t in tasks]
        tb = [TaskTuner(t, db, measurer, seed=0, share=b) for t in tasks]
        idents = [t.ident for t in ta]
        assert a.choose(idents) == 0 and b.choose(idents) == 1
        default = ta[0].default_key
        assert a.claim(idents[0], [default]) == ([default], set())
        assert b.claim(idents[0], [default]) == ([], set())
        a.release(idents[0], [default])
        assert ta[0].step(4) == 4  # the default is measured first
        assert tb[0].step(4) == 4
        assert default in tb[0].known  # read from the record, not measured again
        recs = db.find_records(tasks[0].workload_key, target.key)
        assert len(recs) == 8 and len({json.dumps(r.config, sort_keys=True) for r in recs}) == 8
        a.close()
        b.close()
