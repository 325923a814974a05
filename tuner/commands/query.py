"""`kiln query ...`: read the tuning database from the command line (workloads, best records, records,
coverage of a model, tuning curves, fusion plans of a model's regions, targets, models, runs).

Every command takes ``--db URL`` (default: env ``KILN_DB``, then ``sqlite:///kiln.db``); ``--target`` takes a
full target key or a prefix such as ``cpu`` or ``cuda/sm_90`` that names exactly one target in the database.
The library functions these commands call live in :mod:`db` (``TuningDatabase``); SQLAlchemy is imported
only when a command opens a database, so ``kiln --help`` stays fast.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from compiler.errors import KilnError
from compiler.frontend.onnx_common import sanitize
from db.errors import UnknownKeyError
from db.status import Status
from tuner.commands.common import STATUS_CHOICES, database_parents, emit_rows, open_database, positive_int
from tuner.records import workload_validator

KEY_WIDTH = 16  # workload keys are shown by prefix in tables; every command accepts a unique prefix


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``query`` command group to the ``kiln`` parser."""
    _, formatted = database_parents()
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
        help="the record compile applies per task of a model (or of one workload) on a target",
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
    p.add_argument("--top", type=positive_int, default=10, metavar="N", help="show N records (default 10)")
    p.set_defaults(handler=_query_records)

    p = qsub.add_parser("coverage", parents=[formatted], help="which tasks of a model are tuned on a target")
    p.add_argument("--model", metavar="NAME", type=_model_name, required=True)
    p.add_argument("--target", metavar="T", required=True, help="target key or unique prefix (cpu, cuda)")
    p.set_defaults(handler=_query_coverage)

    p = qsub.add_parser(
        "curve",
        parents=[formatted],
        help="tuning curves: best-so-far latency per task of a model over its trials",
    )
    p.add_argument("--model", metavar="NAME", type=_model_name, required=True)
    p.add_argument("--target", metavar="T", help="target key or unique prefix (default: the only one used)")
    p.add_argument("--plot", metavar="FILE.png", help="draw the curves into this file (needs matplotlib)")
    p.set_defaults(handler=_query_curve)

    p = qsub.add_parser(
        "plans",
        parents=[formatted],
        help="the stored fusion plan of each region of a model on a target: edges flipped, latency vs rules "
        "(sums of kernels; whole model: the compiled model timed under each, on the CPU)",
    )
    p.add_argument("--model", metavar="NAME", required=True, help="a built-in model name or an ONNX file")
    p.add_argument("--target", metavar="T", required=True, help="target key or unique prefix (cpu, cuda)")
    p.set_defaults(handler=_query_plans)

    p = qsub.add_parser("runs", parents=[formatted], help="list tuning runs")
    p.add_argument("--model", metavar="NAME", type=_model_name, help="only runs of this model")
    p.set_defaults(handler=_query_runs)


def _model_name(value: str) -> str:
    """A model as recorded by ``kiln tune``: a built-in name, or for ``FILE.onnx`` the name the importer
    gives the graph (the file's stem)."""
    if not value.endswith(".onnx"):
        return value
    return sanitize(Path(value).stem, "onnx_model")


def _short(key: str, fmt: str) -> str:
    return key[:KEY_WIDTH] if fmt == "table" and len(key) > KEY_WIDTH else key


def _query_workloads(args: argparse.Namespace) -> int:
    with open_database(args) as db:
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
    emit_rows(rows, ["workload", "kind", "flops", "bytes", "records", "ok"], args)
    return 0


def _query_targets(args: argparse.Namespace) -> int:
    with open_database(args) as db:
        rows = [{"target": k, "info": db.target_info(k)} for k in db.target_keys()]
    emit_rows(rows, ["target", "info"], args)
    return 0


def _query_models(args: argparse.Namespace) -> int:
    with open_database(args) as db:
        rows = [{"model": n, "model_hash": h, "tasks": t} for n, h, t in db.models()]
    emit_rows(rows, ["model", "model_hash", "tasks"], args)
    return 0


