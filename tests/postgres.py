"""A throwaway PostgreSQL server for the tests, from pytest-postgresql (its ``PostgreSQLExecutor`` and
``DatabaseJanitor``), run as the unprivileged ``postgres`` user when the tests run as root.

PostgreSQL refuses to run as root, and pytest's temp directories are private to root, so the server
lives in its own temp directory owned by ``postgres`` and the executor drives ``pg_ctl`` through a small
wrapper script in it that runs ``runuser -u postgres -- pg_ctl ...`` (plain ``pg_ctl`` when not root).
The server listens on 127.0.0.1 on a free port with ``trust`` authentication, fsync off.

A guardian process holds the read end of a pipe from the test process: when that process ends in any way
(normal teardown, SIGTERM, SIGKILL), the pipe closes and the guardian stops the server and deletes its
directory, so an interrupted test run never leaves a server behind.

Fixtures (import them into a conftest or test module): ``postgres_server`` (session), ``postgres_templates``
(session: an empty template database) and ``postgres_url`` (a fresh EMPTY database per test, dropped
after it). Missing server binaries make these tests fail with a message, never skip; ``scripts/test``
installs them. ``running_server(durable=True)`` is the same server for benchmarks (``scripts/bench_db.py``),
with PostgreSQL's default durability.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

EMPTY_TEMPLATE = "kiln_template_empty"
PG_BINARIES = ("initdb", "pg_ctl", "postgres")
_counter = itertools.count()

WRAPPER = """#!/bin/sh
# pg_ctl for pytest-postgresql, as the unprivileged postgres user when run as root
cd /
if [ "$(id -u)" = 0 ]; then exec runuser -u postgres -- "{bin}/pg_ctl" "$@"; fi
exec "{bin}/pg_ctl" "$@"
"""

# Stops the server and removes its directory once the test process's end of the pipe closes.
GUARDIAN = """
import shutil, subprocess, sys
sys.stdin.read()
subprocess.run([sys.argv[1], "stop", "-D", sys.argv[2], "-m", "immediate"], capture_output=True, timeout=60)
shutil.rmtree(sys.argv[3], ignore_errors=True)
"""


class PostgresUnavailableError(RuntimeError):
    """The PostgreSQL server binaries (or runuser / the postgres user, when root) are missing."""


def find_pg_bin() -> Path | None:
    """The directory holding initdb, pg_ctl and postgres (PATH first, then /usr/lib/postgresql/*/bin)."""
    found = shutil.which("initdb")
    candidates = [Path(found).resolve().parent] if found else []
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]
    for directory in candidates:
        if all((directory / b).exists() for b in PG_BINARIES):
            return directory
    return None


@dataclass
class Server:
    """The running server: its port and the executor that started it."""

    executor: object
    port: int

    def url(self, dbname: str = "postgres") -> str:
        """SQLAlchemy URL of a database on this server."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{dbname}"

    def janitor(self, dbname: str, template: str | None = None):  # type: ignore[no-untyped-def]
        from pytest_postgresql.janitor import DatabaseJanitor

        return DatabaseJanitor(
            user="postgres", host="127.0.0.1", port=self.port, dbname=dbname, template_dbname=template
        )


def _start(durable: bool = False) -> tuple[Server, subprocess.Popen[bytes]]:
    from port_for import get_port
    from pytest_postgresql.executors import PostgreSQLExecutor

    pg_bin = find_pg_bin()
    if pg_bin is None:
        raise PostgresUnavailableError(
            "PostgreSQL server binaries (initdb, pg_ctl, postgres) were not found on PATH or in "
            "/usr/lib/postgresql/*/bin: install the PostgreSQL server (scripts/test does, with apt-get)"
        )
    base = Path(tempfile.mkdtemp(prefix="kiln-pg-"))
    if os.geteuid() == 0:
        import pwd

        if shutil.which("runuser") is None:
            raise PostgresUnavailableError("running as root but `runuser` (util-linux) is missing")
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            raise PostgresUnavailableError(
                "running as root but there is no `postgres` user to run the server as"
            ) from None
        os.chown(base, user.pw_uid, user.pw_gid)
    wrapper = base / "pg_ctl"
    wrapper.write_text(WRAPPER.format(bin=pg_bin))
    wrapper.chmod(0o755)
    datadir = base / "data"
    guardian = subprocess.Popen(
        [sys.executable, "-c", GUARDIAN, str(wrapper), str(datadir), str(base)],
        stdin=subprocess.PIPE,
        start_new_session=True,  # a signal to the test's process group must not stop the guardian first
    )
    port = get_port(None)
    assert port is not None
    executor = PostgreSQLExecutor(
        executable=str(wrapper),
        host="127.0.0.1",
        port=port,
        datadir=str(datadir),
        unixsocketdir=str(base),
        logfile=str(base / "server.log"),
        startparams="-w",
        dbname="postgres",
        postgres_options="-c max_connections=200"
        + ("" if durable else " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"),
    )
    try:
        executor.start()
    except BaseException:
        guardian.stdin.close()  # type: ignore[union-attr]
        guardian.wait(timeout=60)
        raise
    return Server(executor, port), guardian


@contextlib.contextmanager
def running_server(durable: bool = False) -> Iterator[Server]:
    """A private PostgreSQL server for the block (stopped and deleted afterwards); ``durable`` keeps
    fsync and synchronous commit on."""
    server, guardian = _start(durable)
    try:
        yield server
    finally:
        try:
            server.executor.stop()  # type: ignore[attr-defined]
        finally:
            guardian.stdin.close()  # type: ignore[union-attr]
            guardian.wait(timeout=60)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Server]:
    """A private PostgreSQL server for the whole test session (fails, never skips, without binaries)."""
    try:
        with running_server() as server:
            yield server
    except PostgresUnavailableError as exc:
        pytest.fail(f"cannot start the PostgreSQL server for the database tests: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def postgres_templates(postgres_server: Server) -> Server:
    """An empty template database on the server (copying it is faster than creating from scratch)."""
    postgres_server.janitor(EMPTY_TEMPLATE).init()
    return postgres_server


@pytest.fixture
def postgres_url(postgres_templates: Server) -> Iterator[str]:
    """URL of a fresh, EMPTY database on the session's PostgreSQL server (dropped afterwards)."""
    name = f"kiln_test_{next(_counter)}"
    janitor = postgres_templates.janitor(name, template=EMPTY_TEMPLATE)
    janitor.init()
    try:
        yield postgres_templates.url(name)
    finally:
        janitor.drop()
