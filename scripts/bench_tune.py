#!/usr/bin/env python
"""Tuning benchmark (CPU): tune each model with N trials per task into one database, then time default
vs tuned Kiln against numpy, onnxruntime, torch eager and torch.compile in one interleaved run
(scripts/bench_cpu.py --db). Also reports tuning time and measurement throughput.

    python scripts/bench_tune.py --trials-per-task 100 --out benchmarks/cpu_tuned.md
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_MODELS = ["softmax_large", "rmsnorm", "layernorm", "bias_gelu", "matmul", "mlp", "encoder_layer"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=DEFAULT_MODELS)
    ap.add_argument("--trials-per-task", type=int, default=100)
    ap.add_argument(
        "--db", default=None, help="tuning database URL (default: a new SQLite file next to --out)"
    )
    ap.add_argument("--skip-tuning", action="store_true", help="only time, with the records already in --db")
    ap.add_argument("--cost-model", default="none", choices=("none", "analytic", "gbdt"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from compiler.frontend.models import get_model
    from compiler.target import Target
    from tuner.task import extract_tasks

    out = Path(args.out) if args.out else None
    db = args.db or f"sqlite:///{(out.parent if out else Path('.')) / 'bench_tune.db'}"
    rows = []
    if not args.skip_tuning:
        for name in args.models:
            n_tasks = len(extract_tasks(get_model(name), Target.host()))
            trials = args.trials_per_task * n_tasks
            start = time.monotonic()
            cmd = [
                sys.executable,
                "-m",
                "tuner.cli",
                "tune",
                "--model",
                name,
                "--trials",
                str(trials),
                "--db",
                db,
                "--early-stop",
                "0",
                "--no-summary",
                "--cost-model",
                args.cost_model,
            ]
            res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            seconds = time.monotonic() - start
            if res.returncode != 0:
                print(res.stdout[-2000:], res.stderr[-2000:])
                raise SystemExit(f"kiln tune failed for {name}")
            rows.append(
                {
                    "model": name,
                    "tasks": n_tasks,
                    "trials": trials,
                    "tuning s": f"{seconds:.0f}",
                    "candidates/s": f"{trials / seconds:.1f}",
                }
            )
            print(rows[-1], flush=True)
    bench = [
        sys.executable,
        str(ROOT / "scripts" / "bench_cpu.py"),
        "--db",
        db,
        "--rounds",
        str(args.rounds),
        "--models",
        *args.models,
    ]
    res = subprocess.run(bench, cwd=ROOT, capture_output=True, text=True)
    if res.returncode != 0:
        print(res.stdout[-3000:], res.stderr[-3000:])
        raise SystemExit("bench_cpu.py failed")
    table = res.stdout[res.stdout.index("# Kiln CPU benchmark") :]
    from scripts.bench_common import markdown_table

    text = table
    if rows:
        text += (
            "\n## Tuning runs\n\n" + f"{args.trials_per_task} measured trials per task, sampler TPE, "
            f"cost model: {args.cost_model}. Throughput is end to end (check, build, verify, time) "
            "including the whole-model tasks' larger kernels.\n\n"
            + markdown_table(rows, ["model", "tasks", "trials", "tuning s", "candidates/s"])
            + "\n"
        )
    print(text)
    if out:
        out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
