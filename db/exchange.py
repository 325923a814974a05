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
     "kiln_version": ..., "host": ..., "created_at": ...}  (optional: "rule_latency_us", "whole_us",
     "rule_whole_us")
    {"type": "confirmation", "workload": ..., "target": ..., "sketch": ..., "sketch_version": ...,
     "config": {...}, "default_config": {...}, "best_rounds": [...], "default_rounds": [...],
     "kiln_version": ..., "host": ..., "run": <source run id> | null, "created_at": ...}

Version 2 added the confirmation lines (see :mod:`db.confirmations`): a speed-up over the default travels
only with the interleaved re-measurement it came from, and the importer derives medians, speed-up and
spread from the rounds itself. Version 1 files (no confirmations) import as before.

Targets and workloads come before the records that name them. Import rules:

- a record is a duplicate (skipped) when a stored record has the same workload, target, sketch, sketch
  version, canonical config JSON, latencies, status and ``created_at`` (its fingerprint, see
  :func:`db.canonical.record_fingerprint`); host, Kiln version, run and error text do not count;
- workloads and targets are matched by key; a workload whose canonical group differs from the stored one
  aborts the import (:class:`~db.errors.ConflictError`); a target keeps its stored description;
- runs are matched by (model, hash, target, host, started_at) and records are re-pointed to the local run;
- model tasks are added when (model, hash, workload) is not stored; fusion plans when no identical plan is;
- confirmations are duplicates when their fingerprint (workload, target, sketch, version, both configs, both
  rounds lists, ``created_at``) is stored;
- cached cost-model features are not exported (they are recomputed from the records).

Every line is parsed with ``json.loads`` and checked field by field. A malformed line (not JSON, a missing
or mistyped field, a config that is not a flat JSON object, a record naming a workload that is not there) is
skipped and reported with its line number, and the rest is imported in one transaction; ``strict`` turns the
first bad line into an error that aborts the import (nothing is written). A file whose first line is not an
export header, a newer format and a workload conflict always abort.

Exports and merges read rows written by anyone: a stored row whose JSON does not parse (a hand-edited
config, say) is skipped and reported (``on_skip``), never a crash; records of a skipped workload or target
go with it, and records of a skipped run lose their run. This module writes exports; :mod:`db.importer`
reads them.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from sqlalchemy import select

from db.canonical import (
    canonical_json,
    check_latencies,
    config_problem,
    format_time,
    utc_now,
)
from db.errors import DatabaseError
from db.models import ConfirmationRow, FusionPlanRow, ModelTaskRow, RecordRow, RunRow, TargetRow, WorkloadRow
from db.status import Status

if TYPE_CHECKING:
    from db.database import TuningDatabase

FORMAT_NAME = "kiln-tuning-db"
FORMAT_VERSION = 2  # 2: confirmation lines
_BATCH = 1000  # rows fetched per round trip


# -- export -------------------------------------------------------------------------------------------


def iter_export(
    db: TuningDatabase,
    *,
    workload_key: str | None = None,
    target_key: str | None = None,
    status: Status | str | None = None,
    on_skip: Callable[[str], None] | None = None,
) -> Iterator[dict[str, Any]]:
    """Yield the export items of ``db`` (header first). Filters restrict the records; then only the
    targets, workloads and runs those records name are exported, and no model tasks or fusion plans.
    A stored row that cannot be exported (malformed JSON) is skipped and ``on_skip(reason)`` is called."""
    from compiler import __version__

    skip = on_skip or (lambda _reason: None)
    bad_targets: set[str] = set()
    bad_workloads: set[str] = set()
    bad_runs: set[int] = set()

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
            info_value = _loads(info, dict)
            if info_value is None:
                bad_targets.add(key)
                skip(f"target {key!r}: its info is not a JSON object")
                continue
            yield {"type": "target", "key": key, "info": info_value, "created_at": format_time(created)}
        for key, canonical, kind, flops, nbytes, created in conn.execute(workloads):
            canonical_value = _loads(canonical, (dict, list))
            if canonical_value is None:
                bad_workloads.add(key)
                skip(f"workload {key!r}: its canonical group is not JSON")
                continue
            yield {
                "type": "workload",
                "key": key,
                "canonical": canonical_value,
                "kind": kind,
                "flops": flops,
                "bytes": nbytes,
                "created_at": format_time(created),
            }
        for rid, name, mhash, tk, budget, cmd, host, kv, started, finished in conn.execute(runs):
            budget_value = _loads(budget, dict)
            if budget_value is None or tk in bad_targets:
                bad_runs.add(rid)
                skip(
                    f"run {rid}: " + ("its target was skipped" if tk in bad_targets else "budget is not JSON")
                )
                continue
            yield {
                "type": "run",
                "id": rid,
                "model_name": name,
                "model_hash": mhash,
                "target": tk,
                "budget": budget_value,
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
                if wk in bad_workloads:
                    continue
                yield {
                    "type": "model_task",
                    "model_name": name,
                    "model_hash": mhash,
                    "workload": wk,
                    "weight": weight,
                    "created_at": format_time(created),
                }
        result = conn.execute(rec_stmt.add_columns(RecordRow.id).execution_options(yield_per=_BATCH))
        for wk, tk, sketch, version, config, lat, med, st, err, kv, host, run_id, created, rid in result:
            config_value = _loads(config, dict)
            problem = config_problem(config_value) if config_value is not None else "config is not JSON"
            latencies = _loads(lat, list) if lat is not None else None
            if problem is None and lat is not None and latencies is None:
                problem = "latencies are not a JSON list"
            elif problem is None and lat is not None:
                try:
                    latencies = check_latencies(latencies)
                except ValueError as exc:
                    problem = f"latencies: {exc}"
            if problem is None and (wk in bad_workloads or tk in bad_targets):
                problem = "its workload or target was skipped"
            if problem is not None:
                skip(f"record {rid} of workload {wk[:16]} on {tk}: {problem}")
                continue
            yield {
                "type": "record",
                "workload": wk,
                "target": tk,
                "sketch": sketch,
                "sketch_version": version,
                "config": config_value,
                "latencies_us": latencies,
                "median_us": med,
                "status": st,
                "error": err,
                "kiln_version": kv,
                "host": host,
                "run": None if run_id in bad_runs else run_id,
                "created_at": format_time(created),
            }
        if status is None or Status.parse(status) is Status.OK:
            yield from _confirmation_items(
                conn, workload_key, target_key, bad_workloads | bad_targets, bad_runs, skip
            )
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
                    FusionPlanRow.whole_us,
                    FusionPlanRow.rule_whole_us,
                )
                .join(TargetRow, TargetRow.id == FusionPlanRow.target_id)
                .order_by(FusionPlanRow.id)
            )
            for region, tk, plan, latency, kv, host, created, rule, whole, rwhole in conn.execute(plans):
                plan_value = _loads(plan, dict)
                if plan_value is None or tk in bad_targets:
                    skip(f"fusion plan of region {region!r} on {tk}: not exportable")
                    continue
                line = {
                    "type": "fusion_plan",
                    "region_key": region,
                    "target": tk,
                    "plan": plan_value,
                    "latency_us": latency,
                    "kiln_version": kv,
                    "host": host,
                    "created_at": format_time(created),
                }
                for key, value in (("rule_latency_us", rule), ("whole_us", whole), ("rule_whole_us", rwhole)):
                    if value is not None:
                        line[key] = value
                yield line


