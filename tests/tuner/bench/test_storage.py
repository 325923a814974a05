from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from compiler.errors import KilnError
from db.database import TuningDatabase
from tests.tuner.bench.fakes import WrongContender, fake_pair
from tuner.bench import storage
from tuner.bench.contenders import BenchContext
from tuner.bench.results import BenchRun
from tuner.bench.runner import run_suite
from tuner.bench.suite import Suite, Workload


def _run(suite_name: str = "t", target: str = "cpu/test") -> BenchRun:
    suite = Suite(suite_name, (Workload("softmax", "softmax"),))
    return run_suite(
        suite, [*fake_pair(), WrongContender()], BenchContext("cpu", 1), target_key=target,
        environment={"host": "h", "git_commit": "abc", "kiln_version": "9"},
        settings={"rounds": 4, "min_time": 0.005, "threads": 1}, command_line="bench --suite t",
        measure_ceilings=False, log=io.StringIO(),
    )  # fmt: skip


def test_save_load_roundtrip_and_baselines(tmp_path: Path) -> None:
    with TuningDatabase.open(f"sqlite:///{tmp_path / 'k.db'}") as db:
        first, second, other = _run(), _run(), _run("other")
        ids = [storage.save_run(db, r) for r in (first, second, other)]
        assert ids == [1, 2, 3] and second.id == 2
        back = storage.load_run(db, 2)
        assert back.suite == "t" and back.environment["git_commit"] == "abc"
        assert back.settings == second.settings and back.command_line == "bench --suite t"
        for a, b in zip(second.results, back.results):
            assert (a.workload, a.contender, a.status, a.rounds_us) == (
                b.workload,
                b.contender,
                b.status,
                b.rounds_us,
            )
            assert a.median_us == b.median_us and a.error == b.error
        assert storage.resolve_run(db, "last") == 3
        assert storage.resolve_run(db, "last", "t", "cpu/test") == 2
        assert storage.resolve_run(db, "last~1", "t", "cpu/test") == 1
        assert storage.resolve_run(db, "7") == 7
        with pytest.raises(KilnError, match="holds 2 bench run\\(s\\) of suite 't'"):
            storage.resolve_run(db, "last~2", "t", "cpu/test")
        with pytest.raises(KilnError, match="give a run id, last, last~N"):
            storage.resolve_run(db, "yesterday")
        with pytest.raises(KilnError, match="no bench run 9 in sqlite"):
            storage.load_run(db, 9)
        assert [r.id for r in storage.history(db, "t", "cpu/test")] == [1, 2]
        storage.delete_run(db, 1)
        assert [r.id for r in storage.list_runs(db)] == [2, 3]


def test_json_and_csv_export(tmp_path: Path) -> None:
    run = _run()
    run.id = 5
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run.to_json()))
    back = BenchRun.load_json(path)
    assert back.result("softmax", "fake kiln").rounds_us == run.result("softmax", "fake kiln").rounds_us
    assert back.started_at == run.started_at
    lines = run.to_csv().splitlines()
    assert lines[0].startswith("run,suite,target,workload,contender,status,median_us")
    assert lines[1].startswith("5,t,cpu/test,softmax,fake kiln,ok,")
    assert ",wrong_result," in lines[3]
    path.write_text('{"format": "something else"}')
    with pytest.raises(KilnError, match="is not a kiln bench run export"):
        BenchRun.load_json(path)
    path.write_text("{")
    with pytest.raises(KilnError, match="is not JSON"):
        BenchRun.load_json(path)


def test_tuning_rows_count_measured_records(tmp_path: Path) -> None:
    """The tuning table counts the records the tuning runs stored, not the budget they asked for."""
    from db.records import RecordIn

    with TuningDatabase.open(f"sqlite:///{tmp_path / 'k.db'}") as db:
        db.commit_target("cpu/test", {})
        db.commit_workload("w1", {"g": 1}, "reduce", 1.0, 1.0)
        rid = db.begin_run("softmax", "h", "cpu/test", {"trials": 100}, "kiln tune")
        for i, status in enumerate(["ok", "ok", "compile_error"]):
            rec = RecordIn(
                "w1", "cpu/test", "s", 1, {"v": i}, [1.0 + i] if status == "ok" else None, status, run_id=rid
            )
            db.commit_records([rec])
        db.finish_run(rid)
        rows = storage.tuning_rows(db, [("softmax", "softmax"), ("mlp", "mlp")], "cpu/test")
    assert len(rows) == 1
    assert rows[0]["workload"] == "softmax" and rows[0]["measured"] == 3 and rows[0]["ok"] == 2
    assert rows[0]["runs"] == 1 and rows[0]["seconds"] >= 0
