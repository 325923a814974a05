"""Export to JSON Lines, import (duplicates skipped), merge: round trips and malformed input."""

from __future__ import annotations

import gzip
import io
import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from db.database import Record, RecordIn, TuningDatabase
from db.errors import ConflictError, DatabaseError, InvalidRecordError
from tests.db.helpers import CPU, GPU, add_basics, rec


def _populate(db: TuningDatabase) -> list[str]:
    keys = add_basics(db, 3)
    run = db.begin_run("mlp", "h1", CPU, {"trials": 4}, "kiln tune --model mlp")
    db.commit_record(rec(keys[0], latencies=[3.0, 2.0], config={"v": 1, "mode": "a"}, run_id=run))
    db.commit_record(rec(keys[0], latencies=[1.5], config={"v": 2, "flag": True, "x": None, "f": 0.25}))
    db.commit_record(rec(keys[1], GPU, latencies=[0.125, 0.5, 0.25], run_id=run))
    db.commit_record(rec(keys[1], status="compile_error", error="error: ünïcode \u2603\nline 2"))
    db.finish_run(run)
    db.register_model_tasks("mlp", "h1", [(keys[0], 2), (keys[1], 1)])
    db.commit_fusion_plan("r0", CPU, {"edges": [[0, 1]]}, 7.5)
    db.commit_fusion_plan(
        "r1", CPU, {"e0_2": False}, 5.0, rule_latency_us=6.5, whole_us=30.0, rule_whole_us=33.0
    )
    return keys


def _comparable(db: TuningDatabase) -> list[tuple]:
    """Records as tuples without their ids; run ids replaced by the run's identity."""
    runs = {
        r.id: (r.model_name, r.model_hash, r.target_key, r.host, r.started_at, r.finished_at)
        for r in db.runs()
    }
    out = []
    for r in db.find_records():
        fields = {k: v for k, v in r.__dict__.items() if k not in ("id", "run_id")}
        out.append((tuple(sorted(fields.items(), key=lambda kv: kv[0])), runs.get(r.run_id)))
    return sorted(out, key=repr)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_export_import_round_trip(db: TuningDatabase, tmp_path: Path) -> None:
    keys = _populate(db)
    path = tmp_path / "export.jsonl"
    assert db.export_jsonl(path) == 4
    with TuningDatabase.open("sqlite://") as copy:
        stats = copy.import_jsonl(path)
        assert (stats.added, stats.skipped_duplicates) == (4, 0)
        assert (stats.workloads_added, stats.targets_added, stats.runs_added) == (3, 2, 1)
        assert (stats.model_tasks_added, stats.fusion_plans_added) == (2, 2)
        assert _comparable(copy) == _comparable(db)
        assert copy.best(keys[0], CPU).config == db.best(keys[0], CPU).config
        assert copy.model_tasks("mlp") == db.model_tasks("mlp")
        assert copy.best_fusion_plan("r0", CPU).plan == {"edges": [[0, 1]]}
        assert copy.best_fusion_plan("r0", CPU).rule_latency_us is None
        assert copy.best_fusion_plan("r1", CPU).rule_latency_us == 6.5
        assert copy.best_fusion_plan("r1", CPU).whole_us == 30.0
        assert copy.best_fusion_plan("r1", CPU).rule_whole_us == 33.0
        assert copy.best_fusion_plan("r0", CPU).whole_us is None
        assert copy.workload_canonical(keys[2]) == db.workload_canonical(keys[2])
        again = tmp_path / "again.jsonl"
        copy.export_jsonl(again)
        assert _lines(again)[1:] == _lines(path)[1:]  # identical but for the header's export time
        stats = copy.import_jsonl(path)  # everything is a duplicate now
        assert (stats.added, stats.skipped_duplicates, stats.runs_added, stats.model_tasks_added) == (
            0,
            4,
            0,
            0,
        )
        assert copy.count_records() == 4


