"""The database contract, run against in-memory SQLite, file SQLite and a real PostgreSQL server."""

from __future__ import annotations

import dataclasses
import json
import warnings
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from sqlalchemy import text

from compiler import __version__
from compiler.errors import KilnError
from db import migrate
from db.database import Record, Status, TuningDatabase
from db.errors import (
    AmbiguousKeyError,
    ConflictError,
    DatabaseError,
    InvalidRecordError,
    InvalidRecordWarning,
    UnknownKeyError,
)
from tests.db.helpers import CPU, GPU, GPU2, add_basics, rec


def test_open_creates_schema_at_head(db: TuningDatabase) -> None:
    assert db.schema_revision() == migrate.head_revision()
    assert db.count_records() == 0
    assert db.target_keys() == []
    assert db.dialect in ("sqlite", "postgresql")


def test_reopen_keeps_data(shared_url: str) -> None:
    with TuningDatabase.open(shared_url) as db:
        keys = add_basics(db)
        db.commit_record(rec(keys[0]))
    with TuningDatabase.open(shared_url, create=False) as db:
        assert db.count_records() == 1
        assert db.best(keys[0], CPU) is not None


def test_errors_are_kiln_errors() -> None:
    assert issubclass(DatabaseError, KilnError)


# -- workloads and targets ------------------------------------------------------------------------------


def test_commit_workload_is_idempotent(db: TuningDatabase) -> None:
    db.commit_workload("w", {"b": 1, "a": [1, 2]}, "pointwise", 10, 20)
    db.commit_workload("w", {"a": [1, 2], "b": 1}, "pointwise", 10, 20)
    db.commit_workload("w", '{"a": [1,2], "b": 1}', "pointwise", 10, 20)  # JSON text, other spacing
    [info] = db.workloads()
    assert (info.key, info.kind, info.flops, info.bytes, info.n_records) == ("w", "pointwise", 10.0, 20.0, 0)
    assert db.workload_canonical("w") == {"a": [1, 2], "b": 1}


def test_commit_workload_conflict(db: TuningDatabase) -> None:
    db.commit_workload("w", {"ops": ["add"]}, "pointwise", 1, 1)
    with pytest.raises(ConflictError, match=r"'w'.*different canonical"):
        db.commit_workload("w", {"ops": ["mul"]}, "pointwise", 1, 1)
    assert db.workload_canonical("w") == {"ops": ["add"]}


def test_commit_target_is_idempotent(db: TuningDatabase) -> None:
    db.commit_target(CPU, {"cores": 2})
    db.commit_target(CPU, {"cores": 4})
    assert db.target_keys() == [CPU]
    assert db.target_info(CPU) == {"cores": 2}


def test_target_prefix_resolution(db: TuningDatabase) -> None:
    add_basics(db)
    assert db.resolve_target(CPU) == CPU
    assert db.resolve_target("cpu") == CPU
    assert db.resolve_target("cuda") == GPU
    db.commit_target(GPU2, {})
    with pytest.raises(AmbiguousKeyError, match="several targets") as err:
        db.resolve_target("cuda")
    assert GPU in str(err.value) and GPU2 in str(err.value)
    assert db.resolve_target("cuda/sm_80") == GPU2
    with pytest.raises(UnknownKeyError, match="no target matches 'rocm'"):
        db.resolve_target("rocm")
    with pytest.raises(UnknownKeyError):
        db.resolve_target("cp")  # prefixes are whole path parts


def test_workload_prefix_resolution(db: TuningDatabase) -> None:
    keys = add_basics(db, 3)
    assert db.resolve_workload(keys[1]) == keys[1]
    assert db.resolve_workload(keys[1][:10]) == keys[1]
    db.commit_workload("abc_1", {}, "k", 1, 1)
    db.commit_workload("abcd1", {}, "k", 1, 1)
    assert db.resolve_workload("abc_") == "abc_1"  # '_' is literal, not a LIKE wildcard
    with pytest.raises(AmbiguousKeyError):
        db.resolve_workload("abc")
    with pytest.raises(UnknownKeyError):
        db.resolve_workload("zzzz")


