"""`kiln tune`: measure candidates of every task of a model and record them in the tuning database."""

from __future__ import annotations

import argparse
import re

from compiler.errors import KilnError
from tuner.commands.common import add_model_arg, load_model_arg, print_table
from tuner.progress import COLUMNS, task_rows
from tuner.scheduler import Budget


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


def run_tune(args: argparse.Namespace) -> int:
    from tuner.api import tune  # optuna, SQLAlchemy and the measurement code: only when tuning

    if args.trials is not None and args.trials < 1:
        raise KilnError("--trials must be at least 1")
    seconds = parse_duration(args.time_budget) if args.time_budget else None
    summary = tune(
        load_model_arg(args),
        args.target,
        args.db,
        Budget(args.trials, seconds),
        tasks=args.tasks,
        sampler=args.sampler,
        batch=args.batch,
        early_stop=args.early_stop or None,
        cost_model=args.cost_model,
        seed=args.seed,
        workers=args.workers,
        time_model=not args.no_summary,
        progress=True,
        command_line=" ".join(["kiln", *args.argv]),
    )
    rows = task_rows(summary.tasks)
    print_table(rows, COLUMNS, title=f"kiln tune {summary.model} on {summary.target}")
    if summary.interrupted:
        print("interrupted: every committed result is kept; rerun the same command to continue")
        return 130
    t = summary.timing
    if t is not None:
        print(
            f"whole model {summary.model}: default {t.default_us:,.1f} us, tuned {t.tuned_us:,.1f} us "
            f"({t.speedup:.2f}x); {t.kernels_from_records} of {t.kernels} kernels use tuned records"
        )
    return 0
