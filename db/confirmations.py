"""Confirmations: a task's best candidate and its default re-measured in interleaved rounds at the end of
tuning (a part of :class:`~db.database.TuningDatabase`).

A record's own median comes from one measurement, taken whenever the search reached it: under load one
default measured at 11,944 us instead of 269 us and gave a stored "16.96x over default". A confirmation
measures both again, back to back in each round (alternating which runs first), so a speed-up is a ratio of
two timings taken under the same conditions. What it stores:

- the per-round medians of both (``best_rounds``, ``default_rounds``), as given by the measurer;
- derived here, for every writer alike (tuning, import, merge): ``best_us`` / ``default_us`` (medians of
  the rounds), ``speedup`` (median of the per-round ratios default / best) and ``spread`` (half the range of
  those ratios, relative to ``speedup``).

Every confirmation is kept: the latest one of each *config* (by ``created_at``, then id) against the
group's current default is that config's verdict, and :mod:`db.selection` (``select_record``) turns the
verdicts and the records into the record compile applies. So a re-tune that confirms another config does
not erase an earlier config's confirmed speed-up. Confirmations travel with export, import and merge
(duplicates skipped by fingerprint, ``created_at`` kept), so a database never receives a tuned record's
speed-up without the confirmation it came from, and a merged older verdict does not override a newer one.
"""

from __future__ import annotations

import functools
import itertools
import json
import statistics
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, func, insert, select

from db.canonical import (
    canonical_config_text,
    canonical_hash,
    canonical_json,
    check_latencies,
    config_problem,
    format_time,
    utc_now,
)
from db.core import BEST_ORDER, DatabaseCore, Validator, host, kiln_version, records_select
from db.errors import InvalidRecordError
from db.models import ConfirmationRow, RecordRow, TargetRow, WorkloadRow
from db.records import Confirmation, ConfirmationIn, Record
from db.selection import ConfigKey, Selection, choose
from db.status import Status

if TYPE_CHECKING:
    from sqlalchemy.engine import Row

CONFIRMATION_COLUMNS = (
    WorkloadRow.key,
    TargetRow.key,
    ConfirmationRow.sketch,
    ConfirmationRow.sketch_version,
    ConfirmationRow.config,
    ConfirmationRow.default_config,
    ConfirmationRow.best_rounds,
    ConfirmationRow.default_rounds,
    ConfirmationRow.best_us,
    ConfirmationRow.default_us,
    ConfirmationRow.speedup,
    ConfirmationRow.spread,
    ConfirmationRow.run_id,
    ConfirmationRow.kiln_version,
    ConfirmationRow.host,
    ConfirmationRow.created_at,
    ConfirmationRow.id,
)


def summarize_rounds(best: Sequence[float], default: Sequence[float]) -> tuple[float, float, float, float]:
    """(best_us, default_us, speedup, spread) of paired per-round medians (see the module docstring)."""
    ratios = [d / b for b, d in zip(best, default)]
    speedup = float(statistics.median(ratios))
    spread = (max(ratios) - min(ratios)) / 2 / speedup
    return float(statistics.median(best)), float(statistics.median(default)), speedup, spread


def check_rounds(best: Any, default: Any) -> tuple[list[float], list[float]]:
    """The two lists of per-round medians, checked: the same length (at least 1), finite, positive."""
    b, d = check_latencies(best), check_latencies(default)
    if not b or not d or len(b) != len(d):
        raise ValueError("a confirmation needs the same number (at least 1) of best and default rounds")
    if min(b) <= 0 or min(d) <= 0:
        raise ValueError("confirmation rounds must be positive latencies")
    return b, d


def confirmation_fingerprint(
    workload_key: str,
    target_key: str,
    sketch: str,
    sketch_version: int,
    config_json: str,
    default_json: str,
    best_rounds_json: str,
    default_rounds_json: str,
    created_at: datetime,
) -> str:
    """sha256 of a confirmation's identity (host, Kiln version and run do not count)."""
    identity = [
        workload_key,
        target_key,
        sketch,
        int(sketch_version),
        config_json,
        default_json,
        best_rounds_json,
        default_rounds_json,
        format_time(created_at),
    ]
    return canonical_hash(identity)


