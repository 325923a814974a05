"""Bench runs in the tuning database (tables ``kiln_bench_runs`` and ``kiln_bench_results``, migration
0004_bench): save a :class:`~tuner.bench.results.BenchRun` in one transaction, read runs back, find the
baseline of ``--baseline last`` and the history of a workload. JSON columns hold canonical JSON, read back
with ``json.loads`` only."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, insert, select

from compiler.errors import KilnError
from db.canonical import canonical_json
from db.models import BenchResultRow, BenchRunRow
from tuner.bench.results import BenchResult, BenchRun

if TYPE_CHECKING:
    from db.database import TuningDatabase


def _json(value: Any) -> str:
    return canonical_json(value)


def save_run(db: TuningDatabase, run: BenchRun) -> int:
    """Store ``run`` and its results; returns (and sets) the run's id."""
    from db.core import host, kiln_version

    with db._write("store a bench run") as conn:
        rid = conn.execute(
            insert(BenchRunRow).values(
                suite=run.suite,
                target_key=run.target_key,
                command_line=run.command_line,
                host=run.environment.get("host") or host(),
                kiln_version=run.environment.get("kiln_version") or kiln_version(),
                git_commit=run.environment.get("git_commit"),
                environment=_json(run.environment),
                settings=_json(run.settings),
                ceilings=_json(run.ceilings),
                load_before=run.load_before,
                load_after=run.load_after,
                started_at=run.started_at,
                finished_at=run.finished_at,
            )
        ).inserted_primary_key[0]
        rows = [
            dict(
                run_id=rid,
                workload=r.workload,
                contender=r.contender,
                status=r.status,
                median_us=r.median_us,
                samples=_json(r.rounds_us),
                round_medians=_json(r.round_medians),
                max_rel_err=r.max_rel_err if r.max_rel_err is None or r.max_rel_err < float("inf") else None,
                flops=r.flops,
                bytes=r.bytes,
                note=r.note,
                info=_json({**r.info, **({"error": r.error} if r.error else {})}),
            )
            for r in run.results
        ]
        if rows:
            conn.execute(insert(BenchResultRow), rows)
    run.id = int(rid)
    return run.id


def _to_run(row: Any, results: list[Any]) -> BenchRun:
    out = BenchRun(
        suite=row.suite,
        target_key=row.target_key,
        command_line=row.command_line,
        environment=json.loads(row.environment),
        settings=json.loads(row.settings),
        ceilings=json.loads(row.ceilings),
        started_at=row.started_at,
        finished_at=row.finished_at,
        load_before=row.load_before,
        load_after=row.load_after,
        id=row.id,
    )
    for r in results:
        info = json.loads(r.info)
        out.results.append(
            BenchResult(
                workload=r.workload,
                contender=r.contender,
                status=r.status,
                rounds_us=json.loads(r.samples),
                max_rel_err=r.max_rel_err,
                flops=r.flops,
                bytes=r.bytes,
                note=r.note,
                error=info.pop("error", None),
                info=info,
            )
        )
    return out


def list_runs(db: TuningDatabase, suite: str | None = None, target_key: str | None = None) -> list[BenchRun]:
    """Stored runs (without their results), oldest first, optionally of one suite and target."""
    stmt = select(BenchRunRow)
    if suite is not None:
        stmt = stmt.where(BenchRunRow.suite == suite)
    if target_key is not None:
        stmt = stmt.where(BenchRunRow.target_key == target_key)
    with db._read("list bench runs") as conn:
        rows = conn.execute(stmt.order_by(BenchRunRow.started_at, BenchRunRow.id)).all()
    return [_to_run(r, []) for r in rows]


def load_run(db: TuningDatabase, run_id: int) -> BenchRun:
    """Run ``run_id`` with its results; an unknown id is a KilnError naming the database."""
    with db._read("read a bench run") as conn:
        row = conn.execute(select(BenchRunRow).where(BenchRunRow.id == run_id)).one_or_none()
        if row is None:
            raise KilnError(f"no bench run {run_id} in {db.url} (`kiln bench list` shows the stored runs)")
        results = conn.execute(
            select(BenchResultRow).where(BenchResultRow.run_id == run_id).order_by(BenchResultRow.id)
        ).all()
        return _to_run(row, results)


def resolve_run(
    db: TuningDatabase, spec: str, suite: str | None = None, target_key: str | None = None
) -> int:
    """A run id from ``spec``: a number, ``last`` (the newest run) or ``last~N`` (N runs before it),
    among the runs of ``suite`` and ``target_key`` when given."""
    if spec.isdigit():
        return int(spec)
    back = 0
    if spec.startswith("last~") and spec[5:].isdigit():
        back = int(spec[5:])
    elif spec != "last":
        raise KilnError(f"run {spec!r}: give a run id, last, last~N, or a JSON file from kiln bench --json")
    runs = list_runs(db, suite, target_key)
    if len(runs) <= back:
        where = f" of suite {suite!r} on {target_key}" if suite else ""
        raise KilnError(f"run {spec!r}: {db.url} holds {len(runs)} bench run(s){where}")
    return int(runs[-1 - back].id)  # type: ignore[arg-type]


def delete_run(db: TuningDatabase, run_id: int) -> None:
    with db._write("delete a bench run") as conn:
        conn.execute(delete(BenchResultRow).where(BenchResultRow.run_id == run_id))
        conn.execute(delete(BenchRunRow).where(BenchRunRow.id == run_id))


def history(db: TuningDatabase, suite: str, target_key: str) -> list[BenchRun]:
    """Every run of ``suite`` on ``target_key`` with its results, oldest first (for the history chart)."""
    return [load_run(db, r.id) for r in list_runs(db, suite, target_key)]  # type: ignore[arg-type]


def tuning_rows(
    db: TuningDatabase, workloads: list[tuple[str, str]], target_key: str
) -> list[dict[str, Any]]:
    """For each (workload, model name): the tuning runs of that model on ``target_key`` in the database,
    the records they stored (measured trials) and how many were ok, and their wall time in seconds.
    Workloads without a tuning run are left out."""
    from sqlalchemy import func

    from db.models import RecordRow

    out = []
    for workload, model_name in workloads:
        runs = [r for r in db.runs(model_name) if r.target_key == target_key]
        if not runs:
            continue
        ids = [r.id for r in runs]
        with db._read("count tuning records") as conn:
            counts = dict(
                conn.execute(
                    select(RecordRow.status, func.count())
                    .where(RecordRow.run_id.in_(ids))
                    .group_by(RecordRow.status)
                ).all()
            )
        seconds = sum(
            (r.finished_at - r.started_at).total_seconds() for r in runs if r.finished_at is not None
        )
        out.append(
            {
                "workload": workload,
                "runs": len(runs),
                "measured": int(sum(counts.values())),
                "ok": int(counts.get("ok", 0)),
                "seconds": seconds,
            }
        )
    return out
