"""`kiln bench`: regression benchmarks (run a suite, store it, compare runs, gate CI).

    kiln bench --suite quick|zoo|onnx DIR|FILE.toml [--db URL] [--baseline last] [--threshold 0.1]
    kiln bench compare BASELINE NEW         # run ids, last, last~N, or files written by --json
    kiln bench list | export RUN | report RUN

A run is stored in the tuning database (``--db``; ``--no-store`` to skip) with an environment
fingerprint; ``--baseline`` compares it with an earlier run of the same suite and target and, like ``kiln
bench compare``, exits with status 1 when a workload regressed significantly (see
:mod:`tuner.bench.stats`). The methodology is in :mod:`tuner.bench.runner` and :mod:`tuner.bench.timing`.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
from pathlib import Path
from typing import Any

from compiler.errors import KilnError
from tuner.commands.common import DEFAULT_DB_HELP, emit_rows, open_database, positive_int
from tuner.commands.output import FORMATS


def _threshold(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < 10:
        raise argparse.ArgumentTypeError(f"must be a fraction such as 0.1 (10%), not {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, not {value}")
    return value


def _add_gate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--threshold",
        type=_threshold,
        default=0.10,
        help="slowdown that counts as a regression when significant, as a fraction (default 0.10 = 10%%)",
    )
    p.add_argument("--alpha", type=float, default=0.05, help="significance level of the test (default 0.05)")


def _add_db_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", metavar="URL", default=None, help=f"tuning database URL ({DEFAULT_DB_HELP})")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench",
        help="run regression benchmarks: Kiln vs its peers, stored, compared, gated",
        description="Time a suite of workloads with Kiln (default and tuned schedules) and its peers "
        "(numpy, onnxruntime, torch eager, torch.compile; on cuda torch and cuBLAS), outputs checked first, "
        "rounds interleaved in rotated order, same threads for everyone; store the run in the tuning "
        "database and compare it with a baseline. Exit status 1 when a workload regressed significantly.",
    )
    p.add_argument(
        "--suite",
        nargs="+",
        default=["quick"],
        metavar="SUITE",
        help="quick (default), zoo, onnx DIR (every *.onnx there), or a suite file FILE.toml",
    )
    p.add_argument("--target", default="cpu", choices=("cpu", "cuda"), help="cpu (this host) or cuda")
    p.add_argument(
        "--contenders",
        metavar="A,B",
        help="comma-separated contenders (default: the suite's, else all of the target's)",
    )
    p.add_argument("--rounds", type=positive_int, help="interleaved rounds (default: the suite's, 5)")
    p.add_argument("--min-time", type=_seconds, help="seconds per contender per round (default: the suite's)")
    p.add_argument(
        "--threads",
        type=positive_int,
        default=len(os.sched_getaffinity(0)),
        help="threads for every contender (default: this process's CPUs)",
    )
    _add_db_arg(p)
    p.add_argument("--no-store", action="store_true", help="do not store the run in the database")
    p.add_argument(
        "--tune",
        type=positive_int,
        metavar="N",
        help="first tune every workload with N trials per task into --db (then kiln tuned uses them)",
    )
    p.add_argument("--baseline", metavar="RUN", help="compare with this stored run: an id, last, or last~N")
    _add_gate_args(p)
    p.add_argument("--no-ceilings", action="store_true", help="skip the copy and SGEMM ceilings")
    p.add_argument("--out", metavar="FILE.md", help="write the markdown report here")
    p.add_argument("--plot", metavar="FILE.png", help="bars of every contender relative to Kiln")
    p.add_argument(
        "--history", metavar="FILE.png", help="each workload's medians over the suite's stored runs"
    )
    p.add_argument("--json", metavar="FILE", help="write the run as JSON (kiln bench compare reads it)")
    p.add_argument("--csv", metavar="FILE", help="write the results as CSV")
    p.set_defaults(handler=run_bench, bench_action=None)

    actions = p.add_subparsers(dest="bench_action", metavar="ACTION")
    c = actions.add_parser(
        "compare",
        help="compare two runs (exit status 1 on a significant regression)",
        description="Compare two bench runs per workload and contender: ratio of medians, a Mann-Whitney "
        "test on the round medians and a bootstrap interval of the ratio. Exit status 1 when a workload "
        "regressed significantly by more than --threshold.",
    )
    c.add_argument("baseline", metavar="BASELINE", help="a run id, last, last~N, or a file from --json")
    c.add_argument("new", metavar="NEW", help="a run id, last, last~N, or a file from --json")
    _add_db_arg(c)
    _add_gate_args(c)
    c.add_argument("--format", choices=FORMATS, default="table")
    c.set_defaults(handler=run_compare)

    ls = actions.add_parser("list", help="the stored bench runs", description="List the stored bench runs.")
    _add_db_arg(ls)
    ls.add_argument("--suite", help="only runs of this suite")
    ls.add_argument("--format", choices=FORMATS, default="table")
    ls.set_defaults(handler=run_list)

    ex = actions.add_parser("export", help="a stored run as JSON or CSV", description="Export a stored run.")
    ex.add_argument("run", metavar="RUN", help="a run id, last or last~N")
    _add_db_arg(ex)
    ex.add_argument("--format", choices=("json", "csv"), default="json")
    ex.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    ex.set_defaults(handler=run_export)

    rp = actions.add_parser(
        "report", help="the markdown report and charts of a stored run", description="Report a stored run."
    )
    rp.add_argument("run", metavar="RUN", help="a run id, last or last~N")
    _add_db_arg(rp)
    rp.add_argument("--out", metavar="FILE.md", help="write the markdown here (default: stdout)")
    rp.add_argument("--plot", metavar="FILE.png")
    rp.add_argument("--history", metavar="FILE.png")
    rp.set_defaults(handler=run_report)


# ------------------------------------------------------------------------------------------------ run
def run_bench(args: argparse.Namespace) -> int:
    from compiler.target import Target
    from tuner.bench import storage
    from tuner.bench.contenders import BenchContext, create_contenders
    from tuner.bench.environment import fingerprint
    from tuner.bench.runner import run_suite
    from tuner.bench.suite import resolve_suite
    from tuner.bench.timing import slowdown_from_env

    # Idle OpenMP threads of one contender (torch's; Kiln's thread pool sleeps by itself) must not spin on
    # the cores the next contender needs: every runtime is asked to sleep at once (read when it starts).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    suite = resolve_suite(args.suite)
    slowdown = slowdown_from_env()
    if args.target == "cuda":
        from compiler.backends.cuda.device import why_unavailable

        reason = why_unavailable()
        if reason is not None:
            raise KilnError(f"--target cuda needs a usable GPU: {reason}")
    names = [n.strip() for n in args.contenders.split(",") if n.strip()] if args.contenders else None
    if names is None and suite.contenders is not None:
        from tuner.bench.contenders import REGISTRY

        names = [n for n in suite.contenders if n in REGISTRY[args.target]]
    contenders = create_contenders(args.target, names)
    unknown_slow = sorted(set(slowdown) - {c.name for c in contenders})
    if unknown_slow:
        raise KilnError(f"KILN_BENCH_SLOWDOWN names contender(s) not in this run: {', '.join(unknown_slow)}")
    target_key = Target.parse(args.target).key
    settings: dict[str, Any] = {
        "rounds": args.rounds or suite.rounds,
        "min_time": args.min_time or suite.min_time,
        "threads": args.threads,
        "omp_wait_policy": os.environ["OMP_WAIT_POLICY"],
        "workloads": [
            {"name": w.name, "model": w.model, "input_shapes": w.input_shapes} for w in suite.workloads
        ],
    }
    with contextlib.ExitStack() as stack:
        db = stack.enter_context(open_database(args, create=True))
        baseline = None
        if args.baseline:
            baseline = storage.load_run(db, storage.resolve_run(db, args.baseline, suite.name, target_key))
        if args.tune:
            settings["tune_trials_per_task"] = args.tune
            _tune(suite, args.target, db, args.tune)
        ctx = BenchContext(args.target, args.threads, db)
        run = run_suite(
            suite,
            contenders,
            ctx,
            target_key=target_key,
            environment=fingerprint(target_key, args.target == "cuda"),
            settings=settings,
            command_line=" ".join(_quote(a) for a in args.argv),
            slowdown=slowdown,
            measure_ceilings=not args.no_ceilings,
        )
        graphs = {r.workload: r.info.get("graph", r.workload) for r in run.results}
        run.settings["tuning"] = storage.tuning_rows(db, list(graphs.items()), target_key)
        if not args.no_store:
            storage.save_run(db, run)
            print(f"stored bench run {run.id} in {db.url}", file=sys.stderr)
        _write_outputs(run, args, db)
        from tuner.bench.report import results_table

        print(results_table(run))
        if baseline is not None:
            return _gate(baseline, run, args)
    return 0


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


def _tune(suite: Any, target: str, db: Any, trials_per_task: int) -> None:
    from compiler.frontend import load_model
    from tuner.api import tune
    from tuner.scheduler import Budget

    for w in suite.workloads:
        graph = load_model(w.model, w.input_shapes or None)
        print(f"{w.name}: tuning, {trials_per_task} trials per task", file=sys.stderr, flush=True)
        # no whole-model default-vs-tuned timing at the end of tuning: the benchmark times both itself
        summary = tune(
            graph, target, db, Budget(trials_per_task=trials_per_task), early_stop=None, time_model=False
        )
        gc.collect()  # the run's measurement pools close now, not at interpreter exit
        print(f"{w.name}: {summary.stored} records stored under tuning run {summary.run_id}", file=sys.stderr)


def _write_outputs(run: Any, args: argparse.Namespace, db: Any) -> None:
    import json

    from tuner.bench import report, storage

    if getattr(args, "out", None):
        Path(args.out).write_text(report.markdown(run))
        print(f"wrote {args.out}", file=sys.stderr)
    if getattr(args, "plot", None):
        report.bars_chart(run, Path(args.plot))
        print(f"wrote {args.plot}", file=sys.stderr)
    if getattr(args, "history", None):
        if db is None:
            raise KilnError("--history reads the suite's stored runs: give --db (or a run id, not a file)")
        runs = storage.history(db, run.suite, run.target_key)
        if run.id is None:
            runs.append(run)
        report.history_chart(runs, Path(args.history))
        print(f"wrote {args.history}", file=sys.stderr)
    if getattr(args, "json", None):
        Path(args.json).write_text(json.dumps(run.to_json(), indent=1, allow_nan=False, default=_no_inf))
        print(f"wrote {args.json}", file=sys.stderr)
    if getattr(args, "csv", None):
        Path(args.csv).write_text(run.to_csv())
        print(f"wrote {args.csv}", file=sys.stderr)


def _no_inf(value: Any) -> Any:
    return str(value)


def _gate(baseline: Any, new: Any, args: argparse.Namespace, fmt: str = "table") -> int:
    from tuner.bench.compare import compare_runs, has_regression
    from tuner.bench.report import compare_table
    from tuner.commands.output import write_rows

    verdicts = compare_runs(baseline, new, threshold=args.threshold, alpha=args.alpha)
    rows = compare_table(verdicts)
    columns = list(rows[0]) if rows else ["workload"]
    if fmt == "table":
        print(f"\ncompared with bench run {baseline.id if baseline.id is not None else '(file)'}:")
    write_rows(rows, columns, fmt, sys.stdout)
    regressed = [
        f"{v.workload} ({v.contender}) {v.ratio:.2f}x" for v in verdicts if v.verdict == "regression"
    ]
    if has_regression(verdicts):
        print(f"kiln bench: significant regression: {', '.join(regressed)}", file=sys.stderr)
        return 1
    print("kiln bench: no significant regression", file=sys.stderr)
    return 0


# -------------------------------------------------------------------------------------- sub-actions
def _load(spec: str, args: argparse.Namespace, stack: contextlib.ExitStack) -> Any:
    from tuner.bench import storage
    from tuner.bench.results import BenchRun

    if spec.endswith(".json") or Path(spec).is_file():
        return BenchRun.load_json(Path(spec))
    db = getattr(args, "_db", None)
    if db is None:
        db = args._db = stack.enter_context(open_database(args, create=False))
    return storage.load_run(db, storage.resolve_run(db, spec))


def run_compare(args: argparse.Namespace) -> int:
    with contextlib.ExitStack() as stack:
        baseline = _load(args.baseline, args, stack)
        new = _load(args.new, args, stack)
        return _gate(baseline, new, args, args.format)


def run_list(args: argparse.Namespace) -> int:
    from tuner.bench import storage

    with open_database(args, create=False) as db:
        runs = storage.list_runs(db, args.suite)
    rows = [
        {
            "run": r.id,
            "suite": r.suite,
            "target": r.target_key,
            "started": r.started_at,
            "commit": (r.environment.get("git_commit") or "")[:12],
            "load": None if r.load_before is None else round(r.load_before, 2),
            "command": r.command_line,
        }
        for r in runs
    ]
    emit_rows(rows, ["run", "suite", "target", "started", "commit", "load", "command"], args)
    return 0


def run_export(args: argparse.Namespace) -> int:
    import json

    with contextlib.ExitStack() as stack:
        run = _load(args.run, args, stack)
    text = (
        run.to_csv() if args.format == "csv" else json.dumps(run.to_json(), indent=1, default=_no_inf) + "\n"
    )
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def run_report(args: argparse.Namespace) -> int:
    from tuner.bench import report

    with contextlib.ExitStack() as stack:
        run = _load(args.run, args, stack)
        if args.history and getattr(args, "_db", None) is None:
            args._db = stack.enter_context(open_database(args, create=False))
        if not args.out:
            sys.stdout.write(report.markdown(run))
            args.out = None
        _write_outputs(run, args, getattr(args, "_db", None))
    return 0