def _no_tasks(model: str) -> Exception:
    return UnknownKeyError(f"no tasks recorded for model {model!r}; run `kiln tune --model {model}` first")


def _query_best(args: argparse.Namespace) -> int:
    with open_database(args) as db:
        target = db.resolve_target(args.target)
        if args.model:
            tasks = db.model_tasks(args.model)
            if not tasks:
                raise _no_tasks(args.model)
        else:
            tasks = [(db.resolve_workload(args.workload), 1.0)]
        keys = [k for k, _ in tasks]
        best = db.best_many(keys, target, validate=workload_validator(db, target))
        confirmed = db.latest_confirmations(list(best), target)
        chosen = _selections(db, keys, target)
        kinds = {w.key: w.kind for w in db.workloads(args.model)} if args.model else {}
    rows = []
    for key, weight in tasks:
        sel = chosen.get(key)
        if sel is not None:  # a Kiln workload: what compile applies (db.selection)
            rec, vs_default = sel.record, _standing_text(sel)
        else:  # not a Kiln workload (imported from elsewhere): its lowest median
            rec = best.get(key)
            vs_default = _vs_default(rec, confirmed.get(key)) if rec else None
        rows.append(
            {
                "workload": _short(key, args.format),
                "kind": kinds.get(key),
                "weight": weight,
                "sketch": rec.sketch if rec else None,
                "version": rec.sketch_version if rec else None,
                "median_us": rec.median_us if rec else None,
                "vs_default": vs_default,
                "config": rec.config if rec else None,
                "record": rec.id if rec else None,
            }
        )
    columns = [
        "workload",
        "kind",
        "weight",
        "sketch",
        "version",
        "median_us",
        "vs_default",
        "config",
        "record",
    ]
    if not args.model:
        columns.remove("kind")
        columns.remove("weight")
    emit_rows(rows, columns, args)
    if args.format == "table":
        tuned = sum(1 for key, _ in tasks if key in best)
        print(f"\n{tuned}/{len(tasks)} tasks tuned on {target}")
    return 0


def _selections(db, keys: list[str], target_key: str) -> dict:  # type: ignore[no-untyped-def]
    """The selection (:meth:`~db.database.TuningDatabase.select_record`) of each Kiln workload in ``keys``;
    workloads whose canonical form is not a Kiln group are absent."""
    from compiler.backends import sketch_for
    from compiler.fusion import group_from_workload
    from compiler.target import Target
    from tuner.records import validator_for

    target = Target.parse(target_key)
    out = {}
    for key in keys:
        try:
            group = group_from_workload(db.workload_canonical(key))
            default = sketch_for(group, target).default(group, target)
        except KilnError:
            continue
        out[key] = db.select_record(key, target_key, default, validate=validator_for(group, target))
    return out


def _standing_text(sel) -> str | None:  # type: ignore[no-untyped-def]
    """``vs_default`` of a selection: the confirmed speed-up, ``unconfirmed``, ``default`` (the default config
    measured best), ``default kept (...)`` (a record confirmed not faster), or None without records."""
    from db.selection import CONFIRMED, DEFAULT_IS_BEST, KEPT_DEFAULT, UNCONFIRMED
    from tuner.confirm import speedup_text

    if sel.standing == CONFIRMED:
        return speedup_text(sel.confirmation)
    if sel.standing == UNCONFIRMED:
        return "unconfirmed"
    if sel.standing == DEFAULT_IS_BEST:
        return "default"
    if sel.standing == KEPT_DEFAULT:
        if sel.confirmation is not None:
            return f"default kept (confirmed {speedup_text(sel.confirmation)}: not faster)"
        return "default kept (its config had a failed measurement)"
    return None


