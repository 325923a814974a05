"""The tuning database: :class:`TuningDatabase` opens a SQLAlchemy URL and commits and queries records.

Contract (shared by every backend; the test suite runs it against in-memory SQLite, file SQLite and a real
PostgreSQL server):

- ``open(url)`` resolves the URL (``url``, else ``KILN_DB``, else ``sqlite:///kiln.db``), creates the schema
  at head on a brand-new database, refuses an older schema (run ``kiln db upgrade``) and a newer one
  (nothing is written).
- Every commit is one transaction. Workloads and targets are idempotent on their key; a record names
  them by key and they must have been committed first.
- ``best(workload, target)`` is the ok record with the lowest median; ties go to the earliest
  ``created_at``, then the lowest id. A ``validate`` hook (the sketch's knob-space check) can reject
  records: they are skipped with an :class:`~db.errors.InvalidRecordWarning` and never returned.
- JSON columns hold canonical JSON text, read back with ``json.loads`` only; nothing is unpickled or
  evaluated.
"""

from __future__ import annotations

import contextlib
import functools
import json
import socket
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from db import migrate
from db.canonical import (
    canonical_json,
    check_latencies,
    clean_text,
    config_problem,
    median,
    record_fingerprint,
    utc_now,
)
from db.engine import (
    WRITE_OPTION,
    display_url,
    ensure_wal,
    make_engine,
    resolve_url,
    translate_errors,
)
from db.errors import (
    AmbiguousKeyError,
    ConflictError,
    DatabaseNotFoundError,
    InvalidRecordError,
    InvalidRecordWarning,
    ReadOnlyDatabaseError,
    UnknownKeyError,
)
from db.models import FeatureRow, FusionPlanRow, ModelTaskRow, RecordRow, RunRow, TargetRow, WorkloadRow
from db.records import (
    CoverageRow,
    FusionPlanRecord,
    ImportStats,
    Record,
    RecordIn,
    RunInfo,
    WorkloadInfo,
)
from db.status import Status

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    from sqlalchemy.engine import Connection, Engine, Row

__all__ = ["ImportStats", "Record", "RecordIn", "Status", "TuningDatabase", "resolve_url"]

