"""The tables around the records: tuning runs, the tasks of a model, fusion plans and cached cost-model
features (a part of :class:`TuningDatabase`)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from sqlalchemy import delete, func, insert, select, update

from db.canonical import canonical_json, utc_now
from db.core import DatabaseCore, host, kiln_version
from db.errors import InvalidRecordError, UnknownKeyError
from db.models import FeatureRow, FusionPlanRow, ModelTaskRow, RecordRow, RunRow, TargetRow, WorkloadRow
from db.records import FusionPlanRecord, RunInfo

if TYPE_CHECKING:
    import numpy as np
    from sqlalchemy.engine import Row

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


class AuxTablesMixin(DatabaseCore):
    """Runs, model tasks, fusion plans and features."""

    def begin_run(
        self, model_name: str, model_hash: str, target_key: str, budget: dict, command_line: str
    ) -> int:
        """Record the start of a tuning run and return its id (pass it as ``RecordIn.run_id``)."""
        with self._write("begin a run") as conn:
            values = dict(
                model_name=model_name,
                model_hash=model_hash,
                target_id=self._target_id(conn, target_key),
                budget=canonical_json(budget),
                command_line=command_line,
                host=host(),
                kiln_version=kiln_version(),
                started_at=utc_now(),
                finished_at=None,
            )
            return conn.execute(insert(RunRow).values(**values)).inserted_primary_key[0]

    def finish_run(self, run_id: int, budget: dict | None = None) -> None:
        """Mark a tuning run finished now; with ``budget``, its budget JSON is replaced too (``tune()``
        records there how the run ended and the seconds it spent, so a rerun can resume it)."""
        values: dict = {"finished_at": utc_now()}
        if budget is not None:
            values["budget"] = canonical_json(budget)
        with self._write("finish a run") as conn:
            done = conn.execute(update(RunRow).where(RunRow.id == run_id).values(**values))
            if not done.rowcount:
                raise UnknownKeyError(f"run {run_id} is not in {self.url}")

    def reopen_run(self, run_id: int, budget: dict, command_line: str | None = None) -> None:
        """Continue an unfinished tuning run: clear its end time and replace its budget JSON (and command
        line, when given); records committed afterwards with this ``run_id`` add to the run."""
        values: dict = {"finished_at": None, "budget": canonical_json(budget)}
        if command_line is not None:
            values["command_line"] = command_line
        with self._write("reopen a run") as conn:
            done = conn.execute(update(RunRow).where(RunRow.id == run_id).values(**values))
            if not done.rowcount:
                raise UnknownKeyError(f"run {run_id} is not in {self.url}")

    def run_record_counts(self, run_id: int) -> dict[str, int]:
        """How many records were committed under run ``run_id``, by workload key."""
        stmt = (
            select(WorkloadRow.key, func.count())
            .select_from(RecordRow)
            .join(WorkloadRow, WorkloadRow.id == RecordRow.workload_id)
            .where(RecordRow.run_id == run_id)
            .group_by(WorkloadRow.key)
        )
        with self._read("count the records of a run") as conn:
            return {key: int(n) for key, n in conn.execute(stmt)}

    def run_last_record_at(self, run_id: int) -> datetime | None:
        """When the last record of run ``run_id`` was committed (aware UTC), or None without records."""
        stmt = select(func.max(RecordRow.created_at)).where(RecordRow.run_id == run_id)
        with self._read("read a run's last record") as conn:
            last = conn.execute(stmt).scalar()
        return last.replace(tzinfo=UTC) if last is not None else None

    def runs(self, model_name: str | None = None) -> list[RunInfo]:
        """Tuning runs, oldest first (optionally of one model)."""
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

    def model_tasks(self, model_name: str, model_hash: str | None = None) -> list[tuple[str, float]]:
        """The tasks ``[(workload_key, weight)]`` of a model, sorted by workload key.

        Without ``model_hash``, the most recently registered version of the model is used. A model with no
        tasks gives an empty list.
        """
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

    def commit_fusion_plan(
        self,
        region_key: str,
        target_key: str,
        plan: dict,
        latency_us: float,
        rule_latency_us: float | None = None,
        whole_us: float | None = None,
        rule_whole_us: float | None = None,
    ) -> int:
        """Store a measured fusion plan of a graph region on a target (with the latency of the region under
        the rules' plan, measured the same way, when known, and the whole model's latency under each plan
        when it was timed end to end); return its id."""

        for what, value in (
            ("latency", latency_us),
            ("rules' plan latency", rule_latency_us),
            ("whole-model latency", whole_us),
            ("rules' plan whole-model latency", rule_whole_us),
        ):
            if value is None and what != "latency":
                continue
            if not isinstance(value, int | float) or not math.isfinite(float(value)) or value < 0:
                raise InvalidRecordError(f"fusion plan of region {region_key!r}: bad {what} {value!r}")
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
                rule_latency_us=None if rule_latency_us is None else float(rule_latency_us),
                whole_us=None if whole_us is None else float(whole_us),
                rule_whole_us=None if rule_whole_us is None else float(rule_whole_us),
                kiln_version=kiln_version(),
                host=host(),
                created_at=utc_now(),
            )
            return conn.execute(insert(FusionPlanRow).values(**values)).inserted_primary_key[0]

    def best_fusion_plan(self, region_key: str, target_key: str) -> FusionPlanRecord | None:
        """The fusion plan of the region on the target with the lowest latency (ties: oldest, lowest id)."""
        found = self.fusion_plans(region_key, target_key, limit=1)
        return found[0] if found else None

    def fusion_plans(
        self, region_key: str, target_key: str | None = None, limit: int | None = None
    ) -> list[FusionPlanRecord]:
        """The fusion plans stored for a region (on one target, or all), best first."""
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
                FusionPlanRow.rule_latency_us,
                FusionPlanRow.whole_us,
                FusionPlanRow.rule_whole_us,
            )
            .join(TargetRow, TargetRow.id == FusionPlanRow.target_id)
            .where(FusionPlanRow.region_key == region_key)
            .order_by(FusionPlanRow.latency_us, FusionPlanRow.created_at, FusionPlanRow.id)
        )
        if target_key is not None:
            stmt = stmt.where(TargetRow.key == target_key)
        if limit is not None:
            stmt = stmt.limit(limit)
        with self._read("find fusion plans") as conn:
            rows = conn.execute(stmt).all()
        return [
            FusionPlanRecord(
                region,
                tk,
                json.loads(plan),
                latency,
                kv,
                host,
                created.replace(tzinfo=UTC),
                pid,
                rule,
                whole,
                rwhole,
            )
            for region, tk, plan, latency, kv, host, created, pid, rule, whole, rwhole in rows
        ]

    def commit_features(self, record_id: int, version: int, vector: Sequence[float] | np.ndarray) -> None:
        """Cache the cost-model features of a record (replacing an earlier vector of the same version).

        The vector is stored as raw little-endian float32 bytes with its length; never pickled.
        """
        import numpy as np

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
