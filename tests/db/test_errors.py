"""Clear errors for bad URLs, unreachable servers, corrupt and read-only files; URL resolution."""

from __future__ import annotations

import multiprocessing
import os
import random
import shutil
import tempfile
from pathlib import Path

import pytest
from port_for import get_port

from db.database import TuningDatabase
from db.engine import DEFAULT_URL, display_url, resolve_url
from db.errors import (
    CorruptDatabaseError,
    DatabaseConnectionError,
    DatabaseError,
    DatabaseNotFoundError,
    InvalidURLError,
    ReadOnlyDatabaseError,
)
from tests.db.helpers import CPU, add_basics, rec, wkey
from tests.postgres import Server

V1_FILE = Path(__file__).resolve().parent / "data" / "kiln_v0001.sqlite"


# -- URL resolution -------------------------------------------------------------------------------------


def test_resolve_url_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KILN_DB", raising=False)
    assert resolve_url(None) == DEFAULT_URL == "sqlite:///kiln.db"
    monkeypatch.setenv("KILN_DB", "sqlite:////tmp/from-env.db")
    assert resolve_url(None) == "sqlite:////tmp/from-env.db"
    assert resolve_url("sqlite:///given.db") == "sqlite:///given.db"


def test_postgresql_urls_use_psycopg() -> None:
    assert resolve_url("postgresql://u:p@h:5433/kiln") == "postgresql+psycopg://u:p@h:5433/kiln"
    assert resolve_url("postgres://u@h/kiln") == "postgresql+psycopg://u@h/kiln"
    assert resolve_url("postgresql+psycopg://u@h/kiln") == "postgresql+psycopg://u@h/kiln"
    assert display_url("postgresql+psycopg://u:secret@h/kiln") == "postgresql+psycopg://u:***@h/kiln"


def test_default_url_is_kiln_db_in_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KILN_DB", raising=False)
    monkeypatch.chdir(tmp_path)
    with TuningDatabase.open() as db:
        assert db.url == "sqlite:///kiln.db"
    assert (tmp_path / "kiln.db").exists()


@pytest.mark.parametrize("url", ["not a url", "://nothing", "sqlite:/x.db:::"])
def test_unparsable_url(url: str) -> None:
    with pytest.raises(InvalidURLError, match="URL"):
        TuningDatabase.open(url)


def test_unknown_driver() -> None:
    with pytest.raises(InvalidURLError, match="foo://host/db"):
        TuningDatabase.open("foo://host/db")


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(DatabaseConnectionError, match=r"directory .* does not exist"):
        TuningDatabase.open(f"sqlite:///{tmp_path}/no/such/dir/kiln.db")


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(DatabaseConnectionError, match="is a directory"):
        TuningDatabase.open(f"sqlite:///{tmp_path}")


def test_unreachable_postgresql_hides_password() -> None:
    url = f"postgresql://kiln:secret-pw@127.0.0.1:{get_port(None)}/kiln"
    with pytest.raises(DatabaseConnectionError, match="cannot connect to postgresql") as err:
        TuningDatabase.open(url)
    assert "secret-pw" not in str(err.value) and "***" in str(err.value)


def test_missing_postgresql_database(postgres_server: Server) -> None:
    with pytest.raises(DatabaseConnectionError, match='database "nosuchdb" does not exist'):
        TuningDatabase.open(postgres_server.url("nosuchdb"))


# -- corrupt files --------------------------------------------------------------------------------------


def test_random_bytes_are_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "random.db"
    data = random.Random(5).randbytes(64 * 1024)
    path.write_bytes(data)
    with pytest.raises(CorruptDatabaseError, match=f"{path}.*not a valid SQLite database"):
        TuningDatabase.open(f"sqlite:///{path}")
    assert path.read_bytes() == data  # untouched


def test_damaged_database_file(tmp_path: Path) -> None:
    path = tmp_path / "damaged.db"
    data = bytearray(V1_FILE.read_bytes())
    rng = random.Random(0)
    for i in range(4096, len(data)):  # keep the header page, scramble the rest
        data[i] = rng.randrange(256)
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptDatabaseError, match="corrupt"):
        TuningDatabase.open(f"sqlite:///{path}")


