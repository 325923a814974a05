"""`kiln db prune` and ``TuningDatabase.prune``: the best K *valid* records are kept (validity is the sketch's
knob-space check), an invalid record never pushes a valid one out and is never deleted, and ``--dry-run``
lists what would go without deleting anything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compiler.frontend import load_model
from compiler.target import Target
from db.database import RecordIn, TuningDatabase
from db.errors import InvalidRecordWarning
from tests.db.helpers import CPU, add_basics, rec
from tuner.cli import main
from tuner.task import extract_tasks


def test_an_invalid_fastest_record_never_pushes_valid_ones_out(db: TuningDatabase) -> None:
    keys = add_basics(db)
    ids = [db.commit_record(rec(keys[0], latencies=[float(i + 1)], config={"i": i})) for i in range(5)]

    def validate(r):  # the fastest two (i = 0, 1) are no longer valid for their sketch
        return "knob i out of range" if r.config["i"] < 2 else None

    plan = db.prune_plan(1, validate=validate)
    assert [r.id for r in plan.doomed] == ids[3:] and plan.kept == 1
    assert [rid for rid, _ in plan.left_alone] == ids[:2]
    assert db.count_records() == 5  # a plan deletes nothing
    assert db.prune(1, validate=validate) == 2
    assert sorted(r.id for r in db.find_records()) == ids[:3]  # the best valid one and the two invalid
    with pytest.warns(InvalidRecordWarning):
        assert db.best(keys[0], CPU, validate=validate).id == ids[2]


def _softmax_records(url: str) -> tuple[list[int], str]:
    """Records of softmax's task on this host: the default config (valid, slower) and a config whose first
    knob is outside its space (invalid, fastest). Returns (record ids, target key)."""
    target = Target.host()
    (task,) = extract_tasks(load_model("softmax"), target)
    default = task.default()
    knob = task.space()[0]
    bad = {**default, knob.name: 10**6}
    with TuningDatabase.open(url) as db:
        db.commit_target(target.key, target.to_json())
        db.commit_workload(task.workload_key, task.group.canonical(), task.kind, task.flops, task.bytes)
        ids = [
            db.commit_record(
                RecordIn(task.workload_key, target.key, task.sketch.name, task.sketch.version, c, [t], "ok")
            )
            for c, t in ((bad, 1.0), (default, 5.0), (default, 6.0))
        ]
    return ids, target.key


def test_cli_prune_validates_against_the_knob_space_and_dry_run_deletes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'k.db'}"
    (bad, best_valid, slower), _ = _softmax_records(url)
    assert main(["db", "prune", "--keep-top", "1", "--dry-run", "--db", url, "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert [r["id"] for r in json.loads(out)] == [slower]
    assert "would delete 1 of 3 records" in err and "nothing deleted" in err
    assert f"left alone: record {bad} " in err and "1 invalid ok records left alone" in err
    with TuningDatabase.open(url) as db:
        assert db.count_records() == 3
    assert main(["db", "prune", "--keep-top", "1", "--db", url]) == 0
    out, err = capsys.readouterr()
    assert "deleted 1 records, 2 left (top 1 valid ok kept" in out
    with TuningDatabase.open(url) as db:
        assert sorted(r.id for r in db.find_records()) == [bad, best_valid]
