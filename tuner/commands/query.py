"""`kiln query ...` and `kiln db ...`: read and maintain the tuning database from the command line.

``register(subparsers)`` adds both command groups to the ``kiln`` parser (see ``tuner/cli.py``). Importing
this module is cheap: SQLAlchemy and pandas are imported inside the handlers. Every command takes
``--db URL`` (default: env ``KILN_DB``, then ``sqlite:///kiln.db``); ``--target`` takes a full target key
or a prefix such as ``cpu`` or ``cuda/sm_90`` that names exactly one target in the database.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from db.output import FORMATS, write_rows

if TYPE_CHECKING:
    from db.database import TuningDatabase

KEY_WIDTH = 16  # workload keys are shown by prefix in tables; every command accepts a unique prefix
STATUS_CHOICES = ("ok", "compile_error", "runtime_error", "timeout", "wrong_result", "invalid_config")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``query`` and ``db`` command groups to the ``kiln`` parser."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--db",
        metavar="URL",
        default=None,
        help="database URL (default: $KILN_DB, else sqlite:///kiln.db), e.g. postgresql://user@host/kiln",
    )
    formatted = argparse.ArgumentParser(add_help=False, parents=[common])
    formatted.add_argument(
        "--format", choices=FORMATS, default="table", help="output format (default: table)"
    )

    query = subparsers.add_parser(
        "query",
        help="query the tuning database",
        description="Query the tuning database: workloads, best records, records, coverage of a model.",
    )
    qsub = query.add_subparsers(dest="query_command", metavar="WHAT")
    qsub.required = True

    p = qsub.add_parser("workloads", parents=[formatted], help="list workloads and their record counts")
    p.add_argument("--model", metavar="NAME", type=_model_name, help="only the tasks of this model")
    p.set_defaults(handler=_query_workloads)

    p = qsub.add_parser("targets", parents=[formatted], help="list targets")
    p.set_defaults(handler=_query_targets)

    p = qsub.add_parser("models", parents=[formatted], help="list models with recorded tasks")
    p.set_defaults(handler=_query_models)

    p = qsub.add_parser(
        "best",
        parents=[formatted],
        help="best record per task of a model (or of one workload) on a target",
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--model", metavar="NAME", type=_model_name, help="every task of this model (recorded by kiln tune)"
    )
    which.add_argument("--workload", metavar="KEY", help="one workload (full key or unique prefix)")
    p.add_argument("--target", metavar="T", required=True, help="target key or unique prefix (cpu, cuda)")
    p.set_defaults(handler=_query_best)

    p = qsub.add_parser("records", parents=[formatted], help="records of a workload, best first")
    p.add_argument("--workload", metavar="KEY", required=True, help="full workload key or unique prefix")
    p.add_argument("--target", metavar="T", help="only this target (key or unique prefix)")
    p.add_argument(
        "--status",
        choices=(*STATUS_CHOICES, "all"),
        default="all",
        help="only records of this status (default: all; ok ones sort first by median)",
    )
    p.add_argument("--top", type=_positive_int, default=10, metavar="N", help="show N records (default 10)")
    p.set_defaults(handler=_query_records)

    p = qsub.add_parser("coverage", parents=[formatted], help="which tasks of a model are tuned on a target")
    p.add_argument("--model", metavar="NAME", type=_model_name, required=True)
    p.add_argument("--target", metavar="T", required=True, help="target key or unique prefix (cpu, cuda)")
    p.set_defaults(handler=_query_coverage)

    p = qsub.add_parser("runs", parents=[formatted], help="list tuning runs")
    p.add_argument("--model", metavar="NAME", type=_model_name, help="only runs of this model")
    p.set_defaults(handler=_query_runs)

    dbp = subparsers.add_parser(
        "db",
        help="maintain the tuning database (upgrade, export, import, merge, prune)",
        description="Maintain the tuning database.",
    )
    dsub = dbp.add_subparsers(dest="db_command", metavar="ACTION")
    dsub.required = True

    p = dsub.add_parser("upgrade", parents=[common], help="create the schema or migrate it to this Kiln's")
    p.add_argument("--revision", default="head", help="target revision (default: head)")
    p.set_defaults(handler=_db_upgrade)

    p = dsub.add_parser("info", parents=[formatted], help="schema revision and row counts")
    p.set_defaults(handler=_db_info)

    p = dsub.add_parser("export", parents=[common], help="write records as JSON Lines (FILE, FILE.gz or -)")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--workload", metavar="KEY", help="only records of this workload")
    p.add_argument("--target", metavar="T", help="only records of this target")
    p.add_argument("--status", choices=STATUS_CHOICES, help="only records of this status")
    p.set_defaults(handler=_db_export)

    p = dsub.add_parser("import", parents=[common], help="import a JSON Lines export (duplicates skipped)")
    p.add_argument("file", metavar="FILE", help="an export file (.jsonl, .jsonl.gz) or - for stdin")
    p.set_defaults(handler=_db_import)

    p = dsub.add_parser("merge", parents=[common], help="copy every record of another database into this one")
    p.add_argument("other", metavar="OTHER_URL", help="the database to read from (not modified)")
    p.set_defaults(handler=_db_merge)

    p = dsub.add_parser(
        "prune", parents=[common], help="keep only the best K ok records per workload and target"
    )
    p.add_argument("--keep-top", type=_positive_int, required=True, metavar="K")
    p.add_argument(
        "--drop-errors",
        action="store_true",
        help="also delete records that are not ok (by default they are kept, so that the tuner does not "
        "measure known-bad configs again)",
    )
    p.set_defaults(handler=_db_prune)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _model_name(value: str) -> str:
    """A model as recorded by ``kiln tune``: a built-in name, or for ``FILE.onnx`` the name the importer
    gives the graph (the file's stem)."""
    if not value.endswith(".onnx"):
        return value
    from pathlib import Path

    from compiler.frontend.onnx_common import sanitize

    return sanitize(Path(value).stem, "onnx_model")


@contextlib.contextmanager
def _opened(args: argparse.Namespace, *, create: bool = False) -> Iterator[TuningDatabase]:
    from db.database import TuningDatabase

    def show(message, category, filename, lineno, file=None, line=None):  # type: ignore[no-untyped-def]
        print(f"kiln: warning: {message}", file=sys.stderr)

    with warnings.catch_warnings():
        warnings.showwarning = show
        with TuningDatabase.open(args.db, create=create) as db:
            yield db


def _short(key: str, fmt: str) -> str:
    return key[:KEY_WIDTH] if fmt == "table" and len(key) > KEY_WIDTH else key


def _emit(rows: list[dict[str, Any]], columns: list[str], args: argparse.Namespace) -> None:
    write_rows(rows, columns, args.format, sys.stdout)


# -- kiln query ---------------------------------------------------------------------------------------


def _query_workloads(args: argparse.Namespace) -> int:
    with _opened(args) as db:
        if args.model and not db.model_tasks(args.model):
            raise _no_tasks(args.model)
        rows = [
            {
                "workload": _short(w.key, args.format),
                "kind": w.kind,
                "flops": w.flops,
                "bytes": w.bytes,
                "records": w.n_records,
                "ok": w.n_ok,
            }
            for w in db.workloads(args.model)
        ]
    _emit(rows, ["workload", "kind", "flops", "bytes", "records", "ok"], args)
    return 0


def _query_targets(args: argparse.Namespace) -> int:
    with _opened(args) as db:
        rows = [{"target": k, "info": db.target_info(k)} for k in db.target_keys()]
    _emit(rows, ["target", "info"], args)
    return 0


def _query_models(args: argparse.Namespace) -> int:
    with _opened(args) as db:
        rows = [{"model": n, "model_hash": h, "tasks": t} for n, h, t in db.models()]
    _emit(rows, ["model", "model_hash", "tasks"], args)
    return 0


def _no_tasks(model: str) -> Exception:
    from db.errors import UnknownKeyError

    return UnknownKeyError(f"no tasks recorded for model {model!r}; run `kiln tune --model {model}` first")


def _knob_validator(db, target_key: str):
    """Validate each record's config against its sketch's knob space (rebuilt from the stored workload),
    so `kiln query best` shows exactly what `kiln compile --db` would apply."""
    from tuner.records import workload_validator

    return workload_validator(db, target_key)


def _query_best(args: argparse.Namespace) -> int:
    with _opened(args) as db:
        target = db.resolve_target(args.target)
        if args.model:
            tasks = db.model_tasks(args.model)
            if not tasks:
                raise _no_tasks(args.model)
        else:
            tasks = [(db.resolve_workload(args.workload), 1.0)]
        best = db.best_many([k for k, _ in tasks], target, validate=_knob_validator(db, target))
        kinds = {w.key: w.kind for w in db.workloads(args.model)} if args.model else {}
    rows = []
    for key, weight in tasks:
        rec = best.get(key)
        rows.append(
            {
                "workload": _short(key, args.format),
                "kind": kinds.get(key),
                "weight": weight,
                "sketch": rec.sketch if rec else None,
                "version": rec.sketch_version if rec else None,
                "median_us": rec.median_us if rec else None,
                "config": rec.config if rec else None,
                "record": rec.id if rec else None,
            }
        )
    columns = ["workload", "kind", "weight", "sketch", "version", "median_us", "config", "record"]
    if not args.model:
        columns.remove("kind")
        columns.remove("weight")
    _emit(rows, columns, args)
    if args.format == "table":
        tuned = sum(1 for key, _ in tasks if key in best)
        print(f"\n{tuned}/{len(tasks)} tasks tuned on {target}")
    return 0


def _query_records(args: argparse.Namespace) -> int:
    with _opened(args) as db:
        workload = db.resolve_workload(args.workload)
        target = db.resolve_target(args.target) if args.target else None
        status = None if args.status == "all" else args.status
        found = db.find_records(workload, target, status, args.top)
    rows = [
        {
            "id": r.id,
            "workload": _short(r.workload_key, args.format),
            "target": r.target_key,
            "sketch": r.sketch,
            "version": r.sketch_version,
            "status": r.status,
            "median_us": r.median_us,
            "repeats": len(r.latencies_us or ()),
            "config": r.config,
            "created_at": r.created_at,
            "host": r.host,
            "error": r.error,
        }
        for r in found
    ]
    columns = ["id", "workload", "target", "sketch", "version", "status", "median_us", "repeats", "config"]
    columns += ["created_at", "host", "error"]
    _emit(rows, columns, args)
    return 0


def _query_coverage(args: argparse.Namespace) -> int:
    from db.errors import UnknownKeyError
    from db.status import Status

    with _opened(args) as db:
        target = db.resolve_target(args.target)
        try:
            coverage = db.coverage_rows(args.model, target)
        except UnknownKeyError:
            raise _no_tasks(args.model) from None
    rows = [
        {
            "workload": _short(c.workload_key, args.format),
            "kind": c.kind,
            "weight": c.weight,
            "tuned": c.tuned,
            "best_median_us": c.best_median_us,
            "records": c.n_records,
            **c.by_status,
        }
        for c in coverage
    ]
    columns = ["workload", "kind", "weight", "tuned", "best_median_us", "records", *(s.value for s in Status)]
    _emit(rows, columns, args)
    if args.format == "table":
        total = sum(c.weight for c in coverage) or 1.0
        tuned_weight = sum(c.weight for c in coverage if c.tuned)
        n_tuned = sum(1 for c in coverage if c.tuned)
        print(
            f"\n{args.model} on {target}: {n_tuned}/{len(coverage)} tasks tuned "
            f"({100.0 * tuned_weight / total:.0f}% of the weighted tasks)"
        )
    return 0


def _query_runs(args: argparse.Namespace) -> int:
    with _opened(args) as db:
        runs = db.runs(args.model)
    rows = [
        {
            "id": r.id,
            "model": r.model_name,
            "target": r.target_key,
            "host": r.host,
            "started_at": r.started_at,
            "finished_at": r.finished_at,
            "budget": r.budget,
            "command": r.command_line,
        }
        for r in runs
    ]
    _emit(rows, ["id", "model", "target", "host", "started_at", "finished_at", "budget", "command"], args)
    return 0


# -- kiln db ------------------------------------------------------------------------------------------


def _db_upgrade(args: argparse.Namespace) -> int:
    from db import migrate
    from db.engine import display_url, ensure_wal, make_engine, resolve_url
    from db.errors import ReadOnlyDatabaseError

    url = resolve_url(args.db)
    engine = make_engine(url, create=True)
    try:
        with contextlib.suppress(ReadOnlyDatabaseError):
            ensure_wal(engine, url)
        before, after = migrate.upgrade(engine, url, args.revision)
    finally:
        engine.dispose()
    if before == after:
        print(f"{display_url(url)}: schema already at revision {after}")
    elif before is None:
        print(f"{display_url(url)}: created the tuning-database schema at revision {after}")
    else:
        print(f"{display_url(url)}: upgraded the schema from revision {before} to {after}")
    return 0


def _db_info(args: argparse.Namespace) -> int:
    from db.status import Status

    with _opened(args) as db:
        rows: list[dict[str, Any]] = [
            {"item": "url", "value": db.url},
            {"item": "schema revision", "value": db.schema_revision()},
            {"item": "workloads", "value": len(db.workloads())},
            {"item": "targets", "value": len(db.target_keys())},
            {"item": "records", "value": db.count_records()},
        ]
        rows += [{"item": f"records {s.value}", "value": db.count_records(s)} for s in Status]
    _emit(rows, ["item", "value"], args)
    return 0


def _db_export(args: argparse.Namespace) -> int:
    with _opened(args) as db:
        workload = db.resolve_workload(args.workload) if args.workload else None
        target = db.resolve_target(args.target) if args.target else None
        dest = sys.stdout if args.file == "-" else args.file
        count = db.export_jsonl(dest, workload_key=workload, target_key=target, status=args.status)
        shown = db.url
    print(f"exported {count} records from {shown} to {args.file}", file=sys.stderr)
    return 0


def _db_import(args: argparse.Namespace) -> int:
    with _opened(args, create=True) as db:
        stats = db.import_jsonl(sys.stdin if args.file == "-" else args.file)
        shown = db.url
    print(
        f"imported {args.file} into {shown}: {stats.added} records added, "
        f"{stats.skipped_duplicates} duplicates skipped ({stats.workloads_added} workloads, "
        f"{stats.targets_added} targets, {stats.runs_added} runs added)"
    )
    return 0


def _db_merge(args: argparse.Namespace) -> int:
    from db.engine import display_url

    with _opened(args, create=True) as db:
        stats = db.merge_from(args.other)
        shown = db.url
    print(
        f"merged {display_url(args.other)} into {shown}: {stats.added} records added, "
        f"{stats.skipped_duplicates} duplicates skipped"
    )
    return 0


def _db_prune(args: argparse.Namespace) -> int:
    with _opened(args) as db:
        deleted = db.prune(args.keep_top, keep_errors=not args.drop_errors)
        left = db.count_records()
        shown = db.url
    kept = "error records dropped" if args.drop_errors else "error records kept"
    print(f"pruned {shown}: deleted {deleted} records, {left} left (top {args.keep_top} ok kept, {kept})")
    return 0
