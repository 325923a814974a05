"""Plumbing shared by the parts of :class:`~db.database.TuningDatabase`: connections and transactions,
key lookups, and stored rows turned into :class:`~db.records.Record` values."""

from __future__ import annotations

import contextlib
import json
import socket
import warnings
from collections.abc import Callable, Iterator
from datetime import UTC
from typing import TYPE_CHECKING, Any, Self

from sqlalchemy import insert as generic_insert
from sqlalchemy import select

from db.canonical import check_latencies, config_problem
from db.engine import WRITE_OPTION, display_url, translate_errors
from db.errors import InvalidRecordError, InvalidRecordWarning, UnknownKeyError
from db.models import ModelTaskRow, RecordRow, TargetRow, WorkloadRow
from db.records import Record
from db.status import Status

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine, Row

Validator = Callable[[Record], "str | None"]
# Columns selected for a Record, in the order to_record expects.
RECORD_COLUMNS = (
    WorkloadRow.key,
    TargetRow.key,
    RecordRow.sketch,
    RecordRow.sketch_version,
    RecordRow.config,
    RecordRow.latencies,
    RecordRow.median_us,
    RecordRow.status,
    RecordRow.error,
    RecordRow.kiln_version,
    RecordRow.host,
    RecordRow.run_id,
    RecordRow.created_at,
    RecordRow.id,
)
# The order of "best": lowest median, then oldest, then lowest id.
BEST_ORDER = (RecordRow.median_us, RecordRow.created_at, RecordRow.id)
_HOST: str | None = None


def host() -> str:
    """This machine's host name (stored with every record)."""
    global _HOST
    if _HOST is None:
        _HOST = socket.gethostname()
    return _HOST


def kiln_version() -> str:
    """The running Kiln version (stored with every record)."""
    from compiler import __version__

    return __version__


def records_select():  # type: ignore[no-untyped-def]
    """SELECT of RECORD_COLUMNS over records joined to their workload and target."""
    return (
        select(*RECORD_COLUMNS)
        .join(WorkloadRow, WorkloadRow.id == RecordRow.workload_id)
        .join(TargetRow, TargetRow.id == RecordRow.target_id)
    )


def to_record(row: Row) -> Record:
    """Build a Record from a row of ``RECORD_COLUMNS``; malformed stored JSON raises InvalidRecordError."""
    (wk, tk, sketch, version, config, latencies, med, status, error, kv, host, run_id, created, rid) = row
    try:
        config_value = json.loads(config)
        lat = json.loads(latencies) if latencies is not None else None
        lat_tuple = tuple(check_latencies(lat)) if lat is not None else None
        status_value = Status.parse(status)
    except ValueError as exc:
        raise InvalidRecordError(f"record {rid} of workload {wk} on {tk} is malformed: {exc}") from None
    return Record(
        workload_key=wk,
        target_key=tk,
        sketch=sketch,
        sketch_version=version,
        config=config_value,
        latencies_us=lat_tuple,
        median_us=med,
        status=status_value,
        error=error,
        kiln_version=kv,
        host=host,
        run_id=run_id,
        created_at=created.replace(tzinfo=UTC),
        id=rid,
    )


class DatabaseCore:
    """Connections, transactions and key caches of a tuning database (see :class:`TuningDatabase`)."""

    def __init__(self, engine: Engine, url: str) -> None:
        """Wrap an engine whose schema is at head (use :meth:`open`, which checks that)."""
        self._engine = engine
        self._url = url
        self._workload_ids: dict[str, int] = {}
        self._target_ids: dict[str, int] = {}
        self._run_ids: set[int] = set()

    @property
    def url(self) -> str:
        """The database URL with its password hidden."""
        return display_url(self._url)

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine (for Optuna storages and tests; Kiln code uses the methods)."""
        return self._engine

    @property
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql`` (or another SQLAlchemy dialect name)."""
        return self._engine.dialect.name

    def close(self) -> None:
        """Release the connections (the database itself stays)."""
        self._engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _read(self, action: str) -> Iterator[Connection]:
        with translate_errors(self._url, action), self._engine.connect() as conn, conn.begin():
            yield conn

    @contextlib.contextmanager
    def _write(self, action: str) -> Iterator[Connection]:
        options = {WRITE_OPTION: True}
        with (
            translate_errors(self._url, action),
            self._engine.connect().execution_options(**options) as conn,
            conn.begin(),
        ):
            yield conn

    def _id_of(self, conn: Connection, row_type: type, key: str, cache: dict[str, int], what: str) -> int:
        found = cache.get(key)
        if found is None:
            found = conn.execute(select(row_type.id).where(row_type.key == key)).scalar()
            if found is None:
                raise UnknownKeyError(
                    f"{what} {key!r} is not in {self.url}: commit_{what}() it before committing records"
                )
            cache[key] = found
        return found

    def _workload_id(self, conn: Connection, key: str) -> int:
        return self._id_of(conn, WorkloadRow, key, self._workload_ids, "workload")

    def _target_id(self, conn: Connection, key: str) -> int:
        return self._id_of(conn, TargetRow, key, self._target_ids, "target")

    def _insert_ignore(self, conn: Connection, row_type: type, values: dict[str, Any]) -> bool:
        """INSERT unless the unique key exists (race-free on SQLite and PostgreSQL); True if inserted."""
        name = conn.dialect.name
        if name in ("sqlite", "postgresql"):
            if name == "sqlite":
                from sqlalchemy.dialects.sqlite import insert
            else:
                from sqlalchemy.dialects.postgresql import insert
            stmt = insert(row_type).values(**values).on_conflict_do_nothing().returning(row_type.id)
            return conn.execute(stmt).first() is not None
        from sqlalchemy.exc import IntegrityError

        try:
            with conn.begin_nested():
                conn.execute(generic_insert(row_type).values(**values))
        except IntegrityError:
            return False
        return True

    def _latest_model_hash(self, conn: Connection, model_name: str) -> str | None:
        stmt = (
            select(ModelTaskRow.model_hash)
            .where(ModelTaskRow.model_name == model_name)
            .order_by(ModelTaskRow.created_at.desc(), ModelTaskRow.id.desc())
            .limit(1)
        )
        return conn.execute(stmt).scalar()

    def _candidate_problem(self, row: Row, validate: Validator | None) -> tuple[Record | None, str | None]:
        try:
            rec = to_record(row)
        except InvalidRecordError as exc:
            return None, str(exc)
        problem = config_problem(rec.config)
        if problem is None and validate is not None:
            problem = validate(rec)
        return rec, problem

    @staticmethod
    def _warn_skipped(row: Row, problem: str) -> None:
        warnings.warn(
            f"skipping record {row.id} of workload {row[0]} on target {row[1]}: {problem}",
            InvalidRecordWarning,
            stacklevel=3,
        )
