"""A throwaway PostgreSQL server for tests and benchmarks (``initdb`` + ``pg_ctl`` in a temp directory).

Used by the test suite's ``postgresql`` fixture and by ``scripts/bench_db.py``. It needs the PostgreSQL
server binaries (``initdb``, ``pg_ctl``, ``postgres``) on PATH (or in ``/usr/lib/postgresql/*/bin``) and
psycopg. When run as root it runs the server as the unprivileged ``postgres`` user through
``runuser -u postgres --`` (PostgreSQL refuses to run as root), in a temp directory that user owns. The
server listens on 127.0.0.1 on a free port with ``trust`` authentication; nothing is reachable from outside.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from db.errors import DatabaseError

PG_BINARIES = ("initdb", "pg_ctl", "postgres")


class PostgresUnavailableError(DatabaseError):
    """The PostgreSQL server binaries (or runuser / the postgres user, when root) are missing."""


def find_pg_bin() -> Path:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``; else an error naming what is missing."""
    found = shutil.which("initdb")
    candidates = [Path(found).resolve().parent] if found else []
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]
    for directory in candidates:
        if all((directory / b).exists() for b in PG_BINARIES):
            return directory
    raise PostgresUnavailableError(
        "PostgreSQL server binaries (initdb, pg_ctl, postgres) were not found on PATH or in "
        "/usr/lib/postgresql/*/bin: install the PostgreSQL server (e.g. `apt-get install postgresql`) to run "
        "the PostgreSQL tests and benchmarks"
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TemporaryPostgres:
    """Start a private PostgreSQL cluster; ``url(dbname)`` gives SQLAlchemy URLs; ``stop()`` removes it.

    ``durable=False`` (tests) turns off fsync for speed; benchmarks keep PostgreSQL's defaults.
    """

    def __init__(self, *, durable: bool = False, user: str = "postgres") -> None:
        self.bin = find_pg_bin()
        self.as_root = os.geteuid() == 0
        self.user = user
        if self.as_root:
            if shutil.which("runuser") is None:
                raise PostgresUnavailableError("running as root but `runuser` is missing (util-linux)")
            try:
                import pwd

                self._uid = pwd.getpwnam(user).pw_uid
                self._gid = pwd.getpwnam(user).pw_gid
            except KeyError:
                raise PostgresUnavailableError(
                    f"running as root but there is no {user!r} user to run PostgreSQL as "
                    f"(create it, e.g. `useradd --system {user}`)"
                ) from None
        self.dir = Path(tempfile.mkdtemp(prefix="kiln-pg-"))
        self.data = self.dir / "data"
        self.port = 0
        self.durable = durable
        self._started = False
        try:
            if self.as_root:
                os.chown(self.dir, self._uid, self._gid)
            self._run(
                [
                    str(self.bin / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--locale=C",
                    "--no-instructions",
                    *([] if durable else ["--no-sync"]),
                ]
            )
            self._start()
        except BaseException:
            self.stop()
            raise

    def _run(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        command = (["runuser", "-u", self.user, "--"] if self.as_root else []) + list(argv)
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=self.dir)
        if done.returncode != 0:
            log = self.dir / "server.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise PostgresUnavailableError(
                f"`{' '.join(command)}` failed ({done.returncode}):\n{done.stdout}{done.stderr}{tail}"
            )
        return done

    def _start(self) -> None:
        options = f"-p {{port}} -k {self.dir} -c listen_addresses=127.0.0.1 -c max_connections=200"
        if not self.durable:
            options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        last: Exception | None = None
        for _ in range(5):  # the free port may be taken between probing and binding
            self.port = free_port()
            try:
                self._run(
                    [
                        str(self.bin / "pg_ctl"),
                        "-D",
                        str(self.data),
                        "-l",
                        str(self.dir / "server.log"),
                        "-w",
                        "-t",
                        "60",
                        "-o",
                        options.format(port=self.port),
                        "start",
                    ]
                )
            except PostgresUnavailableError as exc:
                last = exc
                continue
            self._started = True
            return
        raise PostgresUnavailableError(f"could not start PostgreSQL: {last}")

    def url(self, dbname: str = "postgres") -> str:
        """SQLAlchemy URL of a database on this server."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, dbname: str, template: str | None = None) -> str:
        """``CREATE DATABASE`` (optionally from a template database) and return its URL."""
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", autocommit=True
        ) as conn:
            sql = f'CREATE DATABASE "{dbname}"'
            if template:
                sql += f' TEMPLATE "{template}"'
                if conn.info.server_version >= 150000:  # copying files is much faster for small databases
                    sql += " STRATEGY FILE_COPY"
            conn.execute(sql)  # type: ignore[arg-type]
        return self.url(dbname)

    def drop_database(self, dbname: str) -> None:
        """``DROP DATABASE ... WITH (FORCE)``."""
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", autocommit=True
        ) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')  # type: ignore[arg-type]

    def stop(self) -> None:
        """Stop the server and delete its directory."""
        if self._started:
            with contextlib.suppress(PostgresUnavailableError):
                self._run([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"])
            self._started = False
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> TemporaryPostgres:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
