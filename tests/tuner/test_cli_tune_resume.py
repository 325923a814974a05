"""Resume that finishes, and counts that are stored counts: an interrupted, failed or killed `tune()` /
`kiln tune` rerun with the same arguments continues its run and spends only the budget it had left;
`--trials-per-task` sets the total from the number of selected tasks; what is printed comes from the
database. Measurements are simulated (tuner.measure.sim), so no compiler or timing is involved."""

from __future__ import annotations

import json
import sqlite3
import zlib

import pytest

from db.database import TuningDatabase
from tests.cli import kill_after_records, kiln
from tuner.api import tune
from tuner.measure import Measurer
from tuner.measure.sim import SimulatedBuilder, SimulatedRunner
from tuner.scheduler import Budget
from tuner.space import config_json


def simulated() -> Measurer:
    runner = SimulatedRunner(lambda task, config: 10.0 + zlib.crc32(config_json(config).encode()) % 97 / 10)
    return Measurer(SimulatedBuilder(), runner)


class StopsAfter:
    """A simulated measurer that raises ``error`` on its ``batches + 1``-th batch (Ctrl-C, a lost device)."""

    def __init__(self, batches: int, error: BaseException) -> None:
        self.inner, self.left, self.error = simulated(), batches, error

    def measure(self, inputs: list) -> list:
        if self.left == 0:
            raise self.error
        self.left -= 1
        return self.inner.measure(inputs)

    def close(self) -> None:
        self.inner.close()


@pytest.fixture
def url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'k.db'}"


def _stored(url: str, run_id: int) -> int:
    with TuningDatabase.open(url) as db:
        return sum(db.run_record_counts(run_id).values())


def test_an_interrupted_run_is_finished_by_the_rerun(url: str) -> None:
    first = tune(
        "layernorm", "cpu", url, 20, batch=4, measurer=StopsAfter(2, KeyboardInterrupt()), time_model=False
    )
    assert first.interrupted and first.stored == 8 and first.measured == 8 and first.resumed is None
    again = tune("layernorm", "cpu", url, 20, batch=4, measurer=simulated(), time_model=False)
    assert again.run_id == first.run_id and again.resumed is not None
    assert again.resumed.done == 8 and again.resumed.message() == (
        f"resuming run {first.run_id}: 8 of 20 trials done, 12 left"
    )
    assert again.measured == 12 and again.stored == 20 and not again.interrupted
    assert again.tasks[0].measured == 20 == _stored(url, first.run_id)
    with TuningDatabase.open(url) as db:
        (run,) = db.runs("layernorm")
        assert run.finished_at is not None and run.budget["outcome"] == "complete"
    third = tune("layernorm", "cpu", url, 20, batch=4, measurer=simulated(), time_model=False)
    assert third.run_id != first.run_id and third.resumed is None and third.stored == 20  # a new run


def test_a_failed_or_killed_run_is_resumed_and_other_arguments_start_anew(url: str) -> None:
    with pytest.raises(RuntimeError, match="went away"):
        tune(
            "softmax",
            "cpu",
            url,
            12,
            batch=3,
            measurer=StopsAfter(1, RuntimeError("went away")),
            time_model=False,
        )
    with TuningDatabase.open(url) as db:
        (run,) = db.runs("softmax")
        assert run.budget["outcome"] == "failed" and _stored(url, run.id) == 3
    other = tune("softmax", "cpu", url, 12, batch=3, seed=1, measurer=simulated(), time_model=False)
    assert other.resumed is None and other.run_id != run.id  # another seed: another run
    with TuningDatabase.open(url) as db:  # a run killed with SIGKILL: no end time, no outcome
        db.reopen_run(run.id, {k: v for k, v in run.budget.items() if k not in ("outcome", "spent_seconds")})
    with TuningDatabase.open(url) as db:  # a killed run spent the time up to its last record
        last = db.run_last_record_at(run.id)
    resumed = tune("softmax", "cpu", url, 12, batch=3, measurer=simulated(), time_model=False)
    assert resumed.run_id == run.id and resumed.resumed.done == 3 and resumed.measured == 9
    assert resumed.resumed.spent_seconds == pytest.approx((last - run.started_at).total_seconds())
    assert _stored(url, run.id) == 12
    fresh = tune(
        "softmax", "cpu", url, 12, batch=3, measurer=StopsAfter(1, KeyboardInterrupt()), time_model=False
    )
    assert fresh.interrupted and fresh.run_id not in (run.id, other.run_id)
    new = tune("softmax", "cpu", url, 12, batch=3, measurer=simulated(), time_model=False, resume=False)
    assert new.resumed is None and new.stored == 12 and new.run_id != fresh.run_id