# -- records --------------------------------------------------------------------------------------------


def test_commit_record_fills_fields(db: TuningDatabase) -> None:
    keys = add_basics(db)
    before = datetime.now(UTC)
    rid = db.commit_record(rec(keys[0], latencies=[3.0, 1.0, 2.0, 10.0], config={"b": 2, "a": "x"}))
    after = datetime.now(UTC)
    [r] = db.top_k(keys[0], CPU, 5)
    assert r.id == rid
    assert (r.workload_key, r.target_key, r.sketch, r.sketch_version) == (keys[0], CPU, "pointwise", 1)
    assert r.config == {"a": "x", "b": 2}
    assert r.latencies_us == (3.0, 1.0, 2.0, 10.0)
    assert r.median_us == 2.5
    assert r.status is Status.OK and r.status == "ok"
    assert r.kiln_version == __version__
    assert r.host
    assert r.error is None and r.run_id is None
    assert r.created_at.tzinfo is not None
    assert before - timedelta(seconds=1) <= r.created_at <= after + timedelta(seconds=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.median_us = 0.0  # type: ignore[misc]


def test_commit_records_batch(db: TuningDatabase) -> None:
    keys = add_basics(db)
    ids = db.commit_records([rec(keys[i % 3], latencies=[float(i + 1)]) for i in range(10)])
    assert len(ids) == 10 and len(set(ids)) == 10
    assert db.count_records() == 10
    assert db.commit_records([]) == []
    medians = {r.id: r.median_us for r in db.find_records()}
    assert [medians[i] for i in ids] == [float(i + 1) for i in range(10)]


def test_commit_record_needs_workload_and_target(db: TuningDatabase) -> None:
    keys = add_basics(db)
    with pytest.raises(UnknownKeyError, match="workload 'nope'"):
        db.commit_record(rec("nope"))
    with pytest.raises(UnknownKeyError, match="target 'tpu/v5'"):
        db.commit_record(rec(keys[0], "tpu/v5"))
    with pytest.raises(UnknownKeyError):  # a batch is one transaction: nothing of it is stored
        db.commit_records([rec(keys[0]), rec("nope")])
    assert db.count_records() == 0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"status": "exploded"}, "unknown record status 'exploded'"),
        ({"latencies_us": [1.0, float("nan")]}, "not a finite"),
        ({"latencies_us": [1.0, float("inf")]}, "not a finite"),
        ({"latencies_us": [-1.0]}, "non-negative"),
        ({"latencies_us": ["1"]}, "not a number"),
        ({"latencies_us": None}, "ok record needs at least one latency"),
        ({"latencies_us": []}, "ok record needs at least one latency"),
        ({"config": [1, 2]}, "config must be a JSON object"),
        ({"config": {"tile": [4, 4]}}, "non-scalar"),
        ({"config": {"tile": float("nan")}}, "non-finite"),
        ({"config": {"": 1}}, "knob name"),
        ({"sketch": ""}, "sketch name"),
        ({"sketch_version": "1"}, "sketch_version must be an int"),
        ({"sketch_version": True}, "sketch_version must be an int"),
    ],
)
def test_commit_record_rejects_invalid(db: TuningDatabase, changes: dict, message: str) -> None:
    keys = add_basics(db)
    bad = dataclasses.replace(rec(keys[0]), **changes)
    with pytest.raises(InvalidRecordError, match=message):
        db.commit_record(bad)
    assert db.count_records() == 0


def test_error_records_and_error_text(db: TuningDatabase) -> None:
    keys = add_basics(db)
    long_error = "error: " + "x" * 100_000
    db.commit_record(rec(keys[0], status="compile_error", error="nul\x00byte and \ud800 surrogate"))
    db.commit_record(rec(keys[0], status="timeout", error=long_error, latencies=[5.0]))
    db.commit_record(rec(keys[0], status=Status.WRONG_RESULT, latencies=None))
    found = {r.status: r for r in db.find_records(keys[0])}
    assert set(found) == {Status.COMPILE_ERROR, Status.TIMEOUT, Status.WRONG_RESULT}
    assert found[Status.COMPILE_ERROR].error == "nul\\x00byte and \\ud800 surrogate"
    assert found[Status.COMPILE_ERROR].median_us is None
    assert len(found[Status.TIMEOUT].error) == 65536 and found[Status.TIMEOUT].error.endswith("kiln]")
    assert found[Status.TIMEOUT].median_us == 5.0
    assert db.best(keys[0], CPU) is None  # none of them is ok


