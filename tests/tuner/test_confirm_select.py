"""The record compile applies when a workload has several records and confirmations (db.selection): a
record confirmed faster beats any unconfirmed one, a record confirmed not faster is never applied (the
default is kept unless another record is confirmed faster), confirmations survive a re-tune and a merge,
a confirmation round that fails keeps its config out, and the end of a run confirms the record that would
displace what compile applies. Measurements are simulated (tuner.measure.sim)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

import tuner
from db.database import RecordIn, TuningDatabase
from db.records import ConfirmationIn
from db.status import Status
from tests.cli import kiln
from tests.tuner.confirm_helpers import other_configs, softmax_task
from tuner.api import tune
from tuner.measure import Measurer
from tuner.measure.sim import SimulatedBuilder, SimulatedRunner
from tuner.space import config_json


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'k.db'}"


def _setup(url: str, task) -> None:
    with TuningDatabase.open(url) as db:
        db.commit_target(task.target.key, {"kind": "cpu"})
        db.commit_workload(task.workload_key, task.group.canonical(), task.kind, task.flops, task.bytes)


def _record(url: str, task, config: dict, median: float, status: str = "ok") -> None:
    with TuningDatabase.open(url) as db:
        lat = [median] if status == "ok" else None
        db.commit_record(
            RecordIn(
                task.workload_key, task.target.key, task.sketch.name, task.sketch.version, config, lat, status
            )
        )


def _confirm(url: str, task, config: dict, best: float, default: float) -> None:
    """A confirmation of ``config``: 5 rounds at ``best`` us vs the default at ``default`` us."""
    with TuningDatabase.open(url) as db:
        db.commit_confirmation(
            ConfirmationIn(
                task.workload_key,
                task.target.key,
                task.sketch.name,
                task.sketch.version,
                config,
                task.default(),
                [best] * 5,
                [default] * 5,
            )
        )


def _kernel(url: str):
    (kernel,) = tuner.compile("softmax", "cpu", db=url).kernels
    return kernel


def test_a_record_confirmed_not_faster_keeps_the_default_over_a_lower_unconfirmed_median(
    url: str, tmp_path: Path
) -> None:
    """A later run added a record with a lower median that was never confirmed (interrupted, or tuned with
    --confirm-rounds 0): the workload keeps the default, the confirmation said its medians lie."""
    task = softmax_task()
    a, b = other_configs(task, 2)
    _setup(url, task)
    _record(url, task, a, 100.0)
    _confirm(url, task, a, 400.0, 269.0)  # not faster
    _record(url, task, b, 90.0)  # lower median, unconfirmed
    kernel = _kernel(url)
    assert kernel.extra["origin"] == "default" and kernel.config == task.default()
    assert "not faster" in kernel.extra["record"]["kept_default"]
    out = kiln("compile", "--model", "softmax", "--db", url, "-o", str(tmp_path / "m"), "--format", "json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["kernels_from_records"] == 0 and result["selection"]["kept_default"] == 1
    assert "selection: 0 confirmed faster than the default, 0 unconfirmed" in out.stderr
    out = kiln(
        "query", "best", "--workload", task.workload_key, "--target", "cpu", "--db", url, "--format", "json"
    )
    (row,) = json.loads(out.stdout)
    assert row["vs_default"] == "default kept (confirmed 0.67x (±0%): not faster)" and row["record"] is None


def test_a_record_confirmed_faster_beats_a_lucky_unconfirmed_median(url: str, tmp_path: Path) -> None:
    task = softmax_task()
    a, b = other_configs(task, 2)
    _setup(url, task)
    _record(url, task, a, 100.0)
    _confirm(url, task, a, 200.0, 269.0)  # faster
    _record(url, task, b, 80.0)  # a lucky single median
    kernel = _kernel(url)
    assert kernel.extra["origin"] == "record" and kernel.config == a
    assert kernel.extra["record"]["confirmed"] and kernel.extra["record"]["standing"] == "confirmed"
    out = kiln("compile", "--model", "softmax", "--db", url, "-o", str(tmp_path / "m"))
    assert "selection: 1 confirmed faster than the default, 0 unconfirmed" in out.stdout
    out = kiln(
        "query", "best", "--workload", task.workload_key, "--target", "cpu", "--db", url, "--format", "json"
    )
    (row,) = json.loads(out.stdout)  # `kiln query best` shows what compile applies
    assert row["config"] == a and row["vs_default"] == "1.34x (±0%)"


def test_a_lucky_remeasurement_of_the_default_does_not_undo_a_confirmed_speedup(url: str) -> None:
    """The plan search commits re-measurements of each group's best config and default: a default measured
    in a quiet moment must not push out the record confirmed faster."""
    task = softmax_task()
    (a,) = other_configs(task, 1)
    _setup(url, task)
    _record(url, task, task.default(), 300.0)
    _record(url, task, a, 100.0)
    _confirm(url, task, a, 200.0, 269.0)
    _record(url, task, task.default(), 90.0)  # the plan search's re-measurement
    kernel = _kernel(url)
    assert kernel.extra["origin"] == "record" and kernel.config == a and kernel.extra["record"]["confirmed"]


def test_a_retune_confirming_another_config_not_faster_keeps_the_earlier_confirmed_record(url: str) -> None:
    task = softmax_task()
    a, b = other_configs(task, 2)
    _setup(url, task)
    _record(url, task, a, 100.0)
    _confirm(url, task, a, 200.0, 269.0)  # run 1: faster
    _record(url, task, b, 90.0)
    _confirm(url, task, b, 300.0, 269.0)  # run 2: its best, not faster (the latest confirmation)
    kernel = _kernel(url)
    assert kernel.extra["origin"] == "record" and kernel.config == a
    assert kernel.extra["record"]["speedup"] == pytest.approx(269 / 200)


def test_the_highest_confirmed_speedup_wins_among_confirmed_records(url: str) -> None:
    task = softmax_task()
    a, b = other_configs(task, 2)
    _setup(url, task)
    _record(url, task, a, 90.0)
    _confirm(url, task, a, 250.0, 269.0)  # 1.08x
    _record(url, task, b, 100.0)
    _confirm(url, task, b, 200.0, 269.0)  # 1.34x
    assert _kernel(url).config == b


def test_a_merge_keeps_every_confirmation_and_the_newer_verdict_of_a_config(url: str, tmp_path: Path) -> None:
    """Merging stores the other database's confirmations after ours (higher ids): an older verdict of the
    same config must not override ours, nor its best's confirmation hide our confirmed record."""
    task = softmax_task()
    a, b = other_configs(task, 2)
    other = f"sqlite:///{tmp_path / 'other.db'}"
    for u in (url, other):
        _setup(u, task)
    _record(other, task, a, 100.0)
    _confirm(other, task, a, 400.0, 269.0)  # older: a not faster (a busy machine)
    _record(other, task, b, 80.0)
    _confirm(other, task, b, 500.0, 269.0)  # b not faster
    _record(url, task, a, 100.0)
    _confirm(url, task, a, 200.0, 269.0)  # newer: a faster
    with TuningDatabase.open(url) as db:
        stats = db.merge_from(other)
    assert stats.confirmations_added == 2
    kernel = _kernel(url)
    assert kernel.extra["origin"] == "record" and kernel.config == a and kernel.extra["record"]["confirmed"]
    export = tmp_path / "all.jsonl"  # and the same through export / import into a fresh database
    assert kiln("db", "export", str(export), "--db", url).returncode == 0
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    assert kiln("db", "import", str(export), "--db", fresh).returncode == 0
    assert _kernel(fresh).config == a


