"""`kiln tune`: measure candidates of every task of a model and record them in the tuning database."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from compiler.errors import KilnError
from compiler.target import tf32_spec
from tuner.commands.common import add_model_arg, load_model_arg, positive_int, print_table
from tuner.progress import COLUMNS, task_rows
from tuner.scheduler import Budget

# `kiln tune`'s cost model: the GBDT, by the rule of scripts/bench_default_cost_model.py fixed before
# measuring (benchmarks/default_cost_model.md). The library's tuner.api.tune keeps "none" (the sampler
# alone), which `kiln bench --tune` and the benchmark scripts use.
DEFAULT_COST_MODEL = "gbdt"

if TYPE_CHECKING:
    from tuner.api import TuneSummary


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
        "committing every result to the tuning database. Rerunning an interrupted tune with the same "
        "arguments continues its run and spends only the budget it had left.",
    )
    add_model_arg(p)
    p.add_argument("--target", default="cpu", help="cpu (this host) or cuda")
    p.add_argument(
        "--tf32",
        action="store_true",
        help="cuda: float32 matmuls may use TF32 tensor cores (10-bit mantissas; part of the target key)",
    )
    budget = p.add_mutually_exclusive_group(required=True)
    budget.add_argument("--trials", type=int, help="total measured candidates across tasks")
    budget.add_argument(
        "--trials-per-task",
        type=positive_int,
        metavar="N",
        help="N measured candidates per selected task: the total, N x tasks, is shared by the scheduler "
        "(tasks that gain most get more)",
    )
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
        default=DEFAULT_COST_MODEL,
        help="rank asked candidates with a cost model and measure only the best (plus a few random); none: "
        "the sampler alone (default: %(default)s; benchmarks/default_cost_model.md compares none and gbdt)",
    )
    p.add_argument(
        "--fusion",
        choices=("auto", "search", "rules"),
        default="auto",
        help="search each region's fusion plan under the same budget and store the best (search), keep the "
        "rules' groups (rules), or search when the budget allows (auto, the default)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=None, help="build processes (default: cores)")
    p.add_argument("--no-summary", action="store_true", help="skip the whole-model default vs tuned timing")
    p.add_argument(
        "--confirm-rounds",
        type=int,
        default=5,
        metavar="N",
        help="at the end, measure each task's best candidate and its default again in N interleaved rounds "
        "(default 5; 0: none): the speed-ups shown and compile's choice come from these",
    )
    p.add_argument(
        "--new-run",
        action="store_true",
        help="start a new run even when an unfinished run with the same arguments could be resumed",
    )
    p.add_argument(
        "--format",
        choices=("table", "json"),
        default="table",
        help="table (default), or json: the summary as JSON on stdout, progress on stderr",
    )
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        help="draw best-so-far latency per task over trials into this file (needs matplotlib)",
    )
    p.set_defaults(handler=run_tune)


def run_tune(args: argparse.Namespace) -> int:
    from tuner.api import tune  # optuna, SQLAlchemy and the measurement code: only when tuning

    if args.trials is not None and args.trials < 1:
        raise KilnError("--trials must be at least 1")
    if args.plot:
        _check_plotting()
    seconds = parse_duration(args.time_budget) if args.time_budget else None
    as_json = args.format == "json"
    summary = tune(
        load_model_arg(args),
        tf32_spec(args.target, args.tf32),
        args.db,
        Budget(args.trials, seconds, args.trials_per_task),
        tasks=args.tasks,
        sampler=args.sampler,
        batch=args.batch,
        early_stop=args.early_stop or None,
        cost_model=args.cost_model,
        seed=args.seed,
        workers=args.workers,
        time_model=not args.no_summary,
        progress=True,
        progress_file=sys.stderr if as_json else None,
        command_line=" ".join(["kiln", *args.argv]),
        resume=not args.new_run,
        confirm_rounds=max(0, args.confirm_rounds),
        fusion=args.fusion,
    )
    plotted = _plot(summary, args) if args.plot else None
    if as_json:
        data = summary.to_json()
        data["plot"] = str(plotted) if plotted else None
        print(json.dumps(data, indent=2))
        return 130 if summary.interrupted else 0
    rows = task_rows(summary.tasks, summary.speedup_text)
    print_table(rows, COLUMNS, title=f"kiln tune {summary.model} on {summary.target}")
    budget = f" of {summary.budget_trials}" if summary.budget_trials is not None else ""
    print(
        f"run {summary.run_id}: {summary.stored}{budget} trials stored"
        + (f" ({summary.measured} by this invocation)" if summary.resumed is not None else "")
    )
    for p in summary.plans:
        flipped = ", ".join(p.region.describe_edge(e) for e in p.flipped) or "the rules' plan"
        print(
            f"fusion region {p.region.index} [{p.region.key[:12]}]: {p.plans_measured} plans measured; "
            f"best {flipped}: {p.latency_us:,.1f} us vs rules {p.rule_latency_us:,.1f} us (sums of kernels)"
            + (
                f"; whole model {p.whole_us:,.1f} us vs rules {p.rule_whole_us:,.1f} us"
                if p.whole_us is not None and p.rule_whole_us is not None
                else ""
            )
        )
        if p.why:
            print(f"  rules' plan kept: {p.why}")
    if plotted:
        print(f"tuning curves written to {plotted}")
    if summary.interrupted:
        print("interrupted: every committed result is kept; rerun the same command to continue")
        return 130
    slower = [
        r.task.name for r in summary.tasks if (c := summary.confirmation(r)) is not None and not c.better
    ]
    if slower:
        print(f"confirmed not faster than the default (compile keeps the default): {', '.join(slower)}")
    for key, why in summary.confirm_failures.items():
        print(f"not confirmed: task {key[:12]}: {why}")
    t = summary.timing
    if t is not None:
        print(
            f"whole model {summary.model}: default {t.default_us:,.1f} us, tuned {t.tuned_us:,.1f} us "
            f"({t.speedup_text()}, {t.rounds} interleaved rounds); "
            f"{t.kernels_from_records} of {t.kernels} kernels use tuned records"
        )
    return 0


def _check_plotting() -> None:
    """Refuse --plot before tuning when matplotlib is missing (not after spending the budget)."""
    import importlib.util

    from tuner.curves import PLOT_HINT

    if importlib.util.find_spec("matplotlib") is None:
        raise KilnError(PLOT_HINT)


def _plot(summary: TuneSummary, args: argparse.Namespace) -> Path:
    """Draw the curves of the run's tasks (all their records on the target, in measurement order)."""
    from db.database import TuningDatabase
    from tuner.curves import curve_of, plot_curves

    with TuningDatabase.open(args.db) as db:
        curves = [curve_of(db, r.task.workload_key, summary.target, r.task.name) for r in summary.tasks]
    return plot_curves(curves, args.plot, f"kiln tune {summary.model} on {summary.target}")