# -- best -----------------------------------------------------------------------------------------------


def test_best_is_lowest_median_of_ok_records(db: TuningDatabase) -> None:
    keys = add_basics(db)
    db.commit_record(rec(keys[0], latencies=[30.0, 31.0, 29.0], config={"v": 1}))
    fastest = db.commit_record(rec(keys[0], latencies=[20.0, 9.0, 21.0], config={"v": 2}))
    db.commit_record(rec(keys[0], latencies=[1.0], config={"v": 3}, status="wrong_result"))
    db.commit_record(rec(keys[0], latencies=[2.0], config={"v": 4}, status="timeout"))
    db.commit_record(rec(keys[0], GPU, latencies=[0.5], config={"v": 5}))  # another target
    db.commit_record(rec(keys[1], latencies=[0.1], config={"v": 6}))  # another workload
    best = db.best(keys[0], CPU)
    assert isinstance(best, Record)
    assert best.id == fastest and best.median_us == 20.0 and best.config == {"v": 2}
    assert db.best(keys[0], GPU).config == {"v": 5}
    assert db.best(keys[2], CPU) is None
    assert db.best("unknown", CPU) is None
    assert db.best(keys[0], "unknown") is None


def _import_lines(db: TuningDatabase, tmp_path, lines: list[dict]) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "in.jsonl"
    header = {"type": "header", "format": "kiln-tuning-db", "version": 1}
    path.write_text("".join(json.dumps(x) + "\n" for x in [header, *lines]))
    db.import_jsonl(path)


def _line(workload: str, config: dict, lat: list[float], created: str, target: str = CPU) -> dict:
    return {
        "type": "record",
        "workload": workload,
        "target": target,
        "sketch": "pointwise",
        "sketch_version": 1,
        "config": config,
        "latencies_us": lat,
        "status": "ok",
        "kiln_version": "0.1.0",
        "host": "h",
        "created_at": created,
    }


def test_best_tie_break_is_created_at_then_id(db: TuningDatabase, tmp_path) -> None:  # type: ignore[no-untyped-def]
    keys = add_basics(db)
    t1, t2 = "2026-01-01T00:00:01.000000Z", "2026-01-01T00:00:02.000000Z"
    _import_lines(
        db,
        tmp_path,
        [
            _line(keys[0], {"v": "later"}, [5.0], t2),  # lower id, later time
            _line(keys[0], {"v": "earlier"}, [5.0], t1),
            _line(keys[1], {"v": "first"}, [7.0], t1),  # same median and time: lower id wins
            _line(keys[1], {"v": "second"}, [7.0], t1),
        ],
    )
    assert db.best(keys[0], CPU).config == {"v": "earlier"}
    assert db.best(keys[1], CPU).config == {"v": "first"}
    assert [r.config["v"] for r in db.top_k(keys[1], CPU, 2)] == ["first", "second"]
    many = db.best_many(keys, CPU)
    assert many[keys[0]].config == {"v": "earlier"} and many[keys[1]].config == {"v": "first"}