class FailsWhenConfirmed:
    """The search measures every config once (the default at 269 us, the others at 100 us); measured again
    (the confirmation), ``bad`` gives a wrong result and the others 200 us."""

    def __init__(self, default: dict) -> None:
        self.default_key = config_json(default)
        self.bad: str | None = None
        self.seen: Counter[str] = Counter()

    def __call__(self, task, config):
        key = config_json(config)
        self.seen[key] += 1
        if key == self.default_key:
            return 269.0
        if self.seen[key] == 1:
            return 100.0
        if self.bad is None:
            self.bad = key
        return Status.WRONG_RESULT if key == self.bad else 200.0


def test_a_config_whose_confirmation_round_failed_is_never_applied(url: str) -> None:
    task = softmax_task()
    timings = FailsWhenConfirmed(task.default())
    summary = tune(
        "softmax", "cpu", url, 6, batch=3, measurer=Measurer(SimulatedBuilder(), SimulatedRunner(timings)),
        time_model=False, seed=1,
    )  # fmt: skip
    assert len(summary.tasks) == 1
    assert "wrong_result" in summary.confirm_failures[task.workload_key]
    with TuningDatabase.open(url) as db:
        failed = db.find_records(task.workload_key, task.target.key, status="wrong_result")
    assert [config_json(r.config) for r in failed] == [timings.bad] and failed[0].run_id == summary.run_id
    kernel = _kernel(url)
    assert config_json(kernel.config) != timings.bad


class Timings:
    """Simulated timings: the default ``default`` us; every other config ``search`` us when the search
    measures it, ``later`` us measured again (the confirmation)."""

    def __init__(self, default_config: dict, default: float, search: float, later: float) -> None:
        self.default_key = config_json(default_config)
        self.default, self.search, self.later = default, search, later
        self.seen: Counter[str] = Counter()

    def __call__(self, task, config) -> float:
        key = config_json(config)
        self.seen[key] += 1
        if key == self.default_key:
            return self.default
        return self.search if self.seen[key] == 1 else self.later


def _tune(url: str, timings: Timings):
    measurer = Measurer(SimulatedBuilder(), SimulatedRunner(timings))
    return tune("softmax", "cpu", url, 6, batch=3, measurer=measurer, time_model=False, seed=1)


