"""`kiln query ...` and `kiln db ...`: in-process through tuner.cli.main, and as real subprocesses."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from db.database import TuningDatabase
from tests.cli import kiln, kiln_process
from tests.db.helpers import CPU, GPU, GPU2, add_basics, rec
from tuner.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _fill(url: str) -> list[str]:
    with TuningDatabase.open(url) as db:
        keys = add_basics(db, 3)
        run = db.begin_run("mlp", "h1", CPU, {"trials": 8}, "kiln tune --model mlp")
        db.register_model_tasks("mlp", "h1", [(keys[0], 2), (keys[1], 1)])
        db.commit_record(rec(keys[0], latencies=[5.0], config={"vector": 4}, run_id=run))
        db.commit_record(rec(keys[0], latencies=[3.0], config={"vector": 8}, run_id=run))
        db.commit_record(rec(keys[0], status="compile_error", config={"vector": 64}, error="too wide"))
        db.commit_record(rec(keys[1], GPU, latencies=[1.0], config={"block": 128}))
        db.finish_run(run)
    return keys


@pytest.fixture
def url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.delenv("KILN_DB", raising=False)
    return f"sqlite:///{tmp_path / 'kiln.db'}"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_query_best_for_a_model(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    keys = _fill(url)
    status, out, _ = _run(capsys, "query", "best", "--model", "mlp", "--target", "cpu", "--db", url)
    assert status == 0
    assert keys[0][:16] in out and keys[0] not in out  # tables show key prefixes
    assert '{"vector":8}' in out and "1/2 tasks tuned on " + CPU in out
    status, out, _ = _run(
        capsys, "query", "best", "--model", "mlp", "--target", CPU, "--db", url, "--format", "json"
    )
    rows = {r["workload"]: r for r in json.loads(out)}
    assert set(rows) == {keys[0], keys[1]}
    assert rows[keys[0]]["config"] == {"vector": 8} and rows[keys[0]]["median_us"] == 3.0
    assert rows[keys[0]]["weight"] == 2.0
    assert rows[keys[1]]["config"] is None  # not tuned on the CPU
    status, out, _ = _run(capsys, "query", "best", "--workload", keys[1][:8], "--target", "cuda", "--db", url)
    assert status == 0 and '{"block":128}' in out


def test_query_best_errors(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    _fill(url)
    status, _, err = _run(capsys, "query", "best", "--model", "bert", "--target", "cpu", "--db", url)
    assert status == 2
    assert "no tasks recorded for model 'bert'; run `kiln tune --model bert` first" in err
    with TuningDatabase.open(url) as db:
        db.commit_target(GPU2, {})
    status, _, err = _run(capsys, "query", "best", "--model", "mlp", "--target", "cuda", "--db", url)
    assert status == 2 and "matches several targets" in err and GPU in err and GPU2 in err
    status, _, err = _run(capsys, "query", "best", "--model", "mlp", "--target", "rocm", "--db", url)
    assert status == 2 and "no target matches 'rocm'" in err


def test_query_records_workloads_coverage(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    keys = _fill(url)
    status, out, _ = _run(
        capsys, "query", "records", "--workload", keys[0][:6], "--top", "2", "--db", url, "--format", "csv"
    )
    rows = list(csv.DictReader(io.StringIO(out)))
    assert status == 0 and [r["median_us"] for r in rows] == ["3.0", "5.0"]
    assert json.loads(rows[0]["config"]) == {"vector": 8}
    status, out, _ = _run(
        capsys, "query", "records", "--workload", keys[0], "--status", "compile_error", "--db", url
    )
    assert "compile_error" in out and "too wide" in out
    status, out, _ = _run(capsys, "query", "workloads", "--db", url, "--format", "json")
    counts = {r["workload"]: (r["records"], r["ok"]) for r in json.loads(out)}
    assert counts == {keys[0]: (3, 2), keys[1]: (1, 1), keys[2]: (0, 0)}
    status, out, _ = _run(capsys, "query", "workloads", "--model", "mlp", "--db", url, "--format", "json")
    assert {r["workload"] for r in json.loads(out)} == {keys[0], keys[1]}
    status, out, _ = _run(
        capsys, "query", "coverage", "--model", "mlp", "--target", "cpu", "--db", url, "--format", "json"
    )
    cov = {r["workload"]: r for r in json.loads(out)}
    assert cov[keys[0]]["tuned"] is True and cov[keys[0]]["compile_error"] == 1 and cov[keys[0]]["ok"] == 2
    assert cov[keys[1]]["tuned"] is False and cov[keys[1]]["records"] == 0
    status, out, _ = _run(capsys, "query", "coverage", "--model", "mlp", "--target", "cpu", "--db", url)
    assert "1/2 tasks tuned (67% of the weighted tasks)" in out
    for what in ("targets", "models", "runs"):
        status, out, _ = _run(capsys, "query", what, "--db", url, "--format", "json")
        assert status == 0 and json.loads(out)


def test_db_commands(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _fill(url)
    export = tmp_path / "all.jsonl"
    status, _, err = _run(capsys, "db", "export", str(export), "--db", url)
    assert status == 0 and "exported 4 records" in err
    other = f"sqlite:///{tmp_path / 'other.db'}"
    monkeypatch.setenv("KILN_DB", other)  # no --db: KILN_DB is used
    status, out, _ = _run(capsys, "db", "import", str(export))
    assert status == 0 and "4 records added, 0 duplicates skipped" in out
    status, out, _ = _run(capsys, "db", "import", str(export))
    assert "0 records added, 4 duplicates skipped" in out
    third = f"sqlite:///{tmp_path / 'third.db'}"
    status, out, _ = _run(capsys, "db", "merge", url, "--db", third)
    assert status == 0 and "4 records added" in out
    status, out, _ = _run(capsys, "db", "prune", "--keep-top", "1", "--db", third)
    assert status == 0 and "deleted 1 records, 3 left" in out
    status, out, _ = _run(capsys, "db", "prune", "--keep-top", "1", "--drop-errors", "--db", third)
    assert "deleted 1 records, 2 left" in out
    status, out, _ = _run(capsys, "db", "info", "--db", third, "--format", "json")
    info = {r["item"]: r["value"] for r in json.loads(out)}
    assert info["records"] == 2 and info["schema revision"] == "0003_plans"
    status, out, _ = _run(capsys, "db", "upgrade", "--db", third)
    assert "already at revision 0003_plans" in out
    new = tmp_path / "new.db"
    status, out, _ = _run(capsys, "db", "upgrade", "--db", f"sqlite:///{new}")
    assert "created the tuning-database schema at revision 0003_plans" in out and new.exists()


def test_query_on_missing_database_does_not_create_it(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.db"
    status, _, err = _run(capsys, "query", "workloads", "--db", f"sqlite:///{missing}")
    assert status == 2 and "does not exist" in err and not missing.exists()


def test_postgresql_via_cli(postgres_head_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    _fill(postgres_head_url)
    url = postgres_head_url.replace("postgresql+psycopg://", "postgresql://")  # rewritten to psycopg
    status, out, _ = _run(
        capsys, "query", "best", "--model", "mlp", "--target", "cpu", "--db", url, "--format", "json"
    )
    assert status == 0 and {"vector": 8} in [r["config"] for r in json.loads(out)]


def test_subprocess_query_and_errors_without_traceback(url: str, tmp_path: Path) -> None:
    keys = _fill(url)
    done = kiln_process(
        "query", "records", "--workload", keys[0], "--top", "10", "--format", "json", env={"KILN_DB": url}
    )
    assert done.returncode == 0, done.stderr
    assert [r["status"] for r in json.loads(done.stdout)] == ["ok", "ok", "compile_error"]
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(os.urandom(8192))
    done = kiln_process("query", "workloads", "--db", f"sqlite:///{corrupt}")
    assert done.returncode == 2
    assert "not a valid SQLite database" in done.stderr and "Traceback" not in done.stderr
    done = kiln_process("query", "best", "--model", "nope", "--target", "cpu", "--db", url)
    assert done.returncode == 2 and "no tasks recorded for model 'nope'" in done.stderr
    assert "Traceback" not in done.stderr


def test_importing_the_cli_is_cheap() -> None:
    """Building the whole `kiln` parser (what `kiln --help` does) imports no database or tuning library."""
    heavy = ("sqlalchemy", "pandas", "alembic", "optuna", "sklearn", "rich")
    code = (
        "import sys, tuner.cli; tuner.cli.build_parser(); "
        f"print(sorted(m for m in {heavy!r} if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    done = kiln("query", "--help")
    assert done.returncode == 0 and "coverage" in done.stdout and "records" in done.stdout
    done = kiln("db", "--help")
    assert all(word in done.stdout for word in ("upgrade", "export", "import", "merge", "prune"))