def test_best_skips_records_the_validator_rejects(db: TuningDatabase) -> None:
    keys = add_basics(db)
    for i in range(20):  # medians 1..20; more invalid candidates than one fetch batch
        db.commit_record(rec(keys[0], latencies=[float(i + 1)], config={"tile": i}))

    def validate(r: Record) -> str | None:
        return None if r.config["tile"] >= 17 else f"tile {r.config['tile']} is not in the knob space"

    with pytest.warns(InvalidRecordWarning) as caught:
        best = db.best(keys[0], CPU, validate=validate)
    assert best is not None and best.config == {"tile": 17}
    assert len(caught) == 17
    first = str(caught[0].message)
    assert "record 1 " in first and keys[0] in first and "tile 0 is not in the knob space" in first
    with pytest.warns(InvalidRecordWarning):
        assert db.best(keys[0], CPU, validate=lambda r: "never valid") is None
    with pytest.warns(InvalidRecordWarning):
        many = db.best_many(keys, CPU, validate=validate)
    assert list(many) == [keys[0]] and many[keys[0]].config == {"tile": 17}
    with pytest.warns(InvalidRecordWarning):
        top = db.top_k(keys[0], CPU, 2, validate=validate)
    assert [r.config["tile"] for r in top] == [17, 18]


@pytest.mark.parametrize(
    "stored_config",
    ['{"tile": 4', "[1,2,3]", '{"tile": {"nested": 1}}', '"eval(1)"', "null"],
)
def test_best_never_returns_a_tampered_record(db: TuningDatabase, stored_config: str) -> None:
    keys = add_basics(db)
    bad = db.commit_record(rec(keys[0], latencies=[1.0], config={"tile": 1}))
    good = db.commit_record(rec(keys[0], latencies=[2.0], config={"tile": 2}))
    with db.engine.begin() as conn:
        conn.execute(
            text("UPDATE kiln_records SET config = :c WHERE id = :i"), {"c": stored_config, "i": bad}
        )
    with pytest.warns(InvalidRecordWarning, match=f"record {bad} "):
        assert db.best(keys[0], CPU).id == good
    with pytest.warns(InvalidRecordWarning):
        assert db.best_many([keys[0]], CPU)[keys[0]].id == good


def test_best_many_matches_best(db: TuningDatabase) -> None:
    keys = add_basics(db, 3)
    for i in range(12):
        db.commit_record(rec(keys[i % 2], latencies=[float((i * 7) % 11 + 1)], config={"i": i}))
    many = db.best_many([*keys, "missing"], CPU)
    assert set(many) == {keys[0], keys[1]}
    for key in keys[:2]:
        assert many[key] == db.best(key, CPU)
    assert db.best_many([], CPU) == {}


def test_top_k(db: TuningDatabase) -> None:
    keys = add_basics(db)
    for i in (5, 3, 9, 1):
        db.commit_record(rec(keys[0], latencies=[float(i)], config={"i": i}))
    db.commit_record(rec(keys[0], status="compile_error", config={"i": 0}))
    assert [r.median_us for r in db.top_k(keys[0], CPU, 3)] == [1.0, 3.0, 5.0]
    assert [r.median_us for r in db.top_k(keys[0], CPU, 10)] == [1.0, 3.0, 5.0, 9.0]
    everything = db.top_k(keys[0], CPU, 10, status=None)
    assert [r.status for r in everything][-1] == Status.COMPILE_ERROR and len(everything) == 5
    assert [r.config for r in db.top_k(keys[0], CPU, 5, status="compile_error")] == [{"i": 0}]


def test_records_dataframe(db: TuningDatabase) -> None:
    keys = add_basics(db)
    db.commit_record(rec(keys[0], latencies=[2.0]))
    db.commit_record(rec(keys[0], GPU, latencies=[1.0]))
    db.commit_record(rec(keys[1], status="runtime_error", error="segfault"))
    frame = db.records()
    assert list(frame.columns) == [f.name for f in dataclasses.fields(Record)]
    assert len(frame) == 3
    assert list(frame["median_us"][:2]) == [1.0, 2.0]
    assert len(db.records(workload_key=keys[0])) == 2
    assert len(db.records(target_key=GPU)) == 1
    only = db.records(status="runtime_error")
    assert list(only["status"]) == ["runtime_error"] and list(only["error"]) == ["segfault"]
    assert len(db.records(limit=1)) == 1
    assert db.records(workload_key="none").empty


# -- runs, tasks, coverage ------------------------------------------------------------------------------


