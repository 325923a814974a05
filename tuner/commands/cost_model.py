"""`kiln cost-model eval | train | features`: evaluate, train and inspect the learned cost model.

``eval`` cross-validates by workload on a tuning database's records of one target (leave-one-workload-out
by default) and prints Spearman rank correlation, top-1 and top-5 scores per held-out workload, for the
chosen model and a baseline, and writes a PNG. ``train`` fits a model on every record of a target and saves
it (``.npz``, no pickle). ``features`` lists the feature names. Features computed for records are cached in
the database (by feature version), so a second evaluation is much faster than the first.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from compiler.errors import KilnError
from cost_model.dataset import load_dataset
from cost_model.evaluate import cross_validate, plot
from cost_model.features import FEATURE_NAMES, FEATURE_VERSION
from cost_model.model import create_model
from tuner.commands.common import DEFAULT_DB_HELP, print_table


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "cost-model",
        help="evaluate, train and inspect the learned cost model",
        description="Evaluate the cost model on held-out workloads of a tuning database, train one and "
        "save it, or list its features.",
    )
    sub = p.add_subparsers(dest="cost_model_command", metavar="WHAT")
    sub.required = True

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", default=None, help=f"tuning database URL ({DEFAULT_DB_HELP})")
    common.add_argument("--target", required=True, help="target key or unique prefix (cpu, cuda/sm_90)")
    common.add_argument("--seed", type=int, default=0)

    e = sub.add_parser("eval", parents=[common], help="held-out Spearman, top-1 and top-5 per workload")
    e.add_argument("--model", choices=("gbdt", "analytic", "random"), default="gbdt")
    e.add_argument("--baseline", choices=("analytic", "random", "none"), default="analytic")
    e.add_argument("--folds", type=int, default=0, help="k folds of workloads (0: leave one workload out)")
    e.add_argument("--min-records", type=int, default=5, help="skip workloads with fewer ok records")
    e.add_argument("--plot", default="cost_model_eval.png", help="PNG to write ('' for none)")
    e.add_argument("--format", choices=("table", "json"), default="table")
    e.set_defaults(handler=run_eval)

    t = sub.add_parser("train", parents=[common], help="train on every record of a target and save")
    t.add_argument("--model", choices=("gbdt",), default="gbdt")
    t.add_argument("--out", required=True, help="model file to write (.npz)")
    t.set_defaults(handler=run_train)

    f = sub.add_parser("features", help="list the feature names (and the feature version)")
    f.set_defaults(handler=run_features)


def _load(args: argparse.Namespace):
    from db.database import TuningDatabase  # SQLAlchemy: only when a command opens a database

    db = TuningDatabase.open(args.db, create=False)
    target = db.resolve_target(args.target)

    def progress(i: int, n: int) -> None:
        if n > 200 and i % 500 == 0 and sys.stderr.isatty():
            print(f"\rfeatures {i}/{n}", end="", file=sys.stderr, flush=True)

    data = load_dataset(db, target, progress=progress)
    if not len(data):
        raise KilnError(f"no usable records of target {target} in {db.url}")
    return db, target, data


def run_eval(args: argparse.Namespace) -> int:
    _db, target, data = _load(args)
    names = [args.model] + ([args.baseline] if args.baseline not in ("none", args.model) else [])
    results = [
        cross_validate(data, lambda n=n: create_model(n, seed=args.seed), n, args.folds, args.min_records)
        for n in names
    ]
    if not results[0].rows:
        raise KilnError(
            f"no workload of {target} has {args.min_records} ok records to evaluate on "
            f"({len(set(data.workloads))} workloads, {len(data)} records)"
        )
    if args.format == "json":
        out = {
            r.model: {
                "folds": r.folds,
                "workloads": [vars(x) for x in r.rows],
                "mean": {m: r.mean(m) for m in ("spearman", "top1", "top5")},
            }
            for r in results
        }
        print(
            json.dumps(out, indent=2, default=lambda v: None if isinstance(v, float) and math.isnan(v) else v)
        )
    else:
        _print_table(results, target, len(data), data.computed)
    if args.plot:
        path = plot(results, args.plot, f"{target}: {results[0].folds}, {len(data)} records")
        print(f"plot: {path}")
    return 0


def _fmt(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.3f}"


def _print_table(results, target: str, n: int, computed: int) -> None:
    cols = ["workload", "kind", "records"]
    for r in results:
        cols += [f"{r.model} spearman", f"{r.model} top1", f"{r.model} top5"]
    by = [{x.workload: x for x in r.rows} for r in results]
    rows = []
    for x in results[0].rows:
        row = {"workload": x.workload[:16], "kind": x.kind, "records": x.n}
        for r, b in zip(results, by):
            y = b.get(x.workload)
            for m in ("spearman", "top1", "top5"):
                row[f"{r.model} {m}"] = _fmt(getattr(y, m)) if y else "-"
        rows.append(row)
    mean = {"workload": "mean", "kind": "", "records": sum(x.n for x in results[0].rows)}
    for r in results:
        for m in ("spearman", "top1", "top5"):
            mean[f"{r.model} {m}"] = _fmt(r.mean(m))
    rows.append(mean)
    title = f"cost model on {target} ({results[0].folds}; {n} records, {computed} feature vectors computed)"
    print_table(rows, cols, title=title)


def run_train(args: argparse.Namespace) -> int:
    _db, target, data = _load(args)
    model = create_model(args.model, seed=args.seed)
    model.update(data.x, data.latencies, data.workloads)
    path = model.save(args.out)
    print(f"trained {args.model} on {len(data)} records of {len(set(data.workloads))} workloads of {target}")
    print(f"saved: {path}")
    return 0


def run_features(args: argparse.Namespace) -> int:
    print(f"feature version {FEATURE_VERSION}: {len(FEATURE_NAMES)} features")
    for i, name in enumerate(FEATURE_NAMES):
        print(f"{i:4d}  {name}")
    return 0
