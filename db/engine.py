"""Database URLs and engines: resolution (``--db``, ``KILN_DB``, default file), SQLite and PostgreSQL setup,
and the translation of driver errors into :class:`db.errors.DatabaseError` messages that name the URL.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from db.errors import (
    CorruptDatabaseError,
    DatabaseConnectionError,
    DatabaseError,
    DatabaseNotFoundError,
    InvalidURLError,
    ReadOnlyDatabaseError,
)

if TYPE_CHECKING:
    from sqlalchemy.engine import URL, Engine

DEFAULT_URL = "sqlite:///kiln.db"
ENV_VAR = "KILN_DB"
# How long a SQLite writer waits for the lock held by another writer before giving up.
SQLITE_BUSY_TIMEOUT_S = 60.0
# Execution option that makes a SQLite transaction start with BEGIN IMMEDIATE (take the write lock up front,
# so concurrent writers queue on the busy timeout instead of failing on a lock upgrade).
WRITE_OPTION = "kiln_write"


def resolve_url(url: str | None = None) -> str:
    """Return the database URL to use: ``url``, else env ``KILN_DB``, else ``sqlite:///kiln.db``.

    ``postgresql://`` and ``postgres://`` are rewritten to the psycopg 3 driver (``postgresql+psycopg://``).
    Raises :class:`InvalidURLError` for a URL SQLAlchemy cannot parse.
    """
    if not url:
        url = os.environ.get(ENV_VAR) or DEFAULT_URL
    parsed = parse_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
        return parsed.render_as_string(hide_password=False)
    return url


def parse_url(url: str) -> URL:
    """Parse a SQLAlchemy URL, raising :class:`InvalidURLError` with the URL in the message."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url)
    except ArgumentError as exc:
        raise InvalidURLError(
            f"invalid database URL {url!r}: expected e.g. sqlite:///kiln.db or "
            f"postgresql+psycopg://user:password@host:5432/kiln ({exc})"
        ) from None