def test_the_next_run_confirms_the_record_that_would_displace_a_not_faster_one(url: str) -> None:
    """Run 1's best was confirmed not faster; run 2 finds records as fast by their medians. Its end-of-run
    confirmation measures one of those (not run 1's best again), and compile applies it once confirmed."""
    task = softmax_task()
    first = _tune(url, Timings(task.default(), 269.0, 100.0, 400.0))  # a busy machine
    (r1,) = first.tasks
    c1 = first.confirmation(r1)
    assert c1 is not None and not c1.better
    assert _kernel(url).extra["origin"] == "default"
    second = _tune(url, Timings(task.default(), 269.0, 100.0, 200.0))  # a quieter one
    (r2,) = second.tasks
    c2 = second.confirmation(r2)
    assert c2 is not None and c2.better and config_json(c2.config) != config_json(c1.config)
    kernel = _kernel(url)
    assert kernel.extra["origin"] == "record" and kernel.config == c2.config


class SecondRun:
    """Run 2: the default 269 us; configs run 1 measured take ``known_later`` us measured again; new ones
    90 us in the search and ``new_later`` us measured again (250: a 1.08x challenger)."""

    def __init__(self, default_config: dict, known: set[str], known_later: float, new_later: float = 250.0):
        self.default_key, self.known, self.known_later = config_json(default_config), known, known_later
        self.new_later = new_later
        self.seen: Counter[str] = Counter()

    def __call__(self, task, config) -> float:
        key = config_json(config)
        self.seen[key] += 1
        if key == self.default_key:
            return 269.0
        if key in self.known:
            return self.known_later
        return 90.0 if self.seen[key] == 1 else self.new_later


def _known(url: str, task) -> set[str]:
    with TuningDatabase.open(url) as db:
        return {config_json(r.config) for r in db.find_records(task.workload_key, task.target.key)}


def test_a_retune_whose_best_is_not_faster_keeps_the_confirmed_record_and_says_so(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Run 1 confirms its best faster; run 2 finds lower medians, and its best is confirmed not faster:
    compile goes on applying run 1's record (re-confirmed in the same rounds, as fast as in run 1), and run
    2's summary and confirmation line say so."""
    task = softmax_task()
    first = _tune(url, Timings(task.default(), 269.0, 100.0, 200.0))
    (r1,) = first.tasks
    c1 = first.confirmation(r1)
    assert c1 is not None and c1.better
    timings = SecondRun(task.default(), _known(url, task), known_later=200.0, new_later=400.0)
    measurer = Measurer(SimulatedBuilder(), SimulatedRunner(timings))
    second = tune(
        "softmax", "cpu", url, 6, batch=3, measurer=measurer, time_model=False, seed=1, progress=True
    )
    printed = capsys.readouterr().out
    assert "0.67x (±0%) over default: not faster, compile applies the record confirmed 1.34x (±0%)" in printed
    (r2,) = second.tasks
    assert r2.best_us == 90.0 and second.speedup_text(r2) == "1.34x (±0%)"
    kernel = _kernel(url)
    assert kernel.extra["origin"] == "record" and kernel.config == c1.config


@pytest.mark.parametrize(("known_later", "incumbent_stays"), [(180.0, True), (400.0, False)])
def test_a_challenger_and_the_record_it_would_displace_are_confirmed_in_the_same_rounds(
    url: str, capsys: pytest.CaptureFixture[str], known_later: float, incumbent_stays: bool
) -> None:
    """Run 1 confirms A 1.34x. Run 2 finds B, faster by its median: the confirmation measures B, A and the
    default in the same rounds and stores both verdicts, so compile compares speed-ups measured together
    (not run 1's against run 2's): A stays when it is still the faster one, B replaces it otherwise."""
    task = softmax_task()
    first = _tune(url, Timings(task.default(), 269.0, 100.0, 200.0))
    (r1,) = first.tasks
    a = first.confirmation(r1)
    assert a is not None and a.better
    measurer = Measurer(
        SimulatedBuilder(), SimulatedRunner(SecondRun(task.default(), _known(url, task), known_later))
    )
    second = tune(
        "softmax", "cpu", url, 6, batch=3, measurer=measurer, time_model=False, seed=1, progress=True
    )
    printed = capsys.readouterr().out
    with TuningDatabase.open(url) as db:
        fresh = [c for c in db.find_confirmations(task.workload_key) if c.run_id == second.run_id]
    assert sorted(config_json(c.config) == config_json(a.config) for c in fresh) == [False, True]
    assert len({c.rounds for c in fresh}) == 1  # the same rounds
    kernel = _kernel(url)
    if incumbent_stays:
        assert kernel.config == a.config and kernel.extra["record"]["speedup"] == pytest.approx(269 / 180)
        assert "1.08x (±0%) over default; compile applies the record confirmed 1.49x (±0%)" in printed
    else:
        assert kernel.config != a.config and kernel.extra["record"]["speedup"] == pytest.approx(269 / 250)