def export_jsonl(
    db: TuningDatabase,
    dest: str | Path | IO[str],
    *,
    workload_key: str | None = None,
    target_key: str | None = None,
    status: Status | str | None = None,
    skipped: list[str] | None = None,
) -> int:
    """Write :func:`iter_export` as JSON Lines to a path (atomically; ``.gz`` compresses) or a text file;
    return the number of records written. Rows that cannot be exported are skipped; their reasons are
    appended to ``skipped`` when given."""
    on_skip = skipped.append if skipped is not None else None
    items = iter_export(db, workload_key=workload_key, target_key=target_key, status=status, on_skip=on_skip)
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


def _confirmation_items(
    conn: Any,
    workload_key: str | None,
    target_key: str | None,
    bad_keys: set[str],
    bad_runs: set[int],
    skip: Callable[[str], None],
) -> Iterator[dict[str, Any]]:
    """Export items of the confirmations (of one workload and/or target, when given)."""
    stmt = (
        select(
            WorkloadRow.key,
            TargetRow.key,
            ConfirmationRow.sketch,
            ConfirmationRow.sketch_version,
            ConfirmationRow.config,
            ConfirmationRow.default_config,
            ConfirmationRow.best_rounds,
            ConfirmationRow.default_rounds,
            ConfirmationRow.run_id,
            ConfirmationRow.kiln_version,
            ConfirmationRow.host,
            ConfirmationRow.created_at,
            ConfirmationRow.id,
        )
        .join(WorkloadRow, WorkloadRow.id == ConfirmationRow.workload_id)
        .join(TargetRow, TargetRow.id == ConfirmationRow.target_id)
        .order_by(ConfirmationRow.id)
    )
    if workload_key is not None:
        stmt = stmt.where(WorkloadRow.key == workload_key)
    if target_key is not None:
        stmt = stmt.where(TargetRow.key == target_key)
    for (
        wk,
        tk,
        sketch,
        version,
        config,
        default,
        b_rounds,
        d_rounds,
        run_id,
        kv,
        host,
        created,
        cid,
    ) in conn.execute(stmt):
        values = [_loads(config, dict), _loads(default, dict), _loads(b_rounds, list), _loads(d_rounds, list)]
        if any(v is None for v in values) or wk in bad_keys or tk in bad_keys:
            skip(f"confirmation {cid} of workload {wk[:16]} on {tk}: malformed (or its workload/target)")
            continue
        yield {
            "type": "confirmation",
            "workload": wk,
            "target": tk,
            "sketch": sketch,
            "sketch_version": version,
            "config": values[0],
            "default_config": values[1],
            "best_rounds": values[2],
            "default_rounds": values[3],
            "kiln_version": kv,
            "host": host,
            "run": None if run_id in bad_runs else run_id,
            "created_at": format_time(created),
        }


def _loads(text: str | None, kind: type | tuple[type, ...]) -> Any:
    """``json.loads(text)`` when it parses to a ``kind``, else None (a malformed stored value)."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, kind) else None


def _write_lines(items: Iterable[dict[str, Any]], out: IO[str]) -> int:
    count = 0
    for item in items:
        out.write(canonical_json(item))
        out.write("\n")
        count += item["type"] == "record"
    return count
