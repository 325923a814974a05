"""Reading records: best, best_many, top_k, listings and coverage (a part of :class:`TuningDatabase`)."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from typing import TYPE_CHECKING

from sqlalchemy import bindparam, case, func, select
from sqlalchemy.orm import aliased

from db.canonical import canonical_config_text
from db.core import BEST_ORDER, DatabaseCore, Validator, records_select, to_record
from db.errors import AmbiguousKeyError, CorruptDatabaseError, InvalidRecordError, UnknownKeyError
from db.models import ConfirmationRow, ModelTaskRow, RecordRow, TargetRow, WorkloadRow
from db.records import CoverageRow, PrunePlan, Record, WorkloadInfo
from db.status import Status

if TYPE_CHECKING:
    import pandas as pd


@functools.cache
def _best_statement():  # type: ignore[no-untyped-def]
    """Ok records of (:wk, :tk) in best order, :lim of them from :off (built once: reusing one statement
    object lets SQLAlchemy skip re-adapting its cached compilation, a large part of a sub-ms query)."""
    return (
        records_select()
        .where(WorkloadRow.key == bindparam("wk"), TargetRow.key == bindparam("tk"), RecordRow.status == "ok")
        .order_by(*BEST_ORDER)
        .limit(bindparam("lim"))
        .offset(bindparam("off"))
    )


@functools.cache
def _best_many_statement():  # type: ignore[no-untyped-def]
    """The best ok record of each workload in :keys on target id :tid: one correlated index seek each."""
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
    return records_select().where(RecordRow.id.in_(ids))


def _ident(row) -> tuple[str, str, str, int, str]:  # type: ignore[no-untyped-def]
    return (row[0], row[1], row.sketch, int(row.sketch_version), canonical_config_text(row.config))


@functools.cache
def _confirmed_configs_statement():  # type: ignore[no-untyped-def]
    """(workload key, target key, sketch, version, config) of every confirmation."""
    return (
        select(
            WorkloadRow.key,
            TargetRow.key,
            ConfirmationRow.sketch,
            ConfirmationRow.sketch_version,
            ConfirmationRow.config,
        )
        .join(WorkloadRow, WorkloadRow.id == ConfirmationRow.workload_id)
        .join(TargetRow, TargetRow.id == ConfirmationRow.target_id)
        .distinct()
    )


class QueryMixin(DatabaseCore):
    """The read side of the tuning database."""

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
            records_select()
            .where(WorkloadRow.key == workload_key, TargetRow.key == target_key, RecordRow.status == "ok")
            .order_by(*BEST_ORDER)
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
        stmt = records_select().where(WorkloadRow.key == workload_key, TargetRow.key == target_key)
        if status is not None:
            stmt = stmt.where(RecordRow.status == Status.parse(status).value)
        stmt = stmt.order_by(RecordRow.median_us.is_(None), *BEST_ORDER)
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

    def prune_plan(
        self, keep_top_k: int, *, keep_errors: bool = True, validate: Validator | None = None
    ) -> PrunePlan:
        """What :meth:`prune` would delete: per (workload, target), the ok records after the ``keep_top_k``
        best valid ones (``validate(record)`` returning None, and a structurally sound config), plus, without
        ``keep_errors``, the records that are not ok. Invalid ok records are left alone and listed.

        What compile's selection (:mod:`db.selection`) rests on is never deleted: the records of a config
        that has a confirmation (they are kept beside the K best), and a failed record of a config that
        keeps an ok record (it is what keeps that config from being applied)."""
        if keep_top_k < 1:
            raise InvalidRecordError(
                f"prune keeps at least 1 record per workload and target, not {keep_top_k}"
            )
        stmt = records_select().order_by(
            RecordRow.workload_id, RecordRow.target_id, RecordRow.median_us.is_(None), *BEST_ORDER
        )
        doomed: list[Record] = []
        left_alone: list[tuple[int, str]] = []
        kept: dict[tuple[str, str], int] = {}
        kept_configs: set[tuple[str, str, str, int, str]] = set()
        beside = 0  # records of confirmed configs, kept beside the K best
        with self._read("plan a prune") as conn:
            rows = conn.execute(stmt).all()
            confirmed = {
                (wk, tk, sketch, int(version), canonical_config_text(config))
                for wk, tk, sketch, version, config in conn.execute(_confirmed_configs_statement())
            }
        for row in rows:
            if row.status != Status.OK.value:
                continue
            rec, problem = self._candidate_problem(row, validate)
            if problem is not None or rec is None:
                left_alone.append((row.id, problem or "malformed"))
                continue
            ident, group = _ident(row), (row[0], row[1])
            if ident in confirmed:
                kept_configs.add(ident)  # beside the K best: compile's selection rests on it
                beside += 1
            elif kept.get(group, 0) < keep_top_k:
                kept[group] = kept.get(group, 0) + 1
                kept_configs.add(ident)
            else:
                doomed.append(rec)
        for row in rows if not keep_errors else ():
            if row.status == Status.OK.value or _ident(row) in kept_configs:
                continue  # a kept config's failed measurement keeps it from being applied (db.selection)
            try:
                doomed.append(to_record(row))
            except InvalidRecordError as exc:
                left_alone.append((row.id, str(exc)))
        return PrunePlan(
            keep_top_k, keep_errors, tuple(doomed), sum(kept.values()) + beside, tuple(left_alone)
        )

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
        stmt = records_select()
        if workload_key is not None:
            stmt = stmt.where(WorkloadRow.key == workload_key)
        if target_key is not None:
            stmt = stmt.where(TargetRow.key == target_key)
        if status is not None:
            stmt = stmt.where(RecordRow.status == Status.parse(status).value)
        stmt = stmt.order_by(RecordRow.median_us.is_(None), *BEST_ORDER)
        if limit is not None:
            stmt = stmt.limit(limit)
        out = []
        with self._read("list records") as conn:
            for row in conn.execute(stmt):
                try:
                    out.append(to_record(row))
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

    def check_integrity(self) -> None:
        """Raise :class:`CorruptDatabaseError` naming the file when a SQLite database is damaged anywhere
        (Kiln's tables and the Optuna tables that share the file: ``PRAGMA quick_check``); a no-op on other
        backends, whose servers keep their own files consistent. ``kiln tune`` runs it before it writes."""
        if self.dialect != "sqlite":
            return
        from sqlalchemy import text

        with self._read("check the database file") as conn:
            found = [" ".join(str(r[0]).split()) for r in conn.execute(text("PRAGMA quick_check(3)"))]
        if found != ["ok"]:
            from db.engine import sqlite_path

            path = sqlite_path(self._url)
            shown = str(path) if path is not None else self.url
            problems = "; ".join(found)[:300]
            raise CorruptDatabaseError(
                f"{shown} is damaged (SQLite integrity check: {problems}); restore it from a backup, "
                "or move it aside and rebuild it from an export with `kiln db import`"
            )

    def count_records(self, status: Status | str | None = None) -> int:
        """Number of records (of one status, if given)."""
        stmt = select(func.count()).select_from(RecordRow)
        if status is not None:
            stmt = stmt.where(RecordRow.status == Status.parse(status).value)
        with self._read("count records") as conn:
            return int(conn.execute(stmt).scalar() or 0)

    def target_keys(self) -> list[str]:
        """All target keys, sorted."""
        with self._read("list targets") as conn:
            return list(conn.execute(select(TargetRow.key).order_by(TargetRow.key)).scalars())

    def target_info(self, key: str) -> dict:
        """The description stored with a target."""
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
        with self._read("read a workload") as conn:
            text = conn.execute(select(WorkloadRow.canonical).where(WorkloadRow.key == key)).scalar()
        if text is None:
            raise UnknownKeyError(f"workload {key!r} is not in {self.url}")
        return json.loads(text)

    def coverage_rows(
        self, model_name: str, target_key: str, model_hash: str | None = None
    ) -> list[CoverageRow]:
        """Per task of the model: tuned or not on the target, best median, record counts by status."""
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
