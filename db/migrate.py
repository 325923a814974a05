"""Schema versions: run Kiln's alembic migrations programmatically and check a database's revision.

The migration scripts live inside the package (``db/migrations``) and are driven from here, so no
``alembic.ini`` is needed in the user's working directory. Kiln's alembic version table is
``kiln_alembic_version``, so another tool's ``alembic_version`` in the same database never clashes
(Optuna's, in databases where earlier Kiln versions kept Optuna studies).
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from db.engine import WRITE_OPTION, display_url, translate_errors
from db.errors import SchemaError, SchemaTooNewError, SchemaTooOldError

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory
    from sqlalchemy.engine import Connection, Engine

VERSION_TABLE = "kiln_alembic_version"
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# Key of the PostgreSQL advisory lock that serializes schema creation and upgrades between processes.
PG_SCHEMA_LOCK = 0x6B696C6E  # "kiln"


class SchemaState(enum.Enum):
    """Where a database stands relative to the migrations this code knows."""

    EMPTY = "empty"  # no Kiln tables at all (Optuna's or anyone else's tables may exist)
    CURRENT = "current"  # at head
    OLD = "old"  # at a known revision before head
    NEW = "new"  # at a revision this code does not know (made by a newer Kiln)
    UNVERSIONED = "unversioned"  # kiln_ tables but no version table: not made by Kiln's migrations


@dataclass(frozen=True)
class SchemaInfo:
    """The state of a database and its revision (None when there is none)."""

    state: SchemaState
    revision: str | None
    head: str


def alembic_config(connection: Connection | None = None) -> Config:
    """An alembic Config pointing at ``db/migrations``; ``connection`` is handed to ``env.py``."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("version_table", VERSION_TABLE)
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


@functools.cache
def script_directory() -> ScriptDirectory:
    """The alembic script directory of Kiln's migrations (loaded once per process)."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    """The newest revision this code knows."""
    head = script_directory().get_current_head()
    assert head is not None
    return head


@functools.cache
def known_revisions() -> tuple[str, ...]:
    """All revisions of the chain, oldest first."""
    return tuple(rev.revision for rev in reversed(list(script_directory().walk_revisions())))


def inspect_schema(conn: Connection) -> SchemaInfo:
    """Read the database's Kiln revision (without writing anything) and classify it."""
    from sqlalchemy import inspect, text

    head = head_revision()
    tables = set(inspect(conn).get_table_names())
    if VERSION_TABLE not in tables:
        if any(t.startswith("kiln_") for t in tables):
            return SchemaInfo(SchemaState.UNVERSIONED, None, head)
        return SchemaInfo(SchemaState.EMPTY, None, head)
    revs = [row[0] for row in conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}"))]
    if not revs:
        return SchemaInfo(SchemaState.EMPTY, None, head)
    if len(revs) > 1:
        return SchemaInfo(SchemaState.NEW, ",".join(sorted(revs)), head)
    rev = revs[0]
    if rev == head:
        return SchemaInfo(SchemaState.CURRENT, rev, head)
    if rev in known_revisions():
        return SchemaInfo(SchemaState.OLD, rev, head)
    return SchemaInfo(SchemaState.NEW, rev, head)


def raise_for_schema(info: SchemaInfo, url: str) -> None:
    """Raise the error that tells the user what to do about a database that is not at head."""
    shown = display_url(url)
    if info.state is SchemaState.OLD:
        raise SchemaTooOldError(
            f"{shown} has tuning-database schema revision {info.revision}, older than this Kiln's "
            f"{info.head}: run `kiln db upgrade --db {shown}` (back it up first if it matters)"
        )
    if info.state is SchemaState.NEW:
        raise SchemaTooNewError(
            f"{shown} has tuning-database schema revision {info.revision}, which this Kiln does not know "
            f"(its newest is {info.head}): it was written by a newer Kiln; upgrade Kiln to use it. "
            "Nothing was written."
        )
    if info.state is SchemaState.UNVERSIONED:
        raise SchemaError(
            f"{shown} has kiln_* tables but no {VERSION_TABLE} table: it was not created by Kiln's "
            "migrations; refusing to use it"
        )


def _lock_for_schema_change(conn: Connection) -> None:
    from sqlalchemy import text

    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": PG_SCHEMA_LOCK})


def upgrade(engine: Engine, url: str, revision: str = "head") -> tuple[str | None, str]:
    """Migrate the database to ``revision`` (default head); return (revision before, revision after).

    Runs in one transaction holding the write lock (SQLite) or an advisory lock (PostgreSQL), so that
    concurrent processes creating the same fresh database do not race. A database at a revision newer
    than this code raises :class:`SchemaTooNewError` and is left untouched.
    """
    from alembic import command

    with (
        translate_errors(url, "upgrade the schema"),
        engine.connect().execution_options(**{WRITE_OPTION: True}) as conn,
        conn.begin(),
    ):
        _lock_for_schema_change(conn)
        info = inspect_schema(conn)
        if info.state in (SchemaState.NEW, SchemaState.UNVERSIONED):
            raise_for_schema(info, url)
        target = info.head if revision == "head" else revision
        if info.revision != target:
            command.upgrade(alembic_config(conn), revision)
        after = inspect_schema(conn).revision
    assert after is not None
    return info.revision, after


def downgrade(engine: Engine, url: str, revision: str) -> None:
    """Migrate the database down to ``revision`` (used by tests of the migration chain)."""
    from alembic import command

    with (
        translate_errors(url, "downgrade the schema"),
        engine.connect().execution_options(**{WRITE_OPTION: True}) as conn,
        conn.begin(),
    ):
        _lock_for_schema_change(conn)
        command.downgrade(alembic_config(conn), revision)