def test_runs(db: TuningDatabase) -> None:
    keys = add_basics(db)
    run = db.begin_run("mlp", "hash1", CPU, {"trials": 64, "timeout_s": 10}, "kiln tune --model mlp")
    db.commit_record(rec(keys[0], run_id=run))
    [info] = db.runs()
    assert (info.id, info.model_name, info.target_key, info.budget) == (
        run,
        "mlp",
        CPU,
        {"timeout_s": 10, "trials": 64},
    )
    assert info.finished_at is None
    db.finish_run(run)
    assert db.runs("mlp")[0].finished_at is not None
    assert db.runs("other") == []
    assert db.best(keys[0], CPU).run_id == run
    with pytest.raises(UnknownKeyError, match="run 999"):
        db.finish_run(999)
    with pytest.raises(UnknownKeyError):
        db.begin_run("mlp", "h", "no/such/target", {}, "")


def test_model_tasks_and_coverage(db: TuningDatabase) -> None:
    keys = add_basics(db, 3)
    db.register_model_tasks("mlp", "h1", [(keys[0], 2), (keys[1], 1)])
    assert db.model_tasks("mlp") == sorted([(keys[0], 2.0), (keys[1], 1.0)])
    db.register_model_tasks("mlp", "h2", [(keys[1], 1), (keys[2], 3), (keys[2], 1)])  # a newer version
    assert db.model_tasks("mlp") == sorted([(keys[1], 1.0), (keys[2], 4.0)])
    assert db.model_tasks("mlp", "h1") == sorted([(keys[0], 2.0), (keys[1], 1.0)])
    db.register_model_tasks("mlp", "h2", [(keys[2], 5)])  # replaces the list of that hash
    assert db.model_tasks("mlp") == [(keys[2], 5.0)]
    assert db.model_tasks("nope") == []
    assert db.models() == [("mlp", "h2", 1)]
    with pytest.raises(UnknownKeyError):
        db.register_model_tasks("bad", "h", [("missing", 1)])

    db.register_model_tasks("mlp", "h3", [(keys[0], 2), (keys[1], 1)])
    db.commit_record(rec(keys[0], latencies=[4.0]))
    db.commit_record(rec(keys[0], latencies=[3.0]))
    db.commit_record(rec(keys[0], status="compile_error"))
    db.commit_record(rec(keys[1], status="timeout"))
    db.commit_record(rec(keys[1], GPU, latencies=[1.0]))  # other target: not counted
    rows = {r.workload_key: r for r in db.coverage_rows("mlp", CPU)}
    assert rows[keys[0]].tuned and rows[keys[0]].best_median_us == 3.0 and rows[keys[0]].n_records == 3
    assert rows[keys[0]].by_status["ok"] == 2 and rows[keys[0]].by_status["compile_error"] == 1
    assert not rows[keys[1]].tuned and rows[keys[1]].best_median_us is None
    assert rows[keys[1]].by_status["timeout"] == 1 and rows[keys[1]].n_records == 1
    frame = db.coverage("mlp", CPU)
    assert list(frame["tuned"]) == [rows[k].tuned for k in frame["workload_key"]]
    assert {"n_ok", "n_invalid_config", "best_median_us", "weight"} <= set(frame.columns)
    with pytest.raises(UnknownKeyError, match="no tasks recorded for model 'nope'"):
        db.coverage("nope", CPU)
    names = {w.key for w in db.workloads("mlp")}
    assert names == {keys[0], keys[1]}


# -- fusion plans and features --------------------------------------------------------------------------