def test_text_file_is_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("these are my notes, not a database\n" * 200)
    with pytest.raises(CorruptDatabaseError):
        TuningDatabase.open(f"sqlite:///{path}")


# -- read-only ------------------------------------------------------------------------------------------


def _make_db(path: Path) -> None:
    with TuningDatabase.open(f"sqlite:///{path}") as db:
        keys = add_basics(db)
        db.commit_record(rec(keys[0], latencies=[1.0]))


def test_read_only_uri(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    _make_db(path)
    url = f"sqlite:///file:{path}?mode=ro&uri=true"
    with TuningDatabase.open(url) as db:
        keys = [wkey(0)]
        assert db.best(keys[0], CPU) is not None  # reading works
        with pytest.raises(ReadOnlyDatabaseError, match="read-only"):
            db.commit_record(rec(keys[0]))
        with pytest.raises(ReadOnlyDatabaseError):
            db.commit_workload("new", {}, "k", 1, 1)
    with pytest.raises(DatabaseNotFoundError):
        TuningDatabase.open(f"sqlite:///file:{tmp_path / 'none.db'}?mode=ro&uri=true")


def _as_other_user(path: str, queue) -> None:  # type: ignore[no-untyped-def]
    """In a forked child: become the unprivileged user, then try to read and write ``path``."""
    import pwd
    import sqlite3  # noqa: F401  (imports from root-only locations must happen before setuid)

    import sqlalchemy.dialects.sqlite.pysqlite  # noqa: F401

    import db.exchange  # noqa: F401

    try:
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
        with TuningDatabase.open(f"sqlite:///{path}") as opened:
            key = wkey(0)
            found = opened.best(key, CPU) is not None
            try:
                opened.commit_record(rec(key))
                queue.put(("wrote", found, ""))
            except DatabaseError as exc:
                queue.put((type(exc).__name__, found, str(exc)))
    except BaseException as exc:
        queue.put(("failed", False, f"{type(exc).__name__}: {exc}"))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_read_only_file(tmp_path: Path) -> None:
    directory = Path(tempfile.mkdtemp(prefix="kiln-ro-"))  # world-readable, unlike pytest's tmp dirs
    try:
        os.chmod(directory, 0o777)
        path = directory / "k.db"
        _make_db(path)
        os.chmod(path, 0o444)
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        child = ctx.Process(target=_as_other_user, args=(str(path), queue))
        child.start()
        outcome, found, message = queue.get(timeout=60)
        child.join(timeout=60)
        assert (outcome, found) == ("ReadOnlyDatabaseError", True), message
        assert str(path) in message and "read-only" in message
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_read_only_file_in_read_only_directory() -> None:
    """Without write access to the directory SQLite cannot even read a WAL database: say so clearly."""
    if not hasattr(os, "fork"):
        pytest.skip("needs fork")
    directory = Path(tempfile.mkdtemp(prefix="kiln-ro-"))
    try:
        path = directory / "k.db"
        _make_db(path)
        os.chmod(path, 0o444)
        os.chmod(directory, 0o555)
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        child = ctx.Process(target=_as_other_user, args=(str(path), queue))
        child.start()
        outcome, _found, message = queue.get(timeout=60)
        child.join(timeout=60)
        assert outcome == "failed" and "ReadOnlyDatabaseError" in message, message
        assert str(path) in message and "directory" in message
    finally:
        os.chmod(directory, 0o755)
        shutil.rmtree(directory, ignore_errors=True)


def test_missing_postgresql_binaries_fail_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without initdb/pg_ctl the PostgreSQL fixture fails with this message (it never skips silently)."""
    from tests import postgres

    monkeypatch.setattr(postgres.shutil, "which", lambda name: None)
    monkeypatch.setattr(postgres.glob, "glob", lambda pattern: [])
    with pytest.raises(postgres.PostgresUnavailableError, match=r"initdb, pg_ctl, postgres.*install"):
        postgres._start()


def test_unknown_run_id_is_a_clear_error(tmp_path: Path) -> None:
    with TuningDatabase.open(f"sqlite:///{tmp_path / 'k.db'}") as db:
        keys = add_basics(db)
        with pytest.raises(DatabaseError, match=r"run 42 is not in .*begin_run"):
            db.commit_record(rec(keys[0], run_id=42))
        assert db.count_records() == 0
