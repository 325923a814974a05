"""Distributed tuning: throughput of 1, 2 and 4 workers, and two workers' timings on one machine.

    PYTHONPATH=. python scripts/bench_distributed.py --rounds 3 --trials-per-task 32 --seconds 0.25

1. Simulated measurement (``tuner.sim_worker``: ``tune()`` with a runner of fixed latency per config that
   keeps a worker busy ``--seconds`` per candidate): N worker processes (N = 1, 2, 4; rounds in rotated
   order) tune ``encoder_layer`` (8 tasks) with ``--trials-per-task`` into a fresh SQLite file. Throughput
   is counted from the database: the run's records divided by the time from the run's start to its last
   record. Scaling efficiency = throughput(N) / (N x throughput(1)).
2. Real CPU measurement: the same candidate configs of one task are built and timed (LocalBuilder +
   LocalRunner) by one process alone, by two processes at once with the host timing lock
   (``tuner/measure/host_lock.py``), and by two at once with the lock off (``KILN_TIMING_LOCK=off``).
   Reported: per mode, the median over configs of (median latency / the same config's latency alone).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------ simulated
def simulated_round(n: int, args: argparse.Namespace, tmp: Path) -> dict:
    from db.database import TuningDatabase

    url = f"sqlite:///{tmp / f'sim-{n}-{time.monotonic_ns()}.db'}"
    argv = [sys.executable, "-m", "tuner.sim_worker", "--db", url, "--model", "encoder_layer"]
    argv += ["--trials-per-task", str(args.trials_per_task), "--batch", str(args.batch)]
    argv += ["--seconds", str(args.seconds)]
    argv += ["--start-at", str(time.time() + args.startup)]  # Python start-up is not part of the run
    procs = [subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True) for _ in range(n)]
    outs = [p.communicate(timeout=1800)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"a simulated worker failed: {outs}")
    with TuningDatabase.open(url) as db:
        (run,) = db.runs("encoder_layer")
        records = sum(db.run_record_counts(run.id).values())
        recs = db.find_records()
    configs = [json.dumps([r.workload_key, r.config], sort_keys=True) for r in recs]
    assert len(configs) == len(set(configs)), "a config was measured twice"
    start = run.started_at
    # measured candidates: those the runner ran (the sketch's check rejects the others before any time)
    times = sorted((r.created_at - start).total_seconds() for r in recs if r.status == "ok")
    span = max(t for t in times)
    lo, hi = 0.2 * span, 0.8 * span  # steady state: without the first batches and the last
    steady = sum(1 for t in times if lo < t <= hi) / (hi - lo)
    return {
        "workers": n,
        "records": records,
        "ok": len(times),
        "span_s": span,
        "per_s": len(times) / span,
        "steady_per_s": steady,
    }


# --------------------------------------------------------------------------------------- real timing
def time_configs(out: str, count: int, start_at: float) -> None:
    """Worker mode: build and time ``count`` configs of the softmax task from ``start_at`` (epoch seconds);
    write {config: median_us}."""
    from compiler.frontend import load_model
    from compiler.target import Target
    from tuner.measure import MeasureInput, Measurer
    from tuner.space import config_json
    from tuner.task import extract_tasks

    target = Target.host()
    (task,) = extract_tasks(load_model("softmax"), target)
    configs = _configs(task, count)
    with Measurer("local", "local", target, {"workers": 1}) as m:
        time.sleep(max(0.0, start_at - time.time()))  # both workers build, then time, together
        results = m.measure([MeasureInput(task, c) for c in configs])
    Path(out).write_text(
        json.dumps({config_json(c): r.median_us for c, r in zip(configs, results) if r.ok}, sort_keys=True)
    )


def _configs(task, count: int) -> list[dict]:  # type: ignore[no-untyped-def]
    import itertools

    out = [task.default()]
    for values in itertools.product(*[k.values for k in task.space()]):
        if len(out) >= count:
            break
        config = dict(zip([k.name for k in task.space()], values))
        try:
            task.check(config)
        except Exception:
            continue
        if config not in out:
            out.append(config)
    return out


def timing_round(mode: str, args: argparse.Namespace, tmp: Path) -> list[dict]:
    n = 1 if mode == "alone" else 2
    env = {**os.environ, "KILN_TIMING_LOCK": "off" if mode == "two, lock off" else str(tmp / "timing.lock")}
    files = [tmp / f"t-{time.monotonic_ns()}-{i}.json" for i in range(n)]
    argv = [sys.executable, str(Path(__file__).resolve()), "--configs", str(args.configs)]
    argv += ["--start-at", str(time.time() + args.startup), "--time-configs"]
    procs = [subprocess.Popen([*argv, str(f)], cwd=ROOT, env=env) for f in files]
    for p in procs:
        if p.wait(timeout=1800):
            raise SystemExit("a timing worker failed")
    return [json.loads(f.read_text()) for f in files]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="benchmarks/distributed.md")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--trials-per-task", type=int, default=24)
    p.add_argument("--seconds", type=float, default=0.1, help="simulated wall time per candidate")
    p.add_argument("--configs", type=int, default=8, help="configs timed in the real-measurement part")
    p.add_argument("--startup", type=float, default=15.0, help="seconds the workers get to start up")
    p.add_argument("--batch", type=int, default=8, help="candidates per batch (kiln tune's default)")
    p.add_argument("--time-configs", help=argparse.SUPPRESS)
    p.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.time_configs:
        time_configs(args.time_configs, args.configs, args.start_at)
        return 0
    sim: dict[int, list[dict]] = {1: [], 2: [], 4: []}
    real: dict[str, list[list[dict]]] = {"alone": [], "two, lock on": [], "two, lock off": []}
    with tempfile.TemporaryDirectory(prefix="kiln-bench-dist-") as tmp_name:
        tmp = Path(tmp_name)
        order = [1, 4, 2]
        for r in range(args.rounds):
            for n in order[r % 3 :] + order[: r % 3]:
                sim[n].append(simulated_round(n, args, tmp))
                print(f"simulated, {n} workers: {sim[n][-1]}", file=sys.stderr)
        modes = list(real)
        for r in range(args.rounds):
            for mode in modes[r % 3 :] + modes[: r % 3]:
                real[mode].append(timing_round(mode, args, tmp))
                print(f"real, {mode}: done", file=sys.stderr)
    base = statistics.median(x["per_s"] for x in sim[1])
    base_steady = statistics.median(x["steady_per_s"] for x in sim[1])
    lines = [
        "# Distributed tuning: workers sharing one database",
        "",
        f"Command: `PYTHONPATH=. python scripts/bench_distributed.py --rounds {args.rounds} "
        f"--trials-per-task {args.trials_per_task} --batch {args.batch} --seconds {args.seconds} "
        f"--configs {args.configs} --startup {args.startup:g}`",
        "",
        f"Host: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}; the machine was shared with other jobs (loaded), so absolute "
        "times are noisy: compare ratios within this run.",
        "",
        "## Throughput with simulated measurement",
        "",
        f"`encoder_layer` (8 tasks), {args.trials_per_task} trials per task, batch {args.batch}, each "
        "measured candidate keeps "
        f"its worker busy {args.seconds} s (tuner.sim_worker; configs the sketch rejects take no time), one "
        "SQLite file (WAL); the workers load Python and the model first and start tuning at one agreed "
        "moment. Measured candidates per second, from the database: the run's ok records (those the runner "
        "ran) / (last one - run start); steady state: those committed between 20% and 80% of that span / "
        "its 60%. Medians over "
        f"{args.rounds} rounds (min-max).",
        "",
        "| workers | records (ok) | candidates/s, whole run | efficiency | candidates/s, steady state "
        "| efficiency |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for n, rows in sim.items():
        rates = [x["per_s"] for x in rows]
        steady = [x["steady_per_s"] for x in rows]
        med, med_s = statistics.median(rates), statistics.median(steady)
        oks = "/".join(str(x["ok"]) for x in rows)
        lines.append(
            f"| {n} | {rows[0]['records']} ({oks}) | {med:.2f} ({min(rates):.2f}-{max(rates):.2f}) | "
            f"{med / (n * base):.0%} | {med_s:.2f} ({min(steady):.2f}-{max(steady):.2f}) | "
            f"{med_s / (n * base_steady):.0%} |"
        )
    lines += [
        "",
        "## Two workers timing on one machine (real CPU measurement)",
        "",
        f"The same {args.configs} configs of the `softmax` task built and timed by LocalBuilder + "
        "LocalRunner; "
        "ratio = a config's median latency in that mode / its latency measured alone (median over the "
        "alone rounds), median over configs, workers and rounds (min-max). Both workers load first and "
        "start at one agreed moment, so their builds overlap and then their timings would.",
        "",
        "| mode | latency ratio vs alone |",
        "|---|---:|",
    ]
    samples: dict[str, list[float]] = {}
    for run in real["alone"]:
        for k, v in run[0].items():
            samples.setdefault(k, []).append(v)
    alone = {k: statistics.median(v) for k, v in samples.items()}
    for mode, rounds in real.items():
        ratios = [v / alone[k] for run in rounds for worker in run for k, v in worker.items() if k in alone]
        lines.append(f"| {mode} | {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |")
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