def test_fusion_plans(db: TuningDatabase) -> None:
    add_basics(db)
    assert db.best_fusion_plan("region", CPU) is None
    db.commit_fusion_plan("region", CPU, {"edges": [[0, 1]]}, 12.0)
    db.commit_fusion_plan("region", CPU, {"edges": []}, 8.0)
    db.commit_fusion_plan("region", GPU, {"edges": [[1, 2]]}, 1.0)
    best = db.best_fusion_plan("region", CPU)
    assert best.plan == {"edges": []} and best.latency_us == 8.0 and best.target_key == CPU
    with pytest.raises(InvalidRecordError):
        db.commit_fusion_plan("region", CPU, {"edges": []}, float("nan"))
    assert best.rule_latency_us is None  # stored without the rules' plan latency
    db.commit_fusion_plan("region", CPU, {"e0_2": False}, 6.0, rule_latency_us=9.5)
    best = db.best_fusion_plan("region", CPU)
    assert best.plan == {"e0_2": False} and best.rule_latency_us == 9.5
    assert [p.latency_us for p in db.fusion_plans("region")] == [1.0, 6.0, 8.0, 12.0]
    with pytest.raises(InvalidRecordError, match="rules' plan latency"):
        db.commit_fusion_plan("region", CPU, {}, 6.0, rule_latency_us=-1.0)
    assert best.whole_us is None and best.rule_whole_us is None  # not timed on the whole model
    db.commit_fusion_plan(
        "region", CPU, {"e0_2": False}, 5.0, rule_latency_us=9.5, whole_us=40, rule_whole_us=50
    )
    best = db.best_fusion_plan("region", CPU)
    assert (best.whole_us, best.rule_whole_us) == (40.0, 50.0)
    with pytest.raises(InvalidRecordError, match="whole-model latency"):
        db.commit_fusion_plan("region", CPU, {}, 6.0, whole_us=float("inf"))


def test_features_round_trip_as_float32_bytes(db: TuningDatabase) -> None:
    keys = add_basics(db)
    a = db.commit_record(rec(keys[0], latencies=[1.0]))
    b = db.commit_record(rec(keys[0], latencies=[2.0]))
    vec = np.array([0.1, -2.5, 3e10, 0.0], dtype=np.float64)
    db.commit_features(a, 1, vec)
    db.commit_features(b, 1, [1.0, 2.0, 3.0, 4.0])
    db.commit_features(a, 2, np.arange(7, dtype=np.float32))
    got = db.features(1)
    assert set(got) == {a, b}
    assert got[a].dtype == np.float32 and np.array_equal(got[a], vec.astype(np.float32))
    assert np.array_equal(db.features(2, [a, b])[a], np.arange(7, dtype=np.float32))
    db.commit_features(a, 1, [9.0])  # replaces
    assert db.features(1, [a])[a].tolist() == [9.0]
    with pytest.raises(UnknownKeyError):
        db.commit_features(12345, 1, [1.0])
    with db.engine.begin() as conn:
        conn.execute(
            text("UPDATE kiln_features SET length = 3 WHERE record_id = :a AND version = 2"), {"a": a}
        )
    with pytest.raises(InvalidRecordError, match="not 3 float32 values"):
        db.features(2)


# -- prune ----------------------------------------------------------------------------------------------


def test_prune_keeps_top_k_and_errors(db: TuningDatabase) -> None:
    keys = add_basics(db)
    for i in range(6):
        rid = db.commit_record(rec(keys[0], latencies=[float(6 - i)], config={"i": i}))
        db.commit_features(rid, 1, [float(i)])
    for i in range(3):
        db.commit_record(rec(keys[0], GPU, latencies=[float(i + 1)], config={"i": i}))
    db.commit_record(rec(keys[0], status="compile_error", config={"bad": 1}))
    deleted = db.prune(2)
    assert deleted == 4 + 1
    assert [r.median_us for r in db.top_k(keys[0], CPU, 10)] == [1.0, 2.0]
    assert [r.median_us for r in db.top_k(keys[0], GPU, 10)] == [1.0, 2.0]
    assert db.count_records("compile_error") == 1
    assert len(db.features(1)) == 2  # features of pruned records are gone
    assert db.prune(2) == 0
    assert db.prune(1, keep_errors=False) == 3
    assert db.count_records() == 2 and db.count_records("compile_error") == 0
    with pytest.raises(InvalidRecordError):
        db.prune(0)


def test_warnings_are_not_errors_by_default(db: TuningDatabase) -> None:
    keys = add_basics(db)
    db.commit_record(rec(keys[0]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert db.best(keys[0], CPU, validate=lambda r: None) is not None
