"""JSON Lines export and import of a tuning database, and merging one database into another.

Format (one JSON object per line, UTF-8; times are UTC ``2026-11-21T12:00:00.000000Z``)::

    {"type": "header", "format": "kiln-tuning-db", "version": 1, "kiln_version": ..., "exported_at": ...}
    {"type": "target", "key": ..., "info": {...}, "created_at": ...}
    {"type": "workload", "key": ..., "canonical": {...}, "kind": ..., "flops": ..., "bytes": ...,
     "created_at": ...}
    {"type": "run", "id": <id in the source>, "model_name": ..., "model_hash": ..., "target": ...,
     "budget": {...}, "command_line": ..., "host": ..., "kiln_version": ..., "started_at": ...,
     "finished_at": ... | null}
    {"type": "model_task", "model_name": ..., "model_hash": ..., "workload": ..., "weight": ...,
     "created_at": ...}
    {"type": "record", "workload": ..., "target": ..., "sketch": ..., "sketch_version": ..., "config": {...},
     "latencies_us": [...] | null, "median_us": ... | null, "status": ..., "error": ... | null,
     "kiln_version": ..., "host": ..., "run": <source run id> | null, "created_at": ...}
    {"type": "fusion_plan", "region_key": ..., "target": ..., "plan": {...}, "latency_us": ...,
     "kiln_version": ..., "host": ..., "created_at": ...}

Targets and workloads come before the records that name them. Import rules:

- a record is a duplicate (skipped) when a stored record has the same workload, target, sketch, sketch
  version, canonical config JSON, latencies, status and ``created_at`` (its fingerprint, see
  :func:`db.canonical.record_fingerprint`); host, Kiln version, run and error text do not count;
- workloads and targets are matched by key; a workload whose canonical group differs from the stored one
  aborts the import (:class:`~db.errors.ConflictError`); a target keeps its stored description;
- runs are matched by (model, hash, target, host, started_at) and records are re-pointed to the local run;
- model tasks are added when (model, hash, workload) is not stored; fusion plans when no identical plan is;
- cached cost-model features are not exported (they are recomputed from the records).

Every line is parsed with ``json.loads`` and checked field by field; a malformed line aborts the import with
its line number, and nothing is written (one transaction). This module writes exports; :mod:`db.importer`
reads them.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from sqlalchemy import select

from db.canonical import (
    canonical_json,
    format_time,
    utc_now,
)
from db.errors import DatabaseError
from db.models import FusionPlanRow, ModelTaskRow, RecordRow, RunRow, TargetRow, WorkloadRow
from db.status import Status

if TYPE_CHECKING:
    from db.database import TuningDatabase

FORMAT_NAME = "kiln-tuning-db"
FORMAT_VERSION = 1
_BATCH = 1000  # rows fetched per round trip


# -- export -------------------------------------------------------------------------------------------


def iter_export(
    db: TuningDatabase,
    *,
    workload_key: str | None = None,
    target_key: str | None = None,
    status: Status | str | None = None,
) -> Iterator[dict[str, Any]]:
    """Yield the export items of ``db`` (header first). Filters restrict the records; then only the
    targets, workloads and runs those records name are exported, and no model tasks or fusion plans."""
    from compiler import __version__

    filtered = workload_key is not None or target_key is not None or status is not None
    rec_stmt = (
        select(
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
        )
        .join(WorkloadRow, WorkloadRow.id == RecordRow.workload_id)
        .join(TargetRow, TargetRow.id == RecordRow.target_id)
        .order_by(RecordRow.id)
    )
    if workload_key is not None:
        rec_stmt = rec_stmt.where(WorkloadRow.key == workload_key)
    if target_key is not None:
        rec_stmt = rec_stmt.where(TargetRow.key == target_key)
    if status is not None:
        rec_stmt = rec_stmt.where(RecordRow.status == Status.parse(status).value)
    sub = rec_stmt.subquery()

    yield {
        "type": "header",
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "kiln_version": __version__,
        "exported_at": format_time(utc_now()),
    }
    with db._read("export the database") as conn:
        targets = select(TargetRow.key, TargetRow.info, TargetRow.created_at).order_by(TargetRow.id)
        workloads = select(
            WorkloadRow.key,
            WorkloadRow.canonical,
            WorkloadRow.kind,
            WorkloadRow.flops,
            WorkloadRow.bytes,
            WorkloadRow.created_at,
        ).order_by(WorkloadRow.id)
        runs = (
            select(
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
            .join(TargetRow, TargetRow.id == RunRow.target_id)
            .order_by(RunRow.id)
        )
        if filtered:
            targets = targets.where(TargetRow.key.in_(select(sub.c[1])))
            workloads = workloads.where(WorkloadRow.key.in_(select(sub.c[0])))
            runs = runs.where(RunRow.id.in_(select(sub.c.run_id)))
        for key, info, created in conn.execute(targets):
            yield {"type": "target", "key": key, "info": json.loads(info), "created_at": format_time(created)}
        for key, canonical, kind, flops, nbytes, created in conn.execute(workloads):
            yield {
                "type": "workload",
                "key": key,
                "canonical": json.loads(canonical),
                "kind": kind,
                "flops": flops,
                "bytes": nbytes,
                "created_at": format_time(created),
            }
        for rid, name, mhash, tk, budget, cmd, host, kv, started, finished in conn.execute(runs):
            yield {
                "type": "run",
                "id": rid,
                "model_name": name,
                "model_hash": mhash,
                "target": tk,
                "budget": json.loads(budget),
                "command_line": cmd,
                "host": host,
                "kiln_version": kv,
                "started_at": format_time(started),
                "finished_at": format_time(finished) if finished else None,
            }
        if not filtered:
            tasks = (
                select(
                    ModelTaskRow.model_name,
                    ModelTaskRow.model_hash,
                    WorkloadRow.key,
                    ModelTaskRow.weight,
                    ModelTaskRow.created_at,
                )
                .join(WorkloadRow, WorkloadRow.id == ModelTaskRow.workload_id)
                .order_by(ModelTaskRow.id)
            )
            for name, mhash, wk, weight, created in conn.execute(tasks):
                yield {
                    "type": "model_task",
                    "model_name": name,
                    "model_hash": mhash,
                    "workload": wk,
                    "weight": weight,
                    "created_at": format_time(created),
                }
        result = conn.execute(rec_stmt.execution_options(yield_per=_BATCH))
        for wk, tk, sketch, version, config, lat, med, st, err, kv, host, run_id, created in result:
            yield {
                "type": "record",
                "workload": wk,
                "target": tk,
                "sketch": sketch,
                "sketch_version": version,
                "config": json.loads(config),
                "latencies_us": json.loads(lat) if lat is not None else None,
                "median_us": med,
                "status": st,
                "error": err,
                "kiln_version": kv,
                "host": host,
                "run": run_id,
                "created_at": format_time(created),
            }
        if not filtered:
            plans = (
                select(
                    FusionPlanRow.region_key,
                    TargetRow.key,
                    FusionPlanRow.plan,
                    FusionPlanRow.latency_us,
                    FusionPlanRow.kiln_version,
                    FusionPlanRow.host,
                    FusionPlanRow.created_at,
                    FusionPlanRow.rule_latency_us,
                )
                .join(TargetRow, TargetRow.id == FusionPlanRow.target_id)
                .order_by(FusionPlanRow.id)
            )
            for region, tk, plan, latency, kv, host, created, rule in conn.execute(plans):
                line = {
                    "type": "fusion_plan",
                    "region_key": region,
                    "target": tk,
                    "plan": json.loads(plan),
                    "latency_us": latency,
                    "kiln_version": kv,
                    "host": host,
                    "created_at": format_time(created),
                }
                if rule is not None:
                    line["rule_latency_us"] = rule
                yield line


def export_jsonl(
    db: TuningDatabase,
    dest: str | Path | IO[str],
    *,
    workload_key: str | None = None,
    target_key: str | None = None,
    status: Status | str | None = None,
) -> int:
    """Write :func:`iter_export` as JSON Lines to a path (atomically; ``.gz`` compresses) or a text file;
    return the number of records written."""
    items = iter_export(db, workload_key=workload_key, target_key=target_key, status=status)
    if not isinstance(dest, str | Path):
        return _write_lines(items, dest)
    path = Path(dest)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise DatabaseError(f"cannot write export file {str(path)!r}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as raw:
            stream: IO[bytes] = gzip.GzipFile(fileobj=raw, mode="wb") if path.suffix == ".gz" else raw
            with io.TextIOWrapper(stream, encoding="utf-8", newline="\n") as text:
                count = _write_lines(items, text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return count


def _write_lines(items: Iterable[dict[str, Any]], out: IO[str]) -> int:
    count = 0
    for item in items:
        out.write(canonical_json(item))
        out.write("\n")
        count += item["type"] == "record"
    return count
