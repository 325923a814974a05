"""Schema versions: creation through the migrations, the committed revision-0001 database, upgrades,
downgrades, refusal of older and newer schemas, and coexistence with Optuna's tables."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

from db import migrate
from db.canonical import record_fingerprint
from db.database import TuningDatabase
from db.engine import make_engine
from db.errors import DatabaseNotFoundError, SchemaError, SchemaTooNewError, SchemaTooOldError
from db.models import Base
from tests.db.data import make_v1_db as v1
from tests.db.helpers import CPU, add_basics, rec

ROOT = Path(__file__).resolve().parents[2]
V1_FILE = Path(__file__).resolve().parent / "data" / "kiln_v0001.sqlite"
HEAD = "0007_plan_whole"  # the head migration (kiln_fusion_plans.whole_us, rule_whole_us)
KILN_TABLES = {
    "kiln_workloads",
    "kiln_targets",
    "kiln_runs",
    "kiln_records",
    "kiln_model_tasks",
    "kiln_confirmations",
    "kiln_fusion_plans",
    "kiln_features",
    "kiln_bench_runs",
    "kiln_bench_results",
    "kiln_leases",
    "kiln_alembic_version",
}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(params=("sqlite_file", "postgresql"))
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh empty database (file SQLite or PostgreSQL)."""
    if request.param == "sqlite_file":
        return f"sqlite:///{tmp_path / 'kiln.db'}"
    return request.getfixturevalue("postgres_url")


def test_chain_and_version_table() -> None:
    known = ("0001", "0002", "0003_confirmed", "0004_bench", "0005_leases", "0006_plans", HEAD)
    assert migrate.known_revisions() == known
    assert migrate.head_revision() == HEAD
    assert migrate.VERSION_TABLE == "kiln_alembic_version"


def test_new_database_is_created_at_head_through_alembic(empty_url: str) -> None:
    with TuningDatabase.open(empty_url) as db:
        tables = set(inspect(db.engine).get_table_names())
        assert tables == KILN_TABLES  # Kiln's own version table; no plain alembic_version
        with db.engine.connect() as conn:
            assert conn.execute(text("SELECT version_num FROM kiln_alembic_version")).scalar() == HEAD