def test_a_time_budget_resumes_with_the_seconds_left(url: str) -> None:
    first = tune(
        "layernorm",
        "cpu",
        url,
        Budget(seconds=3600),
        batch=2,
        measurer=StopsAfter(1, KeyboardInterrupt()),
        time_model=False,
    )
    assert first.interrupted and first.stored == 2
    with TuningDatabase.open(url) as db:
        (run,) = db.runs("layernorm")
        spent = run.budget["spent_seconds"]
        budget = {**run.budget, "spent_seconds": 3600 - 0.001}  # all but a moment of the hour is spent
        db.finish_run(run.id, budget)
    assert 0 < spent < 3600
    again = tune(
        "layernorm", "cpu", url, Budget(seconds=3600), batch=2, measurer=simulated(), time_model=False
    )
    assert again.run_id == first.run_id and again.resumed.spent_seconds == pytest.approx(3600 - 0.001)
    assert "s of 3600 s spent" in again.resumed.message()
    assert again.measured <= 2  # at most the one batch that starts before the moment is over


def test_trials_per_task_is_the_total_over_the_selected_tasks(url: str) -> None:
    summary = tune(
        "mlp",
        "cpu",
        url,
        Budget(trials_per_task=3),
        batch=3,
        early_stop=None,
        measurer=simulated(),
        time_model=False,
    )
    n = len(summary.tasks)
    assert n > 1 and summary.budget_trials == 3 * n and summary.stored == 3 * n
    one = tune(
        "mlp",
        "cpu",
        url,
        Budget(trials_per_task=4),
        tasks=[summary.tasks[1].task.workload_key],
        batch=4,
        measurer=simulated(),
        time_model=False,
    )
    assert one.budget_trials == 4 and one.stored == 4 and len(one.tasks) == 1


@pytest.fixture
def simulated_cli(monkeypatch):
    """`kiln tune` in process with the simulated measurer instead of building and running kernels."""
    measurers: list = []

    def create(target, workers=None):
        m = measurers.pop(0) if measurers else simulated()
        return m

    monkeypatch.setattr("tuner.api.create_measurer", create)
    return measurers


def test_kiln_tune_prints_the_resume_and_the_stored_counts(url: str, simulated_cli: list) -> None:
    args = ("tune", "--model", "layernorm", "--trials", "12", "--batch", "4", "--db", url, "--no-summary")
    simulated_cli.append(StopsAfter(1, KeyboardInterrupt()))
    first = kiln(*args)
    assert first.returncode == 130 and "4 of 12 trials stored" in first.stdout, first.stdout + first.stderr
    again = kiln(*args)
    assert again.returncode == 0, again.stderr
    assert "resuming run 1: 4 of 12 trials done, 8 left" in again.stdout
    assert "run 1: 12 of 12 trials stored (8 by this invocation)" in again.stdout
    with TuningDatabase.open(url) as db:
        assert len(db.runs("layernorm")) == 1 and db.count_records() == 12


def test_printed_trials_are_the_records_stored(url: str, simulated_cli: list) -> None:
    """The per-task trial count is the records stored under the run, not the configs told to the search
    (which also counts configs answered from earlier runs' records)."""
    base = ("tune", "--model", "softmax", "--batch", "8", "--db", url, "--no-summary", "--format", "json")
    assert kiln(*base, "--trials", "32").returncode == 0
    out = kiln(*base, "--trials", "32", "--new-run", "--seed", "5")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    with TuningDatabase.open(url) as db:
        stored = sum(db.run_record_counts(data["run_id"]).values())
    assert stored == 32 and data["trials"] == 32 and data["tasks"][0]["trials"] == 32
    table = kiln(*base[:-2], "--trials", "8", "--new-run", "--seed", "6")
    assert "run 3: 8 of 8 trials stored" in table.stdout and "│ 8      │" in table.stdout


def test_trials_per_task_on_the_command_line(url: str, simulated_cli: list) -> None:
    out = kiln(
        "tune",
        "--model",
        "mlp",
        "--trials-per-task",
        "2",
        "--batch",
        "2",
        "--db",
        url,
        "--no-summary",
        "--format",
        "json",
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["budget"]["trials"] == 2 * len(data["tasks"]) == data["trials"]
    both = kiln("tune", "--model", "mlp", "--trials", "4", "--trials-per-task", "2", "--db", url)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
    zero = kiln("tune", "--model", "mlp", "--trials-per-task", "0", "--db", url)
    assert zero.returncode == 2 and "must be at least 1" in zero.stderr


def test_a_killed_kiln_tune_is_finished_by_the_same_command(tmp_path, monkeypatch) -> None:
    """A real `kiln tune` process killed with SIGKILL (no end time, no outcome): the same command
    measures only what its budget had left, under the same run (once the killed worker's claims expired:
    a 2 s lease TTL here)."""
    monkeypatch.setenv("KILN_LEASE_TTL", "2")
    path = tmp_path / "k.db"
    args = (
        "tune",
        "--model",
        "layernorm",
        "--trials",
        "40",
        "--batch",
        "4",
        "--db",
        f"sqlite:///{path}",
        "--no-summary",
    )
    before = kill_after_records(path, *args)
    assert 8 <= before < 40
    out = kiln(*args)
    assert out.returncode == 0, out.stderr
    assert f"resuming run 1: {before} of 40 trials done, {40 - before} left" in out.stdout
    assert f"run 1: 40 of 40 trials stored ({40 - before} by this invocation)" in out.stdout
    with sqlite3.connect(path) as c:
        assert c.execute("select count(*) from kiln_records").fetchone()[0] == 40
        assert c.execute("select count(*) from kiln_runs").fetchone()[0] == 1
