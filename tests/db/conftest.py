"""Fixtures of the tuning-database tests.

``db_url`` / ``db`` are parametrized over the three backends of the contract suite: in-memory SQLite, file
SQLite and a real PostgreSQL server. The server (``postgres_server``, session scope, from
:mod:`tests.postgres`: pytest-postgresql's executor, as the ``postgres`` user when the tests run as root)
is a throwaway cluster on a free loopback port, removed afterwards; every test gets its own fresh database
on it (``postgres_url``: empty; ``postgres_head_url``: at the head schema). Missing PostgreSQL binaries
make these tests fail with a message, never skip.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from db.database import TuningDatabase
from tests import postgres
from tests.postgres import Server

# the PostgreSQL fixtures of tests/postgres.py, for every test module of tests/db
postgres_server = postgres.postgres_server
postgres_templates = postgres.postgres_templates
postgres_url = postgres.postgres_url

BACKENDS = ("sqlite_memory", "sqlite_file", "postgresql")
CONTRACT_DB = "kiln_contract"


@pytest.fixture(scope="session")
def _postgres_contract_db(postgres_server: Server) -> str:
    postgres_server.janitor(CONTRACT_DB).init()
    url = postgres_server.url(CONTRACT_DB)
    TuningDatabase.open(url).close()  # the schema at head, through the migrations
    return url


@pytest.fixture
def postgres_head_url(postgres_server: Server, _postgres_contract_db: str) -> str:
    """URL of a database at the head schema with every Kiln table emptied (ids restart at 1).

    Shared by the contract tests (truncating is ~5x faster than creating a database); tests that change
    the schema use ``postgres_url`` instead.
    """
    import psycopg

    with psycopg.connect(
        host="127.0.0.1", port=postgres_server.port, user="postgres", dbname=CONTRACT_DB, autocommit=True
    ) as conn:
        conn.execute("SET lock_timeout = '20s'")  # a test that leaked a transaction fails, not hangs
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT tablename FROM pg_tables WHERE tablename LIKE 'kiln\\_%' "
                "AND tablename <> 'kiln_alembic_version'"
            )
        ]
        conn.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")  # type: ignore[arg-type]
    return _postgres_contract_db


def backend_url(request: pytest.FixtureRequest, backend: str, tmp_path, *, empty: bool = False) -> str:  # type: ignore[no-untyped-def]
    """The URL of a fresh database of ``backend``: SQLite ones are empty (open() creates the schema);
    PostgreSQL ones are copies of the head template unless ``empty``."""
    if backend == "sqlite_memory":
        return "sqlite://"
    if backend == "sqlite_file":
        return f"sqlite:///{tmp_path / 'kiln.db'}"
    if backend == "postgresql":
        return request.getfixturevalue("postgres_url" if empty else "postgres_head_url")
    raise ValueError(backend)


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path) -> str:  # type: ignore[no-untyped-def]
    """A fresh database URL, once per backend (see backend_url)."""
    return backend_url(request, request.param, tmp_path)


@pytest.fixture(params=("sqlite_file", "postgresql"))
def shared_url(request: pytest.FixtureRequest, tmp_path) -> str:  # type: ignore[no-untyped-def]
    """A fresh EMPTY database URL that several processes can open (file SQLite and PostgreSQL)."""
    return backend_url(request, request.param, tmp_path, empty=True)


@pytest.fixture
def db(db_url: str) -> Iterator[TuningDatabase]:
    """An open TuningDatabase without data, once per backend."""
    with TuningDatabase.open(db_url) as opened:
        yield opened