def test_models_match_migrations(empty_url: str) -> None:
    """The ORM models and the migrations at head describe the same schema (alembic autogenerate is empty)."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    with TuningDatabase.open(empty_url) as db, db.engine.connect() as conn:
        context = MigrationContext.configure(
            conn,
            opts={
                "version_table": migrate.VERSION_TABLE,
                "include_name": lambda name, type_, parents: type_ != "table" or name.startswith("kiln_"),
                "compare_type": True,
            },
        )
        assert compare_metadata(context, Base.metadata) == []


def test_open_without_create_on_an_empty_database(tmp_path: Path) -> None:
    with pytest.raises(DatabaseNotFoundError, match="does not exist"):
        TuningDatabase.open(f"sqlite:///{tmp_path / 'none.db'}", create=False)
    assert not (tmp_path / "none.db").exists()
    (tmp_path / "empty.db").write_bytes(b"")
    with pytest.raises(DatabaseNotFoundError, match="kiln db upgrade"):
        TuningDatabase.open(f"sqlite:///{tmp_path / 'empty.db'}", create=False)
    with pytest.raises(DatabaseNotFoundError):
        TuningDatabase.open("sqlite://", create=False)


def _check_upgraded_v1(db: TuningDatabase) -> None:
    """What the revision-0001 sample data must look like after the upgrade."""
    assert db.count_records() == 7
    best = db.best(v1.W1, v1.CPU)
    assert (
        best.id == 2 and best.median_us == 9.5 and best.config == {"threads": 2, "vector": 16}
    )  # tie: older
    assert best.run_id == 1 and best.host == "oldhost" and best.kiln_version == "0.0.9"
    assert db.best(v1.W1, v1.GPU).config == {"threads_per_row": 128, "unroll": 1}
    assert db.best(v1.W2, v1.CPU).median_us == 1.125
    assert db.count_records("invalid_config") == 1
    assert db.model_tasks("softmax") == sorted([(v1.W1, 1.0), (v1.W2, 2.0)])
    assert [r.model_name for r in db.runs()] == ["softmax"]
    assert db.best_fusion_plan("region0", v1.CPU).latency_us == 20.5
    with db.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT r.fingerprint, w.key, t.key, r.sketch, r.sketch_version, r.config, r.latencies, "
                "r.status, r.created_at FROM kiln_records r JOIN kiln_workloads w ON w.id = r.workload_id "
                "JOIN kiln_targets t ON t.id = r.target_id"
            )
        ).all()
    for fp, *identity in rows:  # migration 0002's frozen copy agrees with db.canonical
        created = identity[-1]
        if isinstance(created, str):
            from datetime import datetime

            created = datetime.fromisoformat(created)
        assert fp == record_fingerprint(*identity[:-1], created)
    # Writing works after the upgrade, and the new table and constraint exist.
    rid = db.commit_record(rec(v1.W2, v1.CPU, latencies=[0.5], config={"vector": 16}))
    db.commit_features(rid, 1, [1.0, 2.0])
    assert db.best(v1.W2, v1.CPU).id == rid
    with pytest.raises(IntegrityError), db.engine.begin() as conn:
        conn.execute(text("UPDATE kiln_records SET status = 'great' WHERE id = 1"))


def test_v1_file_is_refused_then_upgraded(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    shutil.copy(V1_FILE, path)
    url = f"sqlite:///{path}"
    digest = _sha(path)
    with pytest.raises(SchemaTooOldError, match=r"revision 0001.*run `kiln db upgrade --db sqlite:///"):
        TuningDatabase.open(url)
    assert _sha(path) == digest  # nothing was written
    engine = make_engine(url)
    try:
        assert migrate.upgrade(engine, url) == ("0001", HEAD)
        assert migrate.upgrade(engine, url) == (HEAD, HEAD)
    finally:
        engine.dispose()
    with TuningDatabase.open(url) as db:
        _check_upgraded_v1(db)


def test_v1_upgrade_on_postgresql(postgres_url: str) -> None:
    engine = make_engine(postgres_url)
    try:
        migrate.upgrade(engine, postgres_url, "0001")
        with engine.begin() as conn:
            v1.fill_v1(conn)
    finally:
        engine.dispose()
    with pytest.raises(SchemaTooOldError, match="kiln db upgrade --db postgresql"):
        TuningDatabase.open(postgres_url)
    engine = make_engine(postgres_url)
    try:
        assert migrate.upgrade(engine, postgres_url) == ("0001", HEAD)
    finally:
        engine.dispose()
    with TuningDatabase.open(postgres_url) as db:
        _check_upgraded_v1(db)


def test_kiln_db_upgrade_command(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    shutil.copy(V1_FILE, path)
    cmd = [sys.executable, "-m", "tuner.cli", "db", "upgrade", "--db", f"sqlite:///{path}"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"upgraded the schema from revision 0001 to {HEAD}" in done.stdout
    with TuningDatabase.open(f"sqlite:///{path}") as db:
        assert db.count_records() == 7


def test_downgrade_then_upgrade_keeps_data(empty_url: str) -> None:
    with TuningDatabase.open(empty_url) as db:
        keys = add_basics(db)
        rid = db.commit_record(rec(keys[0], latencies=[2.0]))
        db.commit_record(rec(keys[0], status="timeout"))
        db.commit_features(rid, 1, [1.0])
    engine = make_engine(empty_url)
    try:
        migrate.downgrade(engine, empty_url, "0001")
        with pytest.raises(SchemaTooOldError):
            TuningDatabase.open(empty_url)
        migrate.upgrade(engine, empty_url)
    finally:
        engine.dispose()
    with TuningDatabase.open(empty_url) as db:
        assert db.count_records() == 2
        assert db.best(keys[0], CPU).id == rid
        assert db.features(1) == {}  # the features table was dropped and re-created


def test_newer_schema_is_refused_and_not_written(empty_url: str) -> None:
    with TuningDatabase.open(empty_url) as db:
        keys = add_basics(db)
        db.commit_record(rec(keys[0]))
        with db.engine.begin() as conn:
            conn.execute(text("UPDATE kiln_alembic_version SET version_num = '0099'"))
    path = Path(empty_url.removeprefix("sqlite:///")) if empty_url.startswith("sqlite") else None
    digest = _sha(path) if path else None
    with pytest.raises(SchemaTooNewError, match=r"revision 0099.*newer Kiln.*Nothing was written"):
        TuningDatabase.open(empty_url)
    engine = make_engine(empty_url)
    try:
        with pytest.raises(SchemaTooNewError):
            migrate.upgrade(engine, empty_url)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT version_num FROM kiln_alembic_version")).scalar() == "0099"
            assert conn.execute(text("SELECT count(*) FROM kiln_records")).scalar() == 1
    finally:
        engine.dispose()
    if path:
        assert _sha(path) == digest


def test_unversioned_kiln_tables_are_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'odd.db'}"
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE kiln_workloads (id INTEGER PRIMARY KEY)"))
    engine.dispose()
    with pytest.raises(SchemaError, match="no kiln_alembic_version"):
        TuningDatabase.open(url)


# -- Optuna's RDB storage lives in the same database -----------------------------------------------------


@pytest.mark.parametrize("optuna_first", [True, False], ids=["optuna-first", "kiln-first"])
def test_optuna_and_kiln_share_one_database(empty_url: str, optuna_first: bool) -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)

    def use_optuna() -> None:
        storage = optuna.storages.RDBStorage(empty_url)
        study = optuna.create_study(study_name="s", storage=storage, load_if_exists=True)
        study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
        storage.remove_session()
        storage.engine.dispose()

    def use_kiln() -> None:
        with TuningDatabase.open(empty_url) as db:
            keys = add_basics(db, 1)
            db.commit_record(rec(keys[0]))

    first, second = (use_optuna, use_kiln) if optuna_first else (use_kiln, use_optuna)
    first()
    second()
    use_optuna()  # both reopen fine in either order
    use_kiln()
    with TuningDatabase.open(empty_url) as db:
        assert db.count_records() == 2
        tables = set(inspect(db.engine).get_table_names())
        with db.engine.connect() as conn:
            kiln_rev = conn.execute(text("SELECT version_num FROM kiln_alembic_version")).scalar()
            optuna_rev = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    assert tables >= KILN_TABLES and {"studies", "trials", "alembic_version"} <= tables
    assert kiln_rev == HEAD and optuna_rev and optuna_rev != kiln_rev
    study = optuna.load_study(study_name="s", storage=empty_url)
    assert len(study.trials) == 4