def _vs_default(rec, conf) -> str:  # type: ignore[no-untyped-def]
    """The record's speed-up over the default from the confirmation of its config (``1.42x (±3%)``), or
    ``unconfirmed``: a speed-up from the search's single measurements is never shown as one."""
    from tuner.confirm import speedup_text

    same = (
        conf is not None
        and conf.sketch == rec.sketch
        and conf.sketch_version == rec.sketch_version
        and conf.config == rec.config
    )
    return speedup_text(conf if same else None)


def _query_records(args: argparse.Namespace) -> int:
    with open_database(args) as db:
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
    emit_rows(rows, columns, args)
    return 0


def _query_coverage(args: argparse.Namespace) -> int:
    with open_database(args) as db:
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
    emit_rows(rows, columns, args)
    if args.format == "table":
        total = sum(c.weight for c in coverage) or 1.0
        tuned_weight = sum(c.weight for c in coverage if c.tuned)
        n_tuned = sum(1 for c in coverage if c.tuned)
        print(
            f"\n{args.model} on {target}: {n_tuned}/{len(coverage)} tasks tuned "
            f"({100.0 * tuned_weight / total:.0f}% of the weighted tasks)"
        )
    return 0


def _query_curve(args: argparse.Namespace) -> int:
    from tuner.curves import CURVE_COLUMNS, curve_rows, model_curves, plot_curves

    with open_database(args) as db:
        tasks = db.model_tasks(args.model)
        if not tasks:
            raise _no_tasks(args.model)
        if args.target:
            target = db.resolve_target(args.target)
        else:
            used = sorted({r.target_key for key, _ in tasks for r in db.find_records(key)})
            if len(used) != 1:
                found = ", ".join(used) or "none"
                raise KilnError(
                    f"{args.model} has records on {len(used)} targets ({found}); name one with --target"
                )
            (target,) = used
        curves = model_curves(db, args.model, target)
    if args.plot:
        path = plot_curves(curves, args.plot, f"{args.model} on {target}")
        print(f"tuning curves of {len(curves)} tasks written to {path}")
        return 0
    rows = curve_rows(curves)
    for r in rows:
        r["workload"] = _short(r["workload"], args.format)
    emit_rows(rows, CURVE_COLUMNS, args)
    return 0


def _query_plans(args: argparse.Namespace) -> int:
    from compiler.frontend import load_model
    from compiler.passes import optimize
    from compiler.target import Target
    from tuner.plan_search import database_plan, target_regions

    graph = optimize(load_model(args.model))
    with open_database(args) as db:
        key = db.resolve_target(args.target)
        target = Target.from_json(db.target_info(key))
        regions = target_regions(graph, target)
        report = {line["region"]: line for line in database_plan(db, graph, target).lines}
    rows = []
    for r in regions:
        line = report.get(r.index)
        latency = line["latency_us"] if line else None
        rule = line["rule_latency_us"] if line else None
        rows.append(
            {
                "region": r.index,
                "region_key": _short(r.key, args.format),
                "edges": len(r.edges),
                "flipped": ", ".join(r.describe_edge(e) for e in line["flipped"]) if line else None,
                "latency_us": latency,
                "rules_us": rule,
                "speedup": rule / latency if latency and rule else None,
                "whole_us": line.get("whole_us") if line else None,
                "rules_whole_us": line.get("rule_whole_us") if line else None,
                "status": line["status"] if line else "not searched",
                "why": line["why"] if line else None,
            }
        )
    columns = [
        "region",
        "region_key",
        "edges",
        "flipped",
        "latency_us",
        "rules_us",
        "speedup",
        "whole_us",
        "rules_whole_us",
        "status",
        "why",
    ]
    emit_rows(rows, columns, args)
    if args.format == "table":
        applied = sum(1 for row in rows if row["status"] == "applied")
        print(f"\n{applied}/{len(rows)} regions of {graph.name} use a searched fusion plan on {key}")
    return 0


def _query_runs(args: argparse.Namespace) -> int:
    with open_database(args) as db:
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
    emit_rows(rows, ["id", "model", "target", "host", "started_at", "finished_at", "budget", "command"], args)
    return 0
