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

    p = dsub.add_parser("import", parents=[common], help="import a JSON Lines export (duplicates skipped)")
    p.add_argument("file", metavar="FILE", help="an export file (.jsonl, .jsonl.gz) or - for stdin")
    p.set_defaults(handler=_db_import)

    p = dsub.add_parser("merge", parents=[common], help="copy every record of another database into this one")
    p.add_argument("other", metavar="OTHER_URL", help="the database to read from (not modified)")
    p.set_defaults(handler=_db_merge)

    p = dsub.add_parser(
        "prune", parents=[common], help="keep only the best K ok records per workload and target"
    )
    p.add_argument("--keep-top", type=positive_int, required=True, metavar="K")
    p.add_argument(
        "--drop-errors",
        action="store_true",
        help="also delete records that are not ok (by default they are kept, so that the tuner does not "
        "measure known-bad configs again)",
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
        count = db.export_jsonl(dest, workload_key=workload, target_key=target, status=args.status)
        shown = db.url
    print(f"exported {count} records from {shown} to {args.file}", file=sys.stderr)
    return 0


def _db_import(args: argparse.Namespace) -> int:
    with open_database(args, create=True) as db:
        stats = db.import_jsonl(sys.stdin if args.file == "-" else args.file)
        shown = db.url
    print(
        f"imported {args.file} into {shown}: {stats.added} records added, "
        f"{stats.skipped_duplicates} duplicates skipped ({stats.workloads_added} workloads, "
        f"{stats.targets_added} targets, {stats.runs_added} runs added)"
    )
    return 0


def _db_merge(args: argparse.Namespace) -> int:
    with open_database(args, create=True) as db:
        stats = db.merge_from(args.other)
        shown = db.url
    print(
        f"merged {display_url(args.other)} into {shown}: {stats.added} records added, "
        f"{stats.skipped_duplicates} duplicates skipped"
    )
    return 0


def _db_prune(args: argparse.Namespace) -> int:
    with open_database(args) as db:
        deleted = db.prune(args.keep_top, keep_errors=not args.drop_errors)
        left = db.count_records()
        shown = db.url
    kept = "error records dropped" if args.drop_errors else "error records kept"
    print(f"pruned {shown}: deleted {deleted} records, {left} left (top {args.keep_top} ok kept, {kept})")
    return 0