def test_import_into_backend_skips_duplicates(db: TuningDatabase, tmp_path: Path) -> None:
    with TuningDatabase.open("sqlite://") as source:
        keys = _populate(source)
        path = tmp_path / "export.jsonl.gz"
        source.export_jsonl(path)
    with gzip.open(path, "rt") as f:
        assert json.loads(f.readline())["format"] == "kiln-tuning-db"
    first = db.import_jsonl(path)
    second = db.import_jsonl(path)
    assert (first.added, first.skipped_duplicates) == (4, 0)
    assert (second.added, second.skipped_duplicates) == (0, 4)
    assert db.count_records() == 4 and len(db.runs()) == 1
    assert db.best(keys[1], GPU).latencies_us == (0.125, 0.5, 0.25)


def test_export_filters_and_stream(db: TuningDatabase) -> None:
    keys = _populate(db)
    out = io.StringIO()
    assert db.export_jsonl(out, workload_key=keys[1]) == 2
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    kinds = [x["type"] for x in lines]
    assert kinds.count("record") == 2 and "model_task" not in kinds and "fusion_plan" not in kinds
    assert [x["key"] for x in lines if x["type"] == "workload"] == [keys[1]]
    out = io.StringIO()
    assert db.export_jsonl(out, status="ok", target_key=CPU) == 2


def test_merge_from(db: TuningDatabase, tmp_path: Path) -> None:
    other_url = f"sqlite:///{tmp_path / 'other.db'}"
    with TuningDatabase.open(other_url) as other:
        keys = _populate(other)
    keys_here = add_basics(db, 1)
    db.commit_record(rec(keys_here[0], latencies=[0.5], config={"local": 1}))
    stats = db.merge_from(other_url)
    assert stats.added == 4 and stats.skipped_duplicates == 0
    assert db.count_records() == 5
    assert db.best(keys[0], CPU).median_us == 0.5  # keys_here[0] == keys[0]: the local record is better
    assert db.merge_from(other_url).added == 0
    with pytest.raises(DatabaseError, match="does not exist"):
        db.merge_from(f"sqlite:///{tmp_path / 'missing.db'}")
    with TuningDatabase.open(other_url) as other:  # the other database was not modified
        assert other.count_records() == 4


def test_merge_into_itself_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'k.db'}"
    with TuningDatabase.open(url) as db, pytest.raises(DatabaseError, match="into itself"):
        db.merge_from(f"sqlite:///{tmp_path}/./k.db")


HEADER = '{"type":"header","format":"kiln-tuning-db","version":1}\n'
TARGET = '{"type":"target","key":"cpu/x","info":{},"created_at":"2026-01-01T00:00:00.000000Z"}\n'
WORKLOAD = (
    '{"type":"workload","key":"w","canonical":{"ops":["add"]},"kind":"pointwise","flops":1,"bytes":2,'
    '"created_at":"2026-01-01T00:00:00.000000Z"}\n'
)
RECORD = {
    "type": "record",
    "workload": "w",
    "target": "cpu/x",
    "sketch": "pointwise",
    "sketch_version": 1,
    "config": {"v": 1},
    "latencies_us": [1.0, 3.0],
    "median_us": 2.0,
    "status": "ok",
    "error": None,
    "kiln_version": "0.1.0",
    "host": "h",
    "run": None,
    "created_at": "2026-01-01T00:00:01.000000Z",
}