def to_confirmation(row: Row) -> Confirmation:
    """A Confirmation from a row of CONFIRMATION_COLUMNS; malformed JSON raises InvalidRecordError."""
    (
        wk,
        tk,
        sketch,
        version,
        config,
        default,
        b_rounds,
        d_rounds,
        b_us,
        d_us,
        sp,
        spread,
        run,
        kv,
        h,
        at,
        cid,
    ) = row
    try:
        best, dflt = check_rounds(json.loads(b_rounds), json.loads(d_rounds))
        config_value, default_value = json.loads(config), json.loads(default)
    except ValueError as exc:
        raise InvalidRecordError(f"confirmation {cid} of workload {wk} on {tk} is malformed: {exc}") from None
    problem = config_problem(config_value) or config_problem(default_value)
    if problem:
        raise InvalidRecordError(f"confirmation {cid} of workload {wk} on {tk} is malformed: {problem}")
    return Confirmation(
        wk, tk, sketch, version, config_value, default_value, tuple(best), tuple(dflt),
        b_us, d_us, sp, spread, run, kv, h, at.replace(tzinfo=UTC), cid,
    )  # fmt: skip


def confirmation_values(
    conf: ConfirmationIn, workload_id: int, target_id: int, *, created_at: datetime | None = None,
    kiln: str | None = None, host_name: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Validate ``conf`` and return its row's column values (ValueError naming the problem)."""
    problem = config_problem(conf.config) or config_problem(conf.default_config)
    if problem:
        raise ValueError(problem)
    if isinstance(conf.sketch_version, bool) or not isinstance(conf.sketch_version, int):
        raise ValueError(f"sketch_version must be an int, got {conf.sketch_version!r}")
    if not isinstance(conf.sketch, str) or not conf.sketch:
        raise ValueError("sketch name must be a non-empty string")
    best, default = check_rounds(conf.best_rounds, conf.default_rounds)
    best_us, default_us, speedup, spread = summarize_rounds(best, default)
    created = created_at or utc_now()
    config_json, default_json = canonical_json(conf.config), canonical_json(conf.default_config)
    b_json, d_json = canonical_json(best), canonical_json(default)
    return dict(
        workload_id=workload_id,
        target_id=target_id,
        sketch=conf.sketch,
        sketch_version=conf.sketch_version,
        config=config_json,
        default_config=default_json,
        best_rounds=b_json,
        default_rounds=d_json,
        best_us=best_us,
        default_us=default_us,
        speedup=speedup,
        spread=spread,
        run_id=conf.run_id,
        kiln_version=kiln or kiln_version(),
        host=host_name or host(),
        created_at=created,
        fingerprint=confirmation_fingerprint(
            conf.workload_key, conf.target_key, conf.sketch, conf.sketch_version, config_json, default_json,
            b_json, d_json, created,
        ),
    )  # fmt: skip


def _select():  # type: ignore[no-untyped-def]
    return (
        select(*CONFIRMATION_COLUMNS)
        .join(WorkloadRow, WorkloadRow.id == ConfirmationRow.workload_id)
        .join(TargetRow, TargetRow.id == ConfirmationRow.target_id)
    )


@functools.cache
def _workload_confirmations():  # type: ignore[no-untyped-def]
    """Every confirmation of (:wk, :tk) (built once: a reused statement skips SQLAlchemy's re-adaptation)."""
    return _select().where(WorkloadRow.key == bindparam("wk"), TargetRow.key == bindparam("tk"))


@functools.cache
def _workload_records():  # type: ignore[no-untyped-def]
    """Every record of (:wk, :tk): the failed ones first, then the ok ones in best order (streamed)."""
    return (
        records_select()
        .where(WorkloadRow.key == bindparam("wk"), TargetRow.key == bindparam("tk"))
        .order_by((RecordRow.status == Status.OK.value), *BEST_ORDER)
        .execution_options(yield_per=64)
    )


class ConfirmationMixin(DatabaseCore):
    """Committing and reading confirmations."""

    def commit_confirmation(self, conf: ConfirmationIn) -> int:
        """Store a confirmation (the workload and target must have been committed); return its id.
        Malformed input raises :class:`InvalidRecordError` naming what was wrong."""
        where = f"confirmation of workload {conf.workload_key!r} on target {conf.target_key!r}"
        with self._write("commit a confirmation") as conn:
            wid, tid = self._workload_id(conn, conf.workload_key), self._target_id(conn, conf.target_key)
            try:
                values = confirmation_values(conf, wid, tid)
            except ValueError as exc:
                raise InvalidRecordError(f"{where}: {exc}") from None
            return conn.execute(insert(ConfirmationRow).values(**values)).inserted_primary_key[0]

    def latest_confirmations(self, workload_keys: Iterable[str], target_key: str) -> dict[str, Confirmation]:
        """The most recently stored confirmation of each workload on the target, whatever config it
        confirmed (workloads without one are absent; malformed stored rows are skipped). What compile applies
        is decided over all of a workload's confirmations: :meth:`select_record`."""
        keys = sorted(set(workload_keys))
        out: dict[str, Confirmation] = {}
        latest = (
            select(ConfirmationRow.workload_id, func.max(ConfirmationRow.id).label("cid"))
            .join(TargetRow, TargetRow.id == ConfirmationRow.target_id)
            .where(TargetRow.key == target_key)
            .group_by(ConfirmationRow.workload_id)
            .subquery()
        )
        with self._read("read confirmations") as conn:
            for start in range(0, len(keys), 500):
                stmt = _select().join(latest, latest.c.cid == ConfirmationRow.id)
                stmt = stmt.where(WorkloadRow.key.in_(keys[start : start + 500]))
                for row in conn.execute(stmt):
                    try:
                        out[row[0]] = to_confirmation(row)
                    except InvalidRecordError:
                        continue
        return out

    def latest_confirmation(self, workload_key: str, target_key: str) -> Confirmation | None:
        """The latest confirmation of (workload, target), or None."""
        return self.latest_confirmations([workload_key], target_key).get(workload_key)

    def find_confirmations(
        self, workload_key: str | None = None, target_key: str | None = None
    ) -> list[Confirmation]:
        """Every (well-formed) confirmation matching the filters, oldest first."""
        stmt = _select().order_by(ConfirmationRow.id)
        if workload_key is not None:
            stmt = stmt.where(WorkloadRow.key == workload_key)
        if target_key is not None:
            stmt = stmt.where(TargetRow.key == target_key)
        out = []
        with self._read("list confirmations") as conn:
            for row in conn.execute(stmt):
                try:
                    out.append(to_confirmation(row))
                except InvalidRecordError:
                    continue
        return out

    def select_record(
        self,
        workload_key: str,
        target_key: str,
        default_config: dict[str, Any],
        *,
        validate: Validator | None = None,
    ) -> Selection:
        """The record compile applies to (workload, target) whose group's default config is
        ``default_config``, by the rule of :mod:`db.selection`. ``validate`` (the sketch's check) filters
        records, as in :meth:`~db.queries.QueryMixin.best` (rejected ones are skipped with a warning), and
        confirmations (silently: a confirmation of another sketch version is simply out of date)."""
        params = {"wk": workload_key, "tk": target_key}
        confirmations = []
        failed: set[ConfigKey] = set()

        def candidates(rows: Iterator[Row]) -> Iterator[Record]:
            for row in rows:
                rec, problem = self._candidate_problem(row, validate)
                if problem is None:
                    yield rec  # type: ignore[misc]
                else:
                    self._warn_skipped(row, problem)

        with self._read("select the record to apply") as conn:
            for row in conn.execute(_workload_confirmations(), params):
                try:
                    conf = to_confirmation(row)
                except InvalidRecordError:
                    continue
                if validate is None or validate(conf) is None:  # type: ignore[arg-type]
                    confirmations.append(conf)
            result = conn.execute(_workload_records(), params)
            try:
                rows = iter(result)
                first_ok = None
                for row in rows:  # the failed measurements come first: their configs are left out
                    if row.status == Status.OK.value:
                        first_ok = row
                        break
                    failed.add((row.sketch, int(row.sketch_version), canonical_config_text(row.config)))
                ok_rows = itertools.chain([first_ok], rows) if first_ok is not None else iter(())
                return choose(candidates(ok_rows), failed, confirmations, default_config)
            finally:
                result.close()
