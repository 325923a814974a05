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
- ``select_record(workload, target, default_config)`` is what compile applies: the rule of
  :mod:`db.selection` over the records and every confirmation (confirmed faster first, confirmed not faster
  keeps the default, else the lowest median).
- JSON columns hold canonical JSON text, read back with ``json.loads`` only; nothing is unpickled or
  evaluated.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from sqlalchemy import delete, insert, select

from db import migrate
from db.aux_tables import AuxTablesMixin
from db.canonical import (
    canonical_json,
    check_latencies,
    clean_text,
    config_problem,
    median,
    record_fingerprint,
    utc_now,
)
from db.confirmations import ConfirmationMixin
from db.core import Validator, host, kiln_version
from db.engine import display_url, ensure_wal, make_engine, resolve_url, translate_errors
from db.errors import (
    ConflictError,
    DatabaseNotFoundError,
    InvalidRecordError,
    ReadOnlyDatabaseError,
    UnknownKeyError,
)
from db.models import FeatureRow, RecordRow, RunRow, TargetRow, WorkloadRow
from db.queries import QueryMixin
from db.records import ImportStats, Record, RecordIn
from db.status import Status

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

__all__ = ["ImportStats", "Record", "RecordIn", "Status", "TuningDatabase", "Validator", "resolve_url"]

MAX_ERROR_CHARS = 65536


class TuningDatabase(QueryMixin, AuxTablesMixin, ConfirmationMixin):
    """A Kiln tuning database at a SQLAlchemy URL. Create it with :meth:`open`; it is a context manager.

    The methods come in parts: opening and committing records here; reading in :mod:`db.queries`; runs,
    model tasks, fusion plans and features in :mod:`db.aux_tables`; confirmations in
    :mod:`db.confirmations`; plumbing in :mod:`db.core`.
    """

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

    def schema_revision(self) -> str | None:
        """The alembic revision of the database (the head revision for an open database)."""
        with self._read("read the schema revision") as conn:
            return migrate.inspect_schema(conn).revision

    def commit_workload(self, key: str, canonical: dict | str, kind: str, flops: float, bytes: float) -> None:
        """Store a workload (idempotent on ``key``).

        ``canonical`` (a dict, or JSON text) is stored as canonical JSON. Committing an existing key with a
        different canonical group raises :class:`ConflictError` (a hash collision or a bug upstream).
        """
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
            kiln_version=kiln_version(),
            host=host(),
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
        if not recs:
            return []
        table = RecordRow.__table__  # Core insert: building ORM statements costs more than the insert
        with self._write("commit records") as conn:
            rows = [self._record_values(conn, rec) for rec in recs]
            if len(rows) == 1:
                return [conn.execute(insert(table), rows[0]).inserted_primary_key[0]]
            stmt = insert(table).returning(table.c.id, sort_by_parameter_order=True)
            return [r[0] for r in conn.execute(stmt, rows)]

    def export_jsonl(
        self,
        dest: str | Path | IO[str],
        *,
        workload_key: str | None = None,
        target_key: str | None = None,
        status: Status | str | None = None,
        skipped: list[str] | None = None,
    ) -> int:
        """Write the database (or the records matching the filters) as JSON Lines; return records written.

        See :mod:`db.exchange` for the format. A path is written atomically (temp file, then rename);
        a ``.gz`` suffix compresses. Stored rows that are malformed are skipped; their reasons are
        appended to ``skipped`` when given.
        """
        from db import exchange

        return exchange.export_jsonl(
            self, dest, workload_key=workload_key, target_key=target_key, status=status, skipped=skipped
        )

    def import_jsonl(self, src: str | Path | IO[str], *, strict: bool = False) -> ImportStats:
        """Import a JSON Lines export in one transaction, skipping records already stored (duplicates).

        A malformed line is skipped and reported in the stats (``skipped_bad``, ``problems`` naming the
        line); with ``strict`` it aborts the import (nothing is written) with an error naming the line.
        """
        from db import importer

        return importer.import_jsonl(self, src, strict=strict)

    def merge_from(self, other_url: str, *, strict: bool = False) -> ImportStats:
        """Copy every record (and workload, target, run, model task, fusion plan) of another database
        into this one, skipping duplicates. The other database is opened read-only and not modified.
        Malformed rows are skipped and reported as in :meth:`import_jsonl`."""
        from db import importer

        return importer.merge_from(self, other_url, strict=strict)

    def prune(self, keep_top_k: int, *, keep_errors: bool = True, validate: Validator | None = None) -> int:
        """Keep the ``keep_top_k`` best *valid* ok records per (workload, target); return how many were
        deleted. ``validate`` (the sketch's knob-space check, e.g. ``tuner.records.workload_validator``)
        decides validity; records it rejects are never counted among the kept ones and never deleted (see
        :meth:`prune_plan`, which says what would go without deleting anything).

        With ``keep_errors`` (the default) records that are not ok stay: they tell the tuner which configs
        are known to fail, so it does not measure them again. Cached features of deleted records go too.
        """
        plan = self.prune_plan(keep_top_k, keep_errors=keep_errors, validate=validate)
        return self.delete_records([r.id for r in plan.doomed])

    def delete_records(self, ids: Sequence[int]) -> int:
        """Delete these records (and their cached features) in one transaction; return how many went."""
        deleted = 0
        with self._write("prune records") as conn:
            for start in range(0, len(ids), 500):
                chunk = list(ids[start : start + 500])
                conn.execute(delete(FeatureRow).where(FeatureRow.record_id.in_(chunk)))
                deleted += conn.execute(delete(RecordRow).where(RecordRow.id.in_(chunk))).rowcount
        return deleted


def _ensure_wal_if_writable(engine: Engine, url: str) -> None:
    # Readable but not writable: queries work, and writes will say that the file is read-only.
    with contextlib.suppress(ReadOnlyDatabaseError):
        ensure_wal(engine, url)