MALFORMED = [
    ("this is not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    (json.dumps({**RECORD, "type": "pickle"}), "unknown line type 'pickle'"),
    (json.dumps({**RECORD, "status": "great"}), "unknown record status"),
    (json.dumps({**RECORD, "config": "__import__('os')"}), "field 'config' must be an object"),
    (json.dumps({**RECORD, "config": {"v": [1]}}), "non-scalar"),
    (json.dumps({**RECORD, "latencies_us": [1.0, -5.0]}), "non-negative"),
    ('{"type":"record","latencies_us":[NaN]}', "missing field"),
    (json.dumps({**RECORD, "median_us": 7.0}), "is not the median"),
    (json.dumps({**RECORD, "sketch_version": "1"}), "'sketch_version' must be a number"),
    (json.dumps({**RECORD, "sketch_version": True}), "got a boolean"),
    (json.dumps({**RECORD, "workload": "unknown"}), "workload 'unknown' is neither"),
    (json.dumps({**RECORD, "run": 3}), "run 3"),
    (json.dumps({**RECORD, "created_at": "yesterday"}), "created_at"),
    (json.dumps({k: v for k, v in RECORD.items() if k != "host"}), "missing field 'host'"),
]


@pytest.mark.parametrize(("line", "message"), MALFORMED, ids=[m for _, m in MALFORMED])
def test_malformed_line_is_skipped_and_reported_or_with_strict_rejected_whole(
    db: TuningDatabase, tmp_path: Path, line: str, message: str
) -> None:
    add_basics(db)
    path = tmp_path / "bad.jsonl"
    good = json.dumps({**RECORD, "created_at": "2026-01-01T00:00:00.000000Z"})
    after = json.dumps({**RECORD, "created_at": "2026-01-01T00:00:02.000000Z"})
    path.write_text(HEADER + TARGET + WORKLOAD + good + "\n" + line + "\n" + after + "\n")
    with pytest.raises(InvalidRecordError, match=message) as err:
        db.import_jsonl(path, strict=True)
    assert f"{path}:5" in str(err.value)
    assert db.count_records() == 0  # one transaction: the good line before it was not kept either
    assert "w" not in {w.key for w in db.workloads()}
    stats = db.import_jsonl(path)  # by default: the bad line is skipped and named, the rest imported
    assert (stats.added, stats.skipped_bad) == (2, 1)
    (problem,) = stats.problems
    assert problem.startswith(f"{path}:5: ") and re.search(message, problem)


def test_a_file_that_is_not_an_export_is_refused_whole(db: TuningDatabase, tmp_path: Path) -> None:
    path = tmp_path / "notes.jsonl"
    path.write_text(TARGET + WORKLOAD)
    with pytest.raises(InvalidRecordError, match="the first line is not its header"):
        db.import_jsonl(path)
    assert db.target_keys() == []


def _break_config(db: TuningDatabase, record_id: int) -> None:
    with db.engine.begin() as conn:
        conn.execute(text("UPDATE kiln_records SET config = '{not json' WHERE id = :i"), {"i": record_id})


def test_export_and_merge_skip_and_report_a_stored_row_that_is_not_json(
    db: TuningDatabase, tmp_path: Path
) -> None:
    keys = add_basics(db)
    ids = [db.commit_record(rec(keys[0], latencies=[float(i + 1)], config={"v": i})) for i in range(3)]
    _break_config(db, ids[1])
    skipped: list[str] = []
    path = tmp_path / "out.jsonl"
    assert db.export_jsonl(path, skipped=skipped) == 2
    assert len(skipped) == 1 and f"record {ids[1]} " in skipped[0] and "config is not JSON" in skipped[0]
    source = f"sqlite:///{tmp_path / 'src.db'}"
    with TuningDatabase.open(source) as src:
        src.import_jsonl(path)
        (first,) = [r.id for r in src.find_records() if r.config == {"v": 0}]
        _break_config(src, first)
    with TuningDatabase.open(f"sqlite:///{tmp_path / 'dst.db'}") as dst:
        stats = dst.merge_from(source)
        assert (stats.added, stats.skipped_bad) == (1, 1)
        assert f"record {first} " in stats.problems[0]
        assert [r.config for r in dst.find_records()] == [{"v": 2}]
        with pytest.raises(InvalidRecordError, match="config is not JSON"):
            dst.merge_from(source, strict=True)


def test_import_rejects_newer_format_and_workload_conflicts(db: TuningDatabase, tmp_path: Path) -> None:
    path = tmp_path / "new.jsonl"
    path.write_text('{"type":"header","format":"kiln-tuning-db","version":99}\n')
    with pytest.raises(InvalidRecordError, match="newer"):
        db.import_jsonl(path)
    db.commit_workload("w", {"ops": ["mul"]}, "pointwise", 1, 2)
    path.write_text(HEADER + WORKLOAD)
    with pytest.raises(ConflictError, match="different canonical group"):
        db.import_jsonl(path)
    with pytest.raises(DatabaseError, match="cannot read import file"):
        db.import_jsonl(tmp_path / "missing.jsonl")
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(InvalidRecordError):
        db.import_jsonl(path)


def test_duplicates_within_one_file(db: TuningDatabase, tmp_path: Path) -> None:
    path = tmp_path / "dup.jsonl"
    line = json.dumps(RECORD) + "\n"
    other = (
        json.dumps({**RECORD, "host": "elsewhere", "error": "x", "kiln_version": "9"}) + "\n"
    )  # same identity
    path.write_text(HEADER + TARGET + WORKLOAD + line + line + other)
    stats = db.import_jsonl(path)
    assert (stats.added, stats.skipped_duplicates) == (1, 2)


# -- property: any set of records survives export -> import into an empty database exactly ----------------

_scalar = st.one_of(
    st.integers(-(2**53), 2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.booleans(),
    st.none(),
)
_config = st.dictionaries(st.text(min_size=1, max_size=8), _scalar, max_size=5)
_latencies = st.lists(st.floats(min_value=0, max_value=1e9, allow_nan=False), min_size=1, max_size=6)
_status = st.sampled_from(
    ["ok", "compile_error", "runtime_error", "timeout", "wrong_result", "invalid_config"]
)


@st.composite
def _records(draw: st.DrawFn) -> list[RecordIn]:
    out = []
    for _ in range(draw(st.integers(1, 8))):
        status = draw(_status)
        latencies = draw(_latencies) if status == "ok" else draw(st.none() | _latencies)
        out.append(
            RecordIn(
                workload_key=draw(st.sampled_from(["w0", "w1"])),
                target_key=draw(st.sampled_from([CPU, GPU])),
                sketch=draw(st.sampled_from(["pointwise", "reduction", "ßketch"])),
                sketch_version=draw(st.integers(0, 5)),
                config=draw(_config),
                latencies_us=latencies,
                status=status,
                error=draw(st.none() | st.text(max_size=40)),
            )
        )
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=_records())
def test_round_trip_property(records: list[RecordIn], tmp_path: Path) -> None:
    path = tmp_path / "prop.jsonl"
    with TuningDatabase.open("sqlite://") as db:
        for key in ("w0", "w1"):
            db.commit_workload(key, {"k": key, "unicode": "é☃"}, "pointwise", 1.5, 2.5)
        db.commit_target(CPU, {})
        db.commit_target(GPU, {"sm": 90})
        db.commit_records(records)
        db.export_jsonl(path)
        before = _comparable(db)
    with TuningDatabase.open("sqlite://") as copy:
        stats = copy.import_jsonl(path)
        assert stats.added == len(records) and stats.skipped_duplicates == 0
        assert _comparable(copy) == before
        for r in copy.find_records():
            assert isinstance(r, Record)


def test_fingerprint_is_stable(db: TuningDatabase) -> None:
    """The duplicate rule in numbers: same identity, same fingerprint, whatever the host or error text."""
    from db.canonical import parse_time, record_fingerprint

    t = parse_time("2026-01-01T00:00:01.000000Z")
    a = record_fingerprint("w", "cpu/x", "pointwise", 1, '{"v":1}', "[1.0,3.0]", "ok", t)
    assert a == record_fingerprint("w", "cpu/x", "pointwise", 1, '{"v":1}', "[1.0,3.0]", "ok", t)
    assert a != record_fingerprint("w", "cpu/x", "pointwise", 2, '{"v":1}', "[1.0,3.0]", "ok", t)
    assert len(a) == 64


def test_export_to_a_missing_directory(db: TuningDatabase, tmp_path: Path) -> None:
    with pytest.raises(DatabaseError, match="cannot write export file"):
        db.export_jsonl(tmp_path / "no" / "such" / "dir" / "x.jsonl")