def display_url(url: str) -> str:
    """The URL with its password replaced by ``***`` (for messages and logs); SQLite URLs as given."""
    try:
        parsed = parse_url(url)
    except InvalidURLError:
        return url
    if parsed.get_backend_name() == "sqlite":
        return url
    return parsed.render_as_string(hide_password=True)


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL, or None for an in-memory database or another backend."""
    parsed = parse_url(url)
    if parsed.get_backend_name() != "sqlite":
        return None
    database = parsed.database or ""
    if database in ("", ":memory:") or parsed.query.get("mode") == "memory":
        return None
    if database.startswith("file:"):
        database = database[len("file:") :].split("?", 1)[0]
    return Path(database)


def is_readonly_sqlite(url: str) -> bool:
    """True for a SQLite URL opened with ``?mode=ro&uri=true``."""
    parsed = parse_url(url)
    return parsed.get_backend_name() == "sqlite" and parsed.query.get("mode") == "ro"


def make_engine(url: str, *, create: bool = True) -> Engine:
    """Create the SQLAlchemy engine for a resolved URL (see :func:`resolve_url`).

    SQLite: foreign keys on, ``synchronous=NORMAL`` (safe in WAL mode), a busy timeout, and transactions
    started by Kiln itself (``BEGIN`` for reads, ``BEGIN IMMEDIATE`` for writes). In-memory SQLite uses one
    shared connection. A SQLite file that does not exist is an error unless ``create`` is true.
    """
    from sqlalchemy import create_engine, event
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError
    from sqlalchemy.pool import StaticPool

    shown = display_url(url)
    parsed = parse_url(url)
    kwargs: dict = {}
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        path = sqlite_path(url)
        if path is None:
            kwargs.update(poolclass=StaticPool, connect_args={"check_same_thread": False})
        else:
            if not path.exists():
                if not create or is_readonly_sqlite(url):
                    raise DatabaseNotFoundError(
                        f"no database at {shown}: file {str(path)!r} does not exist "
                        "(`kiln tune` creates one; give another with --db URL or $KILN_DB)"
                    )
                if not path.parent.exists():
                    raise DatabaseConnectionError(
                        f"cannot create {shown}: directory {str(path.parent)!r} does not exist"
                    )
            elif path.is_dir():
                raise DatabaseConnectionError(f"cannot open {shown}: {str(path)!r} is a directory")
            kwargs.update(connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S})
    elif backend == "postgresql":
        kwargs.update(connect_args={"connect_timeout": 10}, pool_pre_ping=True)
    try:
        engine = create_engine(url, **kwargs)
    except (ArgumentError, NoSuchModuleError) as exc:
        raise InvalidURLError(f"cannot use database URL {shown}: {exc}") from None
    except ImportError as exc:
        raise InvalidURLError(f"cannot use database URL {shown}: driver not installed ({exc})") from None

    if backend == "sqlite":

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
            dbapi_connection.isolation_level = None  # Kiln emits BEGIN itself (see _on_begin)
            cursor = dbapi_connection.cursor()
            cursor.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
            cursor.execute("PRAGMA foreign_keys = ON")
            cursor.execute("PRAGMA synchronous = NORMAL")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn) -> None:  # type: ignore[no-untyped-def]
            write = conn.get_execution_options().get(WRITE_OPTION, False)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


def ensure_wal(engine: Engine, url: str) -> None:
    """Put a SQLite file in WAL mode (persistent in the file; a no-op if already WAL or read-only)."""
    if sqlite_path(url) is None or is_readonly_sqlite(url):
        return
    # Switching to WAL takes an exclusive lock, and SQLite does not always call the busy handler for it:
    # several processes opening a fresh file at once get "database is locked" at once. Retry (re-reading
    # the mode: another process may have switched it) for as long as a writer would wait for the lock.
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    delay = 0.01
    with translate_errors(url, "enable WAL mode"), engine.connect() as conn:
        dbapi = conn.connection.dbapi_connection
        while True:
            cursor = dbapi.cursor()  # type: ignore[union-attr]
            try:
                mode = cursor.execute("PRAGMA journal_mode").fetchone()[0]
                if str(mode).lower() != "wal":
                    cursor.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as exc:
                busy = "locked" in str(exc) or "busy" in str(exc)
                if not busy or time.monotonic() + delay > deadline:
                    raise
            finally:
                cursor.close()
            time.sleep(delay)
            delay = min(delay * 2, 0.5)


@contextlib.contextmanager
def translate_errors(url: str, action: str) -> Iterator[None]:
    """Turn SQLAlchemy/driver errors raised inside the block into DatabaseError subclasses naming ``url``."""
    from sqlalchemy.exc import DBAPIError, SQLAlchemyError

    try:
        yield
    except DatabaseError:
        raise
    except SQLAlchemyError as exc:
        shown = display_url(url)
        orig = exc.orig if isinstance(exc, DBAPIError) else exc
        text = " ".join(str(orig).split())
        low = text.lower()
        if "file is not a database" in low or "malformed" in low:
            raise CorruptDatabaseError(
                f"{shown} is not a valid SQLite database (the file is corrupt or of another kind): {text}"
            ) from None
        if "readonly" in low or "read-only" in low or "read only" in low:
            hint = ""
            if sqlite_path(url) is not None:
                hint = "; SQLite needs write permission on the file, and on its directory for WAL mode"
            raise ReadOnlyDatabaseError(f"cannot {action}: {shown} is read-only ({text}){hint}") from None
        if "unable to open database file" in low:
            raise DatabaseConnectionError(f"cannot open {shown}: {text}") from None
        if "database is locked" in low:
            raise DatabaseError(
                f"cannot {action}: {shown} stayed locked by another writer for more than "
                f"{SQLITE_BUSY_TIMEOUT_S:.0f} s ({text})"
            ) from None
        if (isinstance(exc, DBAPIError) and exc.connection_invalidated) or _is_connect_failure(low):
            raise DatabaseConnectionError(f"cannot connect to {shown}: {text}") from None
        raise DatabaseError(f"cannot {action} on {shown}: {text}") from None


def _is_connect_failure(low: str) -> bool:
    needles = (
        "connection refused",
        "could not connect",
        "connection failed",
        "connection to server",
        "could not translate host name",
        "name or service not known",
        "password authentication failed",
        "timeout expired",
    )
    return any(n in low for n in needles) or re.search(r'database "[^"]*" does not exist', low) is not None
