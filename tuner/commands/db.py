"""`kiln db ...`: maintain the tuning database from the command line (upgrade, info, export, import,
merge, prune).

Every command takes ``--db URL`` (default: env ``KILN_DB``, then ``sqlite:///kiln.db``). The work is done by
the library (:mod:`db.migrate`, :mod:`db.engine`, ``TuningDatabase``), which imports SQLAlchemy and alembic
only when a command runs, so ``kiln --help`` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

from db import migrate
from db.engine import display_url, ensure_wal, make_engine, resolve_url
from db.errors import ReadOnlyDatabaseError
from db.status import Status
from tuner.commands.common import STATUS_CHOICES, database_parents, emit_rows, open_database, positive_int


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``db`` command group to the ``kiln`` parser."""
    common, formatted = database_parents()
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

    strict_help = "abort on the first malformed line or row (nothing is written) instead of skipping it"
    p = dsub.add_parser("import", parents=[common], help="import a JSON Lines export (duplicates skipped)")
    p.add_argument("file", metavar="FILE", help="an export file (.jsonl, .jsonl.gz) or - for stdin")
    p.add_argument("--strict", action="store_true", help=strict_help)
    p.set_defaults(handler=_db_import)

    p = dsub.add_parser("merge", parents=[common], help="copy every record of another database into this one")
    p.add_argument("other", metavar="OTHER_URL", help="the database to read from (not modified)")
    p.add_argument("--strict", action="store_true", help=strict_help)
    p.set_defaults(handler=_db_merge)

    p = dsub.add_parser(
        "prune",
        parents=[formatted],
        help="keep only the best K valid ok records per workload and target",
        description="Keep the best K ok records per (workload, target) whose configs are valid for their "
        "sketch's knob space; records that fail that check never count among the K and are left alone.",
    )
    p.add_argument("--keep-top", type=positive_int, required=True, metavar="K")
    p.add_argument(
        "--drop-errors",
        action="store_true",
        help="also delete records that are not ok (by default they are kept, so that the tuner does not "
        "measure known-bad configs again)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="list the records that would be deleted; delete nothing"
    )
    p.set_defaults(handler=_db_prune)


def _db_upgrade(args: argparse.Namespace) -> int:

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
    with open_database(args) as db:
        rows: list[dict[str, Any]] = [
            {"item": "url", "value": db.url},
            {"item": "schema revision", "value": db.schema_revision()},
            {"item": "workloads", "value": len(db.workloads())},
            {"item": "targets", "value": len(db.target_keys())},
            {"item": "records", "value": db.count_records()},
        ]
        rows += [{"item": f"records {s.value}", "value": db.count_records(s)} for s in Status]
    emit_rows(rows, ["item", "value"], args)
    return 0


def _db_export(args: argparse.Namespace) -> int:
    with open_database(args) as db:
        workload = db.resolve_workload(args.workload) if args.workload else None
        target = db.resolve_target(args.target) if args.target else None
        dest = sys.stdout if args.file == "-" else args.file
        skipped: list[str] = []
        count = db.export_jsonl(
            dest, workload_key=workload, target_key=target, status=args.status, skipped=skipped
        )
        shown = db.url
    bad = f"; {len(skipped)} malformed rows skipped" if skipped else ""
    print(f"exported {count} records from {shown} to {args.file}{bad}", file=sys.stderr)
    _report_bad(skipped, len(skipped))
    return 0


def _db_import(args: argparse.Namespace) -> int:
    with open_database(args, create=True) as db:
        stats = db.import_jsonl(sys.stdin if args.file == "-" else args.file, strict=args.strict)
        shown = db.url
    print(
        f"imported {args.file} into {shown}: {stats.added} records added, "
        f"{stats.skipped_duplicates} duplicates skipped, {stats.skipped_bad} malformed lines skipped "
        f"({stats.workloads_added} workloads, {stats.targets_added} targets, {stats.runs_added} runs, "
        f"{stats.confirmations_added} confirmations added)"
    )
    _report_bad(stats.problems, stats.skipped_bad)
    return 0


def _db_merge(args: argparse.Namespace) -> int:
    with open_database(args, create=True) as db:
        stats = db.merge_from(args.other, strict=args.strict)
        shown = db.url
    print(
        f"merged {display_url(args.other)} into {shown}: {stats.added} records added, "
        f"{stats.skipped_duplicates} duplicates skipped, {stats.skipped_bad} malformed rows skipped, "
        f"{stats.confirmations_added} confirmations added"
    )
    _report_bad(stats.problems, stats.skipped_bad)
    return 0


def _report_bad(problems: Sequence[str], count: int, shown: int = 10) -> None:
    """Name the first skipped lines or rows on stderr (the data was kept; these were not)."""
    for problem in problems[:shown]:
        print(f"  skipped: {problem}", file=sys.stderr)
    if count > min(shown, len(problems)):
        print(f"  ... and {count - min(shown, len(problems))} more", file=sys.stderr)


def _db_prune(args: argparse.Namespace) -> int:
    with open_database(args) as db:
        plan = db.prune_plan(args.keep_top, keep_errors=not args.drop_errors, validate=_any_validator(db))
        deleted = 0 if args.dry_run else db.delete_records([r.id for r in plan.doomed])
        left = db.count_records()
        shown = db.url
    kept = "error records dropped" if args.drop_errors else "error records kept"
    if args.dry_run:
        rows = [
            {
                "id": r.id,
                "workload": r.workload_key[:16] if args.format == "table" else r.workload_key,
                "target": r.target_key,
                "status": r.status,
                "median_us": r.median_us,
                "config": r.config,
            }
            for r in plan.doomed
        ]
        emit_rows(rows, ["id", "workload", "target", "status", "median_us", "config"], args)
        print(
            f"dry run on {shown}: would delete {len(plan.doomed)} of {left} records "
            f"(top {args.keep_top} valid ok kept, {kept}); nothing deleted",
            file=sys.stderr,
        )
    else:
        print(
            f"pruned {shown}: deleted {deleted} records, {left} left "
            f"(top {args.keep_top} valid ok kept, {kept})"
        )
    for rid, why in plan.left_alone[:5]:
        print(f"  left alone: record {rid} ({why})", file=sys.stderr)
    if plan.left_alone:
        more = len(plan.left_alone) - 5
        print(
            f"{len(plan.left_alone)} invalid ok records left alone "
            f"(never counted among the top {args.keep_top})"
            + (f"; {more} more not listed" if more > 0 else ""),
            file=sys.stderr,
        )
    return 0


def _any_validator(db: Any) -> Callable[[Any], str | None]:
    """The sketch's knob-space check for a record of any workload on any target stored in ``db``."""
    from tuner.records import workload_validator

    by_target: dict[str, Callable[[Any], str | None]] = {}

    def validate(record: Any) -> str | None:
        if record.target_key not in by_target:
            by_target[record.target_key] = workload_validator(db, record.target_key)
        return by_target[record.target_key](record)

    return validate
