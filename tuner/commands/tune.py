"""`kiln tune`: measure candidates of every task of a model and record them in the tuning database."""

from __future__ import annotations

import argparse
import re
import sys

from compiler.errors import KilnError
from tuner.commands.common import add_model_arg, load_model_arg, print_table


def parse_duration(text: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not m:
        raise KilnError(f"--time-budget {text!r} must look like 90s, 10m or 1h")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "tune",
        help="tune a model's kernels and record every measurement",
        description="Search each kernel's schedule space with Optuna, measuring candidates on the target and "
        "committing every result to the tuning database. Rerunning continues where it stopped.",
    )
    add_model_arg(p)
    p.add_argument("--target", default="cpu", help="cpu (this host) or cuda")
    budget = p.add_mutually_exclusive_group(required=True)
    budget.add_argument("--trials", type=int, help="total measured candidates across tasks")
    budget.add_argument("--time-budget", help="wall-clock budget, e.g. 90s, 10m, 1h")
    p.add_argument(
        "--db", default=None, help="tuning database URL (default: $KILN_DB, else sqlite:///kiln.db)"
    )
    p.add_argument("--tasks", nargs="*", help="only these tasks (indices or workload-key prefixes)")
    p.add_argument("--sampler", choices=("tpe", "cmaes", "random", "gp"), default="tpe")
    p.add_argument("--batch", type=int, default=8, help="candidates measured per round (default 8)")
    p.add_argument(
        "--early-stop",
        type=int,
        default=64,
        help="stop a task after this many measured trials without a 1%% improvement (0: never)",
    )
    p.add_argument(
        "--cost-model",
        choices=("gbdt", "analytic", "none"),
        default="none",
        help="rank asked candidates with a cost model and measure only the best (plus a few random)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=None, help="build processes (default: cores)")
    p.add_argument("--no-summary", action="store_true", help="skip the whole-model default vs tuned timing")
    p.set_defaults(handler=run_tune)


def _select(tasks, wanted):
    if not wanted:
        return tasks
    out = []
    for w in wanted:
        hits = [t for i, t in enumerate(tasks) if str(i) == w or t.workload_key.startswith(w)]
        if not hits:
            raise KilnError(
                f"--tasks {w!r} matches no task; tasks: "
                + ", ".join(f"{i}={t.workload_key[:10]}" for i, t in enumerate(tasks))
            )
        out += [t for t in hits if t not in out]
    return out


def run_tune(args: argparse.Namespace) -> int:
    from compiler.target import Target
    from db.database import TuningDatabase
    from tuner.measure import create_measurer
    from tuner.progress import LiveProgress
    from tuner.scheduler import Budget, TaskScheduler
    from tuner.search import TaskTuner
    from tuner.storage import optuna_storage
    from tuner.task import extract_tasks

    graph = load_model_arg(args)
    target = Target.parse(args.target)
    if args.trials is not None and args.trials < 1:
        raise KilnError("--trials must be at least 1")
    seconds = parse_duration(args.time_budget) if args.time_budget else None
    budget = Budget(args.trials, seconds)
    tasks = _select(extract_tasks(graph, target), args.tasks)
    db = TuningDatabase.open(args.db)
    db.commit_target(target.key, target.to_json())
    for t in tasks:
        db.commit_workload(t.workload_key, t.group.canonical(), t.kind, t.flops, t.bytes)
    model_hash = graph.structural_hash()
    if not args.tasks:
        db.register_model_tasks(graph.name, model_hash, [(t.workload_key, t.weight) for t in tasks])
    run_id = db.begin_run(
        graph.name,
        model_hash,
        target.key,
        {"trials": args.trials, "seconds": seconds, "sampler": args.sampler},
        " ".join(["kiln", *sys.argv[1:]]),
    )
    storage = optuna_storage(db.url)
    candidate_filter, oversample = None, 1
    if args.cost_model != "none":
        from tuner.cost_filter import make_candidate_filter

        candidate_filter, oversample = make_candidate_filter(args.cost_model, db, target, seed=args.seed)
    measurer = create_measurer(target, workers=args.workers)
    budget_text = f"{args.trials} trials" if args.trials else f"{args.time_budget}"
    interrupted = False
    try:
        tuners = [
            TaskTuner(
                t,
                db,
                measurer,
                storage,
                args.sampler,
                args.seed + i,
                args.early_stop or None,
                run_id,
                candidate_filter,
                oversample,
            )
            for i, t in enumerate(tasks)
        ]
        with LiveProgress(tuners, budget_text) as progress:
            try:
                TaskScheduler(tuners, budget, args.batch, seed=args.seed, on_round=progress.update).run()
            except KeyboardInterrupt:
                interrupted = True
    finally:
        measurer.close()
        db.finish_run(run_id)
    from tuner.progress import COLUMNS, task_rows

    print_table(task_rows(tuners), COLUMNS, title=f"kiln tune {graph.name} on {target.key}")
    if interrupted:
        print("interrupted: every committed result is kept; rerun the same command to continue")
        return 130
    if not args.no_summary and not args.tasks:
        _whole_model_summary(graph, target, db)
    return 0


def _whole_model_summary(graph, target, db) -> None:
    """Whole-model latency, default vs tuned, measured on compiled models."""
    from compiler.reference import random_inputs
    from tuner.api import compile as kiln_compile

    if target.kind != "cpu":
        return
    inputs = random_inputs(graph, 0)
    default = kiln_compile(graph, target).timeit(inputs, repeats=20, warmup=3)["median_us"]
    tuned_model = kiln_compile(graph, target, db=db)
    tuned = tuned_model.timeit(inputs, repeats=20, warmup=3)["median_us"]
    used = sum(1 for k in tuned_model.kernels if k.extra.get("origin") == "record")
    print(
        f"whole model {graph.name}: default {default:,.1f} us, tuned {tuned:,.1f} us "
        f"({default / tuned:.2f}x); {used} of {len(tuned_model.kernels)} kernels use tuned records"
    )