Validator = Callable[[Record], "str | None"]
MAX_ERROR_CHARS = 65536
# Columns selected for a Record, in the order _to_record expects.
_RECORD_COLUMNS = (
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
_BEST_ORDER = (RecordRow.median_us, RecordRow.created_at, RecordRow.id)
_HOST: str | None = None


def _host() -> str:
    global _HOST
    if _HOST is None:
        _HOST = socket.gethostname()
    return _HOST


def _kiln_version() -> str:
    from compiler import __version__

    return __version__


def _records_select():  # type: ignore[no-untyped-def]
    from sqlalchemy import select

    return (
        select(*_RECORD_COLUMNS)
        .join(WorkloadRow, WorkloadRow.id == RecordRow.workload_id)
        .join(TargetRow, TargetRow.id == RecordRow.target_id)
    )


@functools.cache
def _best_statement():  # type: ignore[no-untyped-def]
    """Ok records of (:wk, :tk) in best order, :lim of them from :off (built once: reusing one statement
    object lets SQLAlchemy skip re-adapting its cached compilation, a large part of a sub-ms query)."""
    from sqlalchemy import bindparam

    return (
        _records_select()
        .where(WorkloadRow.key == bindparam("wk"), TargetRow.key == bindparam("tk"), RecordRow.status == "ok")
        .order_by(*_BEST_ORDER)
        .limit(bindparam("lim"))
        .offset(bindparam("off"))
    )


@functools.cache
def _best_many_statement():  # type: ignore[no-untyped-def]
    """The best ok record of each workload in :keys on target id :tid: one correlated index seek each."""
    from sqlalchemy import bindparam, select
    from sqlalchemy.orm import aliased

    inner = aliased(RecordRow)
    first = (
        select(inner.id)
        .where(inner.workload_id == WorkloadRow.id, inner.target_id == bindparam("tid"), inner.status == "ok")
        .order_by(inner.median_us, inner.created_at, inner.id)
        .limit(1)
        .correlate(WorkloadRow)
        .scalar_subquery()
    )
    ids = select(first).where(WorkloadRow.key.in_(bindparam("keys", expanding=True))).correlate(None)
    return _records_select().where(RecordRow.id.in_(ids))


def _to_record(row: Row) -> Record:
    """Build a Record from a row of ``_RECORD_COLUMNS``; malformed stored JSON raises InvalidRecordError."""
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


class TuningDatabase:
    """A Kiln tuning database at a SQLAlchemy URL. Create it with :meth:`open`; it is a context manager."""

    def __init__(self, engine: Engine, url: str) -> None:
        """Wrap an engine whose schema is at head (use :meth:`open`, which checks that)."""
        self._engine = engine
        self._url = url
        self._workload_ids: dict[str, int] = {}
        self._target_ids: dict[str, int] = {}
        self._run_ids: set[int] = set()

    # -- opening and closing ---------------------------------------------------------------------------

    @classmethod
    def open(cls, url: str | None = None, *, create: bool = True) -> TuningDatabase:
        """Open the database at ``url`` (None: env ``KILN_DB``, else ``sqlite:///kiln.db``).

        A brand-new database (no Kiln tables) gets the schema at head through the migrations when
        ``create`` is true, else :class:`DatabaseNotFoundError`. An older schema raises
        :class:`~db.errors.SchemaTooOldError` (run ``kiln db upgrade --db URL``); a newer one raises
        :class:`~db.errors.SchemaTooNewError` and nothing is written.
        """
        resolved = resolve_url(url)
        engine = make_engine(resolved, create=create)
        try:
            with translate_errors(resolved, "open the database"), engine.connect() as conn, conn.begin():
                info = migrate.inspect_schema(conn)
            if info.state is migrate.SchemaState.EMPTY:
                if not create:
                    raise DatabaseNotFoundError(
                        f"{display_url(resolved)} holds no Kiln tuning database; "
                        f"create it with `kiln db upgrade --db {display_url(resolved)}`"
                    )
                _ensure_wal_if_writable(engine, resolved)
                migrate.upgrade(engine, resolved)
            else:
                migrate.raise_for_schema(info, resolved)
                _ensure_wal_if_writable(engine, resolved)
        except BaseException:
            engine.dispose()
            raise
        return cls(engine, resolved)

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

    def __enter__(self) -> TuningDatabase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def schema_revision(self) -> str | None:
        """The alembic revision of the database (the head revision for an open database)."""
        with self._read("read the schema revision") as conn:
            return migrate.inspect_schema(conn).revision

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

    # -- keys ------------------------------------------------------------------------------------------

    def _id_of(self, conn: Connection, row_type: type, key: str, cache: dict[str, int], what: str) -> int:
        from sqlalchemy import select

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
        from sqlalchemy import insert as generic_insert
        from sqlalchemy.exc import IntegrityError

        try:
            with conn.begin_nested():
                conn.execute(generic_insert(row_type).values(**values))
        except IntegrityError:
            return False
        return True

    # -- commits ---------------------------------------------------------------------------------------

    def commit_workload(self, key: str, canonical: dict | str, kind: str, flops: float, bytes: float) -> None:
        """Store a workload (idempotent on ``key``).

        ``canonical`` (a dict, or JSON text) is stored as canonical JSON. Committing an existing key with a
        different canonical group raises :class:`ConflictError` (a hash collision or a bug upstream).
        """
        from sqlalchemy import select

        if not isinstance(key, str) or not key:
            raise InvalidRecordError(f"workload key must be a non-empty string, got {key!r}")
        try:
            text = canonical_json(json.loads(canonical) if isinstance(canonical, str) else canonical)
        except (TypeError, ValueError) as exc:
            raise InvalidRecordError(f"workload {key!r}: canonical form is not plain JSON ({exc})") from None
        values = dict(
            key=key,
            canonical=text,
            kind=str(kind),
            flops=float(flops),
            bytes=float(bytes),
            created_at=utc_now(),
        )
        with self._write("commit a workload") as conn:
            if not self._insert_ignore(conn, WorkloadRow, values):
                stored = conn.execute(select(WorkloadRow.canonical).where(WorkloadRow.key == key)).scalar()
                if stored != text:
                    raise ConflictError(
                        f"workload {key!r} is already in {self.url} with a different canonical group; "
                        "refusing to overwrite it"
                    )

    def commit_target(self, key: str, info: dict) -> None:
        """Store a target and its description (idempotent on ``key``; the first description is kept)."""
        if not isinstance(key, str) or not key:
            raise InvalidRecordError(f"target key must be a non-empty string, got {key!r}")
        try:
            text = canonical_json(info)
        except (TypeError, ValueError) as exc:
            raise InvalidRecordError(f"target {key!r}: info is not plain JSON ({exc})") from None
        with self._write("commit a target") as conn:
            self._insert_ignore(conn, TargetRow, dict(key=key, info=text, created_at=utc_now()))

    def _record_values(self, conn: Connection, rec: RecordIn) -> dict[str, Any]:
        """Validate a RecordIn and return the column values of its row."""
        where = f"record of workload {rec.workload_key!r} on target {rec.target_key!r}"
        try:
            status = Status.parse(rec.status)
            latencies = check_latencies(rec.latencies_us)
        except ValueError as exc:
            raise InvalidRecordError(f"{where}: {exc}") from None
        problem = config_problem(rec.config)
        if problem:
            raise InvalidRecordError(f"{where}: {problem}")
        if not isinstance(rec.sketch, str) or not rec.sketch:
            raise InvalidRecordError(f"{where}: sketch name must be a non-empty string")
        if isinstance(rec.sketch_version, bool) or not isinstance(rec.sketch_version, int):
            raise InvalidRecordError(f"{where}: sketch_version must be an int, got {rec.sketch_version!r}")
        if status is Status.OK and not latencies:
            raise InvalidRecordError(f"{where}: an ok record needs at least one latency")
        error = clean_text(str(rec.error), MAX_ERROR_CHARS) if rec.error is not None else None
        if rec.run_id is not None and rec.run_id not in self._run_ids:
            from sqlalchemy import select

            if conn.execute(select(RunRow.id).where(RunRow.id == rec.run_id)).scalar() is None:
                raise UnknownKeyError(f"{where}: run {rec.run_id} is not in {self.url}; begin_run() it first")
            self._run_ids.add(rec.run_id)
        config_json = canonical_json(rec.config)
        latencies_json = canonical_json(latencies) if latencies is not None else None
        created_at = utc_now()
        return dict(
            workload_id=self._workload_id(conn, rec.workload_key),
            target_id=self._target_id(conn, rec.target_key),
            sketch=rec.sketch,
            sketch_version=rec.sketch_version,
            config=config_json,
            latencies=latencies_json,
            median_us=median(latencies),
            status=status.value,
            error=error,
            kiln_version=_kiln_version(),
            host=_host(),
            run_id=rec.run_id,
            created_at=created_at,
            fingerprint=record_fingerprint(
                rec.workload_key,
                rec.target_key,
                rec.sketch,
                rec.sketch_version,
                config_json,
                latencies_json,
                status.value,
                created_at,
            ),
        )

    def commit_record(self, rec: RecordIn) -> int:
        """Store one measurement in its own transaction and return its id.

        The workload and target must have been committed; the config must be a dict of JSON scalars and
        latencies finite; an ok record needs latencies. Otherwise :class:`InvalidRecordError` or
        :class:`UnknownKeyError`.
        """
        return self.commit_records([rec])[0]

    def commit_records(self, recs: Sequence[RecordIn]) -> list[int]:
        """Store a batch of measurements in one transaction; return their ids in order."""
        from sqlalchemy import insert

        if not recs:
            return []
        table = RecordRow.__table__  # Core insert: building ORM statements costs more than the insert
        with self._write("commit records") as conn:
            rows = [self._record_values(conn, rec) for rec in recs]
            if len(rows) == 1:
                return [conn.execute(insert(table), rows[0]).inserted_primary_key[0]]
            stmt = insert(table).returning(table.c.id, sort_by_parameter_order=True)
            return [r[0] for r in conn.execute(stmt, rows)]

    # -- runs and model tasks --------------------------------------------------------------------------

    def begin_run(
        self, model_name: str, model_hash: str, target_key: str, budget: dict, command_line: str
    ) -> int:
        """Record the start of a tuning run and return its id (pass it as ``RecordIn.run_id``)."""
        from sqlalchemy import insert

        with self._write("begin a run") as conn:
            values = dict(
                model_name=model_name,
                model_hash=model_hash,
                target_id=self._target_id(conn, target_key),
                budget=canonical_json(budget),
                command_line=command_line,
                host=_host(),
                kiln_version=_kiln_version(),
                started_at=utc_now(),
                finished_at=None,
            )
            return conn.execute(insert(RunRow).values(**values)).inserted_primary_key[0]

    def finish_run(self, run_id: int) -> None:
        """Mark a tuning run finished now."""
        from sqlalchemy import update

        with self._write("finish a run") as conn:
            done = conn.execute(update(RunRow).where(RunRow.id == run_id).values(finished_at=utc_now()))
            if not done.rowcount:
                raise UnknownKeyError(f"run {run_id} is not in {self.url}")

    def runs(self, model_name: str | None = None) -> list[RunInfo]:
        """Tuning runs, oldest first (optionally of one model)."""
        from sqlalchemy import select

        stmt = select(*_RUN_COLUMNS).join(TargetRow, TargetRow.id == RunRow.target_id)
        if model_name is not None:
            stmt = stmt.where(RunRow.model_name == model_name)
        with self._read("list runs") as conn:
            rows = conn.execute(stmt.order_by(RunRow.started_at, RunRow.id)).all()
        return [_run_info(row) for row in rows]

    def register_model_tasks(
        self, model_name: str, model_hash: str, tasks: Iterable[tuple[str, float]]
    ) -> None:
        """Replace the task list of ``model_name`` at ``model_hash`` by ``[(workload_key, weight)]``.

        The workloads must have been committed. A key listed twice gets the sum of its weights.
        """
        from sqlalchemy import delete, insert

        weights: dict[str, float] = {}
        for key, weight in tasks:
            weights[key] = weights.get(key, 0.0) + float(weight)
        now = utc_now()
        with self._write("register model tasks") as conn:
            rows = [
                dict(
                    model_name=model_name,
                    model_hash=model_hash,
                    workload_id=self._workload_id(conn, key),
                    weight=weight,
                    created_at=now,
                )
                for key, weight in weights.items()
            ]
            conn.execute(
                delete(ModelTaskRow).where(
                    ModelTaskRow.model_name == model_name, ModelTaskRow.model_hash == model_hash
                )
            )
            if rows:
                conn.execute(insert(ModelTaskRow), rows)

    def _latest_model_hash(self, conn: Connection, model_name: str) -> str | None:
        from sqlalchemy import select

        stmt = (
            select(ModelTaskRow.model_hash)
            .where(ModelTaskRow.model_name == model_name)
            .order_by(ModelTaskRow.created_at.desc(), ModelTaskRow.id.desc())
            .limit(1)
        )
        return conn.execute(stmt).scalar()

    def model_tasks(self, model_name: str, model_hash: str | None = None) -> list[tuple[str, float]]:
        """The tasks ``[(workload_key, weight)]`` of a model, sorted by workload key.

        Without ``model_hash``, the most recently registered version of the model is used. A model with no
        tasks gives an empty list.
        """
        from sqlalchemy import select

        with self._read("read model tasks") as conn:
            if model_hash is None:
                model_hash = self._latest_model_hash(conn, model_name)
                if model_hash is None:
                    return []
            stmt = (
                select(WorkloadRow.key, ModelTaskRow.weight)
                .join(WorkloadRow, WorkloadRow.id == ModelTaskRow.workload_id)
                .where(ModelTaskRow.model_name == model_name, ModelTaskRow.model_hash == model_hash)
                .order_by(WorkloadRow.key)
            )
            return [(k, w) for k, w in conn.execute(stmt)]

    def models(self) -> list[tuple[str, str, int]]:
        """Registered models: ``(model_name, latest model_hash, number of tasks)`` sorted by name."""
        from sqlalchemy import func, select

        with self._read("list models") as conn:
            names = conn.execute(select(ModelTaskRow.model_name).distinct().order_by(ModelTaskRow.model_name))
            out = []
            for (name,) in names.all():
                h = self._latest_model_hash(conn, name)
                n = conn.execute(
                    select(func.count()).where(ModelTaskRow.model_name == name, ModelTaskRow.model_hash == h)
                ).scalar()
                out.append((name, h or "", int(n or 0)))
            return out

    # -- best records ----------------------------------------------------------------------------------

    def _candidate_problem(self, row: Row, validate: Validator | None) -> tuple[Record | None, str | None]:
        try:
            rec = _to_record(row)
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

    def best(self, workload_key: str, target_key: str, *, validate: Validator | None = None) -> Record | None:
        """The ok record of (workload, target) with the lowest median, or None.

        Ties are broken by ``created_at`` then ``id`` (oldest first). Every candidate's config must be a
        dict of JSON scalars, and ``validate(record)`` (if given) must return None; a candidate that fails
        is skipped with an :class:`InvalidRecordWarning` naming the record, workload and reason, and the
        next best one is tried. Records of other targets are never returned.
        """
        offset, batch = 0, 8
        stmt = _best_statement()
        while True:
            params = {"wk": workload_key, "tk": target_key, "lim": batch, "off": offset}
            with self._read("find the best record") as conn:
                rows = conn.execute(stmt, params).all()
            for row in rows:
                rec, problem = self._candidate_problem(row, validate)
                if problem is None:
                    return rec
                self._warn_skipped(row, problem)
            if len(rows) < batch:
                return None
            offset += batch
            batch = min(batch * 4, 4096)

    def best_many(
        self, workload_keys: Iterable[str], target_key: str, validate: Validator | None = None
    ) -> dict[str, Record]:
        """:meth:`best` for many workloads at once (one query per 500 keys); untuned keys are absent.

        Each workload's best record is found with an index seek; if ``validate`` rejects it, the next
        candidates of that workload are tried as in :meth:`best`.
        """
        from sqlalchemy import select

        keys = sorted(set(workload_keys))
        out: dict[str, Record] = {}
        retry: list[str] = []
        with self._read("find the best records") as conn:
            tid = conn.execute(select(TargetRow.id).where(TargetRow.key == target_key)).scalar()
            if tid is None:
                return out
            for start in range(0, len(keys), 500):
                params = {"keys": keys[start : start + 500], "tid": tid}
                for row in conn.execute(_best_many_statement(), params):
                    rec, problem = self._candidate_problem(row, validate)
                    if problem is None:
                        out[row[0]] = rec  # type: ignore[assignment]
                    else:
                        self._warn_skipped(row, problem)
                        retry.append(row[0])
        for wk in retry:
            found = self._best_after(wk, target_key, 1, validate)
            if found is not None:
                out[wk] = found
        return out

    def _best_after(self, workload_key: str, target_key: str, skip: int, validate: Validator | None):  # type: ignore[no-untyped-def]
        base = (
            _records_select()
            .where(WorkloadRow.key == workload_key, TargetRow.key == target_key, RecordRow.status == "ok")
            .order_by(*_BEST_ORDER)
            .offset(skip)
        )
        with self._read("find the best record") as conn:
            rows = conn.execute(base).all()
        for row in rows:
            rec, problem = self._candidate_problem(row, validate)
            if problem is None:
                return rec
            self._warn_skipped(row, problem)
        return None

    def top_k(
        self,
        workload_key: str,
        target_key: str,
        k: int,
        *,
        status: Status | str | None = Status.OK,
        validate: Validator | None = None,
    ) -> list[Record]:
        """The ``k`` best records of (workload, target) in :meth:`best` order (ok ones by default).

        With ``status=None`` records of every status are listed, those without a median last. Invalid
        candidates are skipped with a warning exactly as in :meth:`best`.
        """
        stmt = _records_select().where(WorkloadRow.key == workload_key, TargetRow.key == target_key)
        if status is not None:
            stmt = stmt.where(RecordRow.status == Status.parse(status).value)
        stmt = stmt.order_by(RecordRow.median_us.is_(None), *_BEST_ORDER)
        out: list[Record] = []
        with self._read("list the top records") as conn:
            result = conn.execute(stmt.execution_options(yield_per=max(16, k)))
            for row in result:
                rec, problem = self._candidate_problem(row, validate)
                if problem is None:
                    out.append(rec)  # type: ignore[arg-type]
                    if len(out) >= k:
                        break
                else:
                    self._warn_skipped(row, problem)
            result.close()
        return out

    # -- listings --------------------------------------------------------------------------------------

    def find_records(
        self,
        workload_key: str | None = None,
        target_key: str | None = None,
        status: Status | str | None = None,
        limit: int | None = None,
    ) -> list[Record]:
        """Records matching the filters, best first (by median, records without one last, then time, id).

        Stored records whose JSON is malformed are skipped with a warning.
        """
        stmt = _records_select()
        if workload_key is not None:
            stmt = stmt.where(WorkloadRow.key == workload_key)
        if target_key is not None:
            stmt = stmt.where(TargetRow.key == target_key)
        if status is not None:
            stmt = stmt.where(RecordRow.status == Status.parse(status).value)
        stmt = stmt.order_by(RecordRow.median_us.is_(None), *_BEST_ORDER)
        if limit is not None:
            stmt = stmt.limit(limit)
        out = []
        with self._read("list records") as conn:
            for row in conn.execute(stmt):
                try:
                    out.append(_to_record(row))
                except InvalidRecordError as exc:
                    self._warn_skipped(row, str(exc))
        return out

    def records(
        self,
        workload_key: str | None = None,
        target_key: str | None = None,
        status: Status | str | None = None,
        limit: int | None = None,
    ) -> pd.DataFrame:
        """:meth:`find_records` as a pandas DataFrame, one column per :class:`Record` field."""
        import dataclasses

        import pandas as pd

        columns = [f.name for f in dataclasses.fields(Record)]
        found = self.find_records(workload_key, target_key, status, limit)
        rows = [[getattr(r, c) for c in columns] for r in found]
        frame = pd.DataFrame(rows, columns=columns)
        frame["status"] = frame["status"].map(lambda s: s.value if isinstance(s, Status) else s)
        return frame

    def count_records(self, status: Status | str | None = None) -> int:
        """Number of records (of one status, if given)."""
        from sqlalchemy import func, select

        stmt = select(func.count()).select_from(RecordRow)
        if status is not None:
            stmt = stmt.where(RecordRow.status == Status.parse(status).value)
        with self._read("count records") as conn:
            return int(conn.execute(stmt).scalar() or 0)

    def target_keys(self) -> list[str]:
        """All target keys, sorted."""
        from sqlalchemy import select

        with self._read("list targets") as conn:
            return list(conn.execute(select(TargetRow.key).order_by(TargetRow.key)).scalars())

    def target_info(self, key: str) -> dict:
        """The description stored with a target."""
        from sqlalchemy import select

        with self._read("read a target") as conn:
            text = conn.execute(select(TargetRow.info).where(TargetRow.key == key)).scalar()
        if text is None:
            raise UnknownKeyError(f"target {key!r} is not in {self.url}")
        return json.loads(text)

    def resolve_target(self, spec: str) -> str:
        """A full target key, or a prefix of whole path parts (``cpu``, ``cuda/sm_90``) naming just one."""
        keys = self.target_keys()
        if spec in keys:
            return spec
        prefix = spec.rstrip("/") + "/"
        matches = [k for k in keys if k.startswith(prefix)]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            known = ", ".join(repr(k) for k in keys) or "none"
            raise UnknownKeyError(f"no target matches {spec!r} in {self.url} (targets: {known})")
        listed = ", ".join(repr(k) for k in matches)
        raise AmbiguousKeyError(f"target {spec!r} matches several targets in {self.url}: {listed}; name one")

    def resolve_workload(self, spec: str) -> str:
        """A full workload key, or a prefix of one that matches exactly one workload."""
        from sqlalchemy import select

        with self._read("look up a workload") as conn:
            if conn.execute(select(WorkloadRow.id).where(WorkloadRow.key == spec)).scalar() is not None:
                return spec
            like = spec.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            matches = list(
                conn.execute(
                    select(WorkloadRow.key).where(WorkloadRow.key.like(like, escape="\\")).limit(6)
                ).scalars()
            )
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise UnknownKeyError(f"no workload matches {spec!r} in {self.url}")
        raise AmbiguousKeyError(
            f"workload prefix {spec!r} matches several workloads in {self.url}: "
            + ", ".join(matches[:5])
            + (", ..." if len(matches) > 5 else "")
        )

    def workloads(self, model_name: str | None = None) -> list[WorkloadInfo]:
        """Workloads (of one model's latest task list, if given) with record counts, sorted by key."""
        from sqlalchemy import case, func, select

        counts = (
            select(
                RecordRow.workload_id.label("wid"),
                func.count().label("n"),
                func.sum(case((RecordRow.status == "ok", 1), else_=0)).label("n_ok"),
            )
            .group_by(RecordRow.workload_id)
            .subquery()
        )
        stmt = (
            select(
                WorkloadRow.key,
                WorkloadRow.kind,
                WorkloadRow.flops,
                WorkloadRow.bytes,
                counts.c.n,
                counts.c.n_ok,
            )
            .outerjoin(counts, counts.c.wid == WorkloadRow.id)
            .order_by(WorkloadRow.key)
        )
        with self._read("list workloads") as conn:
            if model_name is not None:
                h = self._latest_model_hash(conn, model_name)
                stmt = stmt.join(ModelTaskRow, ModelTaskRow.workload_id == WorkloadRow.id).where(
                    ModelTaskRow.model_name == model_name, ModelTaskRow.model_hash == h
                )
            rows = conn.execute(stmt).all()
        return [WorkloadInfo(k, kind, fl, by, int(n or 0), int(ok or 0)) for k, kind, fl, by, n, ok in rows]

    def workload_canonical(self, key: str) -> dict:
        """The canonical group JSON stored with a workload (parsed with ``json.loads``)."""
        from sqlalchemy import select

        with self._read("read a workload") as conn:
            text = conn.execute(select(WorkloadRow.canonical).where(WorkloadRow.key == key)).scalar()
        if text is None:
            raise UnknownKeyError(f"workload {key!r} is not in {self.url}")
        return json.loads(text)

    def coverage_rows(
        self, model_name: str, target_key: str, model_hash: str | None = None
    ) -> list[CoverageRow]:
        """Per task of the model: tuned or not on the target, best median, record counts by status."""
        from sqlalchemy import func, select

        with self._read("compute coverage") as conn:
            if model_hash is None:
                model_hash = self._latest_model_hash(conn, model_name)
                if model_hash is None:
                    raise UnknownKeyError(
                        f"no tasks recorded for model {model_name!r} in {self.url}; "
                        f"run `kiln tune --model {model_name}` first"
                    )
            tasks = conn.execute(
                select(WorkloadRow.id, WorkloadRow.key, WorkloadRow.kind, ModelTaskRow.weight)
                .join(WorkloadRow, WorkloadRow.id == ModelTaskRow.workload_id)
                .where(ModelTaskRow.model_name == model_name, ModelTaskRow.model_hash == model_hash)
                .order_by(WorkloadRow.key)
            ).all()
            stats = conn.execute(
                select(RecordRow.workload_id, RecordRow.status, func.count(), func.min(RecordRow.median_us))
                .join(TargetRow, TargetRow.id == RecordRow.target_id)
                .join(ModelTaskRow, ModelTaskRow.workload_id == RecordRow.workload_id)
                .where(
                    TargetRow.key == target_key,
                    ModelTaskRow.model_name == model_name,
                    ModelTaskRow.model_hash == model_hash,
                )
                .group_by(RecordRow.workload_id, RecordRow.status)
            ).all()
        by_wid: dict[int, dict[str, tuple[int, float | None]]] = {}
        for wid, status, n, best in stats:
            by_wid.setdefault(wid, {})[status] = (int(n), best)
        out = []
        for wid, key, kind, weight in tasks:
            found = by_wid.get(wid, {})
            counts = {s.value: found.get(s.value, (0, None))[0] for s in Status}
            best = found.get("ok", (0, None))[1]
            out.append(CoverageRow(key, kind, weight, counts["ok"] > 0, best, sum(counts.values()), counts))
        return out

    def coverage(self, model_name: str, target_key: str, model_hash: str | None = None) -> pd.DataFrame:
        """:meth:`coverage_rows` as a DataFrame: workload_key, kind, weight, tuned, best_median_us,
        n_records, then one ``n_<status>`` column per status."""
        import pandas as pd

        rows = [
            {
                "workload_key": r.workload_key,
                "kind": r.kind,
                "weight": r.weight,
                "tuned": r.tuned,
                "best_median_us": r.best_median_us,
                "n_records": r.n_records,
                **{f"n_{s}": n for s, n in r.by_status.items()},
            }
            for r in self.coverage_rows(model_name, target_key, model_hash)
        ]
        columns = ["workload_key", "kind", "weight", "tuned", "best_median_us", "n_records"]
        columns += [f"n_{s.value}" for s in Status]
        return pd.DataFrame(rows, columns=columns)

    # -- fusion plans ----------------------------------------------------------------------------------

    def commit_fusion_plan(self, region_key: str, target_key: str, plan: dict, latency_us: float) -> int:
        """Store a measured fusion plan of a graph region on a target; return its id."""
        import math

        from sqlalchemy import insert

        if not math.isfinite(float(latency_us)) or latency_us < 0:
            raise InvalidRecordError(f"fusion plan of region {region_key!r}: bad latency {latency_us!r}")
        try:
            text = canonical_json(plan)
        except (TypeError, ValueError) as exc:
            raise InvalidRecordError(
                f"fusion plan of region {region_key!r} is not plain JSON ({exc})"
            ) from None
        with self._write("commit a fusion plan") as conn:
            values = dict(
                region_key=region_key,
                target_id=self._target_id(conn, target_key),
                plan=text,
                latency_us=float(latency_us),
                kiln_version=_kiln_version(),
                host=_host(),
                created_at=utc_now(),
            )
            return conn.execute(insert(FusionPlanRow).values(**values)).inserted_primary_key[0]

    def best_fusion_plan(self, region_key: str, target_key: str) -> FusionPlanRecord | None:
        """The fusion plan of the region on the target with the lowest latency (ties: oldest, lowest id)."""
        from sqlalchemy import select

        stmt = (
            select(
                FusionPlanRow.region_key,
                TargetRow.key,
                FusionPlanRow.plan,
                FusionPlanRow.latency_us,
                FusionPlanRow.kiln_version,
                FusionPlanRow.host,
                FusionPlanRow.created_at,
                FusionPlanRow.id,
            )
            .join(TargetRow, TargetRow.id == FusionPlanRow.target_id)
            .where(FusionPlanRow.region_key == region_key, TargetRow.key == target_key)
            .order_by(FusionPlanRow.latency_us, FusionPlanRow.created_at, FusionPlanRow.id)
            .limit(1)
        )
        with self._read("find the best fusion plan") as conn:
            row = conn.execute(stmt).first()
        if row is None:
            return None
        region, tk, plan, latency, kv, host, created, pid = row
        return FusionPlanRecord(
            region, tk, json.loads(plan), latency, kv, host, created.replace(tzinfo=UTC), pid
        )

    # -- cost-model features ---------------------------------------------------------------------------

    def commit_features(self, record_id: int, version: int, vector: Sequence[float] | np.ndarray) -> None:
        """Cache the cost-model features of a record (replacing an earlier vector of the same version).

        The vector is stored as raw little-endian float32 bytes with its length; never pickled.
        """
        import numpy as np
        from sqlalchemy import delete, insert, select

        arr = np.ascontiguousarray(np.asarray(vector, dtype="<f4").reshape(-1))
        with self._write("commit features") as conn:
            if conn.execute(select(RecordRow.id).where(RecordRow.id == record_id)).scalar() is None:
                raise UnknownKeyError(f"record {record_id} is not in {self.url}")
            conn.execute(
                delete(FeatureRow).where(FeatureRow.record_id == record_id, FeatureRow.version == version)
            )
            conn.execute(
                insert(FeatureRow).values(
                    record_id=record_id,
                    version=int(version),
                    length=int(arr.size),
                    vector=arr.tobytes(),
                    created_at=utc_now(),
                )
            )

    def features(self, version: int, record_ids: Iterable[int] | None = None) -> dict[int, np.ndarray]:
        """Cached feature vectors of one feature version: ``{record_id: float32 array}``.

        A stored vector whose byte size does not match its length raises :class:`InvalidRecordError`.
        """
        import numpy as np
        from sqlalchemy import select

        stmt = select(FeatureRow.record_id, FeatureRow.length, FeatureRow.vector).where(
            FeatureRow.version == version
        )
        ids = None if record_ids is None else sorted(set(record_ids))
        out: dict[int, np.ndarray] = {}
        with self._read("read features") as conn:
            chunks = [None] if ids is None else [ids[i : i + 500] for i in range(0, len(ids), 500)]
            for chunk in chunks:
                query = stmt if chunk is None else stmt.where(FeatureRow.record_id.in_(chunk))
                for rid, length, blob in conn.execute(query):
                    blob = bytes(blob)
                    if len(blob) != 4 * length:
                        raise InvalidRecordError(
                            f"features of record {rid} (version {version}) in {self.url} hold "
                            f"{len(blob)} bytes, not {length} float32 values"
                        )
                    out[rid] = np.frombuffer(blob, dtype="<f4").astype(np.float32)
        return out

    # -- exchange and maintenance ----------------------------------------------------------------------

    def export_jsonl(
        self,
        dest: str | Path | IO[str],
        *,
        workload_key: str | None = None,
        target_key: str | None = None,
        status: Status | str | None = None,
    ) -> int:
        """Write the database (or the records matching the filters) as JSON Lines; return records written.

        See :mod:`db.exchange` for the format. A path is written atomically (temp file, then rename);
        a ``.gz`` suffix compresses.
        """
        from db import exchange

        return exchange.export_jsonl(
            self, dest, workload_key=workload_key, target_key=target_key, status=status
        )

    def import_jsonl(self, src: str | Path | IO[str]) -> ImportStats:
        """Import a JSON Lines export in one transaction, skipping records already stored (duplicates).

        A malformed line aborts the import (nothing is written) with an error naming the line.
        """
        from db import exchange

        return exchange.import_jsonl(self, src)

    def merge_from(self, other_url: str) -> ImportStats:
        """Copy every record (and workload, target, run, model task, fusion plan) of another database
        into this one, skipping duplicates. The other database is opened read-only and not modified."""
        from db import exchange

        return exchange.merge_from(self, other_url)

    def prune(self, keep_top_k: int, *, keep_errors: bool = True) -> int:
        """Keep the ``keep_top_k`` best ok records per (workload, target); return how many were deleted.

        With ``keep_errors`` (the default) records that are not ok stay: they tell the tuner which configs
        are known to fail, so it does not measure them again. Cached features of deleted records go too.
        """
        from sqlalchemy import delete, func, or_, select

        if keep_top_k < 1:
            raise InvalidRecordError(
                f"prune keeps at least 1 record per workload and target, not {keep_top_k}"
            )
        rank = func.row_number().over(
            partition_by=(RecordRow.workload_id, RecordRow.target_id), order_by=_BEST_ORDER
        )
        ranked = (
            select(RecordRow.id.label("rid"), rank.label("rn")).where(RecordRow.status == "ok").subquery()
        )
        doomed_ok = select(ranked.c.rid).where(ranked.c.rn > keep_top_k)
        condition = RecordRow.id.in_(doomed_ok)
        if not keep_errors:
            condition = or_(condition, RecordRow.status != "ok")
        doomed = select(RecordRow.id).where(condition)
        with self._write("prune records") as conn:
            ids = list(conn.execute(doomed).scalars())
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                conn.execute(delete(FeatureRow).where(FeatureRow.record_id.in_(chunk)))
                conn.execute(delete(RecordRow).where(RecordRow.id.in_(chunk)))
        return len(ids)


def _ensure_wal_if_writable(engine: Engine, url: str) -> None:
    # Readable but not writable: queries work, and writes will say that the file is read-only.
    with contextlib.suppress(ReadOnlyDatabaseError):
        ensure_wal(engine, url)


_RUN_COLUMNS = (
    RunRow.id,
    RunRow.model_name,
    RunRow.model_hash,
    TargetRow.key,
    RunRow.budget,
    RunRow.command_line,
    RunRow.host,
    RunRow.kiln_version,
    RunRow.started_at,
    RunRow.finished_at,
)


def _run_info(row: Row) -> RunInfo:
    rid, name, mhash, target_key, budget, command_line, host, kv, started, finished = row
    return RunInfo(
        id=rid,
        model_name=name,
        model_hash=mhash,
        target_key=target_key,
        budget=json.loads(budget),
        command_line=command_line,
        host=host,
        kiln_version=kv,
        started_at=started.replace(tzinfo=UTC),
        finished_at=finished.replace(tzinfo=UTC) if finished else None,
    )
