#!/usr/bin/env python
"""Fusion-plan search benchmark (CPU): is the searched plan faster than the rules' plan?

For each model: ``tune(model, fusion="search")`` with N trials per task into one database (the plan search
shares that budget), then three compiled models from the same records: the rules' plan twice (``rules`` and
``rules again``, whose ratio is the noise band of this run) and the searched plans (compile applies a
region's stored plan when it beat the rules). Every output is checked against the numpy reference before
timing; the three are timed in interleaved rounds in rotated order (median of ``--repeats`` runs per
round, outputs and intermediates reused by the compiled model); the table gives the median over rounds of
the per-round ratio rules / contender with its min-max spread.

    python scripts/bench_fusion.py --trials-per-task 16 --rounds 7 --out benchmarks/fusion.md

``--flips`` (no tuning): every single-edge flip of the rules' plan compiled with default schedules and timed
against the rules' plan the same way, i.e. where in the plan space a win could be before any search:

    python scripts/bench_fusion.py --flips --models mlp resblock convnet attention \
        --out benchmarks/fusion_flips.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_MODELS = ["mlp", "resblock", "convnet", "attention", "encoder_layer"]


def _check(model, graph, inputs) -> float:
    import numpy as np

    from compiler.reference import run_reference

    outs = model.run(inputs)
    refs = run_reference(graph, inputs)
    worst = 0.0
    for o, r in zip(outs, refs):
        r64 = np.asarray(r, np.float64)
        err = float(np.abs(np.asarray(o, np.float64) - r64).max()) / max(1.0, float(np.abs(r64).max()))
        worst = max(worst, err)
    if worst > 1e-3:
        raise SystemExit(
            f"{graph.name}: output differs from the numpy reference (relative error {worst:.2e})"
        )
    return worst


def bench_model(name: str, db_url: str, args: argparse.Namespace) -> dict:
    from compiler.frontend.models import get_model
    from compiler.reference import random_inputs
    from compiler.target import Target
    from db.database import TuningDatabase
    from tuner.api import compile as kiln_compile
    from tuner.api import tune
    from tuner.scheduler import Budget

    graph = get_model(name)
    target = Target.host()
    start = time.monotonic()
    with TuningDatabase.open(db_url) as db:
        summary = tune(
            graph,
            target,
            db,
            Budget(trials_per_task=args.trials_per_task),
            fusion="search",
            time_model=False,
            seed=args.seed,
            command_line=" ".join(sys.argv),
        )
        tune_s = time.monotonic() - start
        inputs = random_inputs(graph, 0)
        contenders = {
            "rules": kiln_compile(graph, target, db, fusion_plans=False),
            "searched": kiln_compile(graph, target, db),
            "rules again": kiln_compile(graph, target, db, fusion_plans=False),
        }
    for m in contenders.values():
        _check(m, graph, inputs)
    names = list(contenders)
    per: dict[str, list[float]] = {k: [] for k in names}
    mins: dict[str, list[float]] = {k: [] for k in names}
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for k in order:
            t = contenders[k].timeit(inputs, repeats=args.repeats, warmup=3)
            per[k].append(t["median_us"])
            mins[k].append(t["min_us"])
    ratios = {k: [a / b for a, b in zip(per["rules"], per[k])] for k in ("searched", "rules again")}
    min_ratios = {k: [a / b for a, b in zip(mins["rules"], mins[k])] for k in ("searched", "rules again")}
    applied = [
        line for line in contenders["searched"].meta.get("fusion_plans", []) if line["status"] == "applied"
    ]
    by_index = {p.region.index: p for p in summary.plans}
    flips = []
    for line in applied:
        region = by_index[line["region"]].region
        flips.append(
            f"r{region.index}: "
            + ", ".join(region.describe_edge(e) for e in line["flipped"])
            + f" (sum of kernels {line['rule_latency_us']:,.0f} -> {line['latency_us']:,.0f} us)"
        )
    return {
        "model": name,
        "tasks": len(summary.tasks),
        "regions": len(summary.plans),
        "plans": sum(p.plans_measured for p in summary.plans),
        "trials": summary.stored,
        "tune_s": tune_s,
        "rules_us": statistics.median(per["rules"]),
        "searched_us": statistics.median(per["searched"]),
        "ratio": statistics.median(ratios["searched"]),
        "spread": (min(ratios["searched"]), max(ratios["searched"])),
        "noise": max(abs(1 - x) for x in ratios["rules again"]),
        "noise_spread": (min(ratios["rules again"]), max(ratios["rules again"])),
        "min_ratio": statistics.median(min_ratios["searched"]),
        "min_noise": statistics.median(min_ratios["rules again"]),
        "flips": flips,
        "kernels": (len(contenders["rules"].kernels), len(contenders["searched"].kernels)),
    }


def bench_flips(name: str, args: argparse.Namespace) -> list[dict]:
    """Every single-edge flip of the rules' plan, compiled with default schedules (no tuning), timed
    against the rules' plan: where in the plan space a win could be, before any search."""
    from compiler.build import compile as build_model
    from compiler.frontend.models import get_model
    from compiler.passes import optimize
    from compiler.reference import random_inputs
    from compiler.target import Target
    from tuner.plan_search import target_regions

    graph = optimize(get_model(name))
    target = Target.host()
    plans: dict[str, dict | None] = {"rules": None}
    for r in target_regions(graph, target):
        for e in r.edges:
            plans[f"r{r.index}: {r.describe_edge(r.local_ids[e.id])}"] = {e.id: not e.default}
    models = {k: build_model(graph, target, plan=p) for k, p in plans.items()}
    inputs = random_inputs(graph, 0)
    for m in models.values():
        _check(m, graph, inputs)
    names = list(models)
    per: dict[str, list[float]] = {k: [] for k in names}
    mins: dict[str, list[float]] = {k: [] for k in names}
    for r in range(args.rounds):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            t = models[k].timeit(inputs, repeats=args.repeats, warmup=2)
            per[k].append(t["median_us"])
            mins[k].append(t["min_us"])
    rows = []
    for k in names[1:]:
        ratios = [a / b for a, b in zip(per["rules"], per[k])]
        rows.append(
            {
                "model": name,
                "flip": k,
                "kernels": f"{len(models['rules'].kernels)} -> {len(models[k].kernels)}",
                "rules_us": statistics.median(per["rules"]),
                "flip_us": statistics.median(per[k]),
                "ratio": statistics.median(ratios),
                "spread": (min(ratios), max(ratios)),
                "min_ratio": statistics.median([a / b for a, b in zip(mins["rules"], mins[k])]),
            }
        )
    return rows


def flips_table(rows: list[dict]) -> list[str]:
    lines = [
        "| model | edge flipped (region-local id) | kernels | rules us | flipped us | ratio [spread] "
        "| ratio of mins |",
        "|---|---|---|---:|---:|---|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['flip']} | {r['kernels']} | {r['rules_us']:,.1f} | {r['flip_us']:,.1f} | "
            f"{r['ratio']:.3f} [{r['spread'][0]:.3f}, {r['spread'][1]:.3f}] | {r['min_ratio']:.3f} |"
        )
    return lines


def verdict(row: dict) -> str:
    """No plan applied: the rules' plan (both contenders are the same model). Otherwise >= 5% faster when
    the median ratio, the ratio of mins and the margin over the noise band all say so; the same when the
    median ratio is within the noise band (rules / rules again, at least 2%); otherwise faster or SLOWER."""
    if not row["flips"]:
        return "rules' plan kept (same model)"
    if row["ratio"] >= 1.05 and row["min_ratio"] >= 1.05 and row["ratio"] - 1 > row["noise"]:
        return "faster (>= 5%)"
    if abs(1 - row["ratio"]) <= max(row["noise"], 0.02):
        return "same (within noise)"
    return "faster" if row["ratio"] > 1 else "SLOWER"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=DEFAULT_MODELS)
    ap.add_argument("--trials-per-task", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--db", default=None, help="tuning database URL (default: a new SQLite file in /tmp)")
    ap.add_argument("--out", default=None, help="write the markdown table here")
    ap.add_argument(
        "--flips",
        action="store_true",
        help="no tuning: time every single-edge flip of the rules' plan with default schedules",
    )
    args = ap.parse_args()
    if args.flips:
        return main_flips(args)

    from compiler.target import Target
    from scripts.bench_common import machine_line

    load_before = os.getloadavg()

    db_url = args.db or f"sqlite:////tmp/kiln_bench_fusion_{int(time.time())}.db"
    rows = []
    for name in args.models:
        row = bench_model(name, db_url, args)
        rows.append(row)
        print(
            f"{name}: rules {row['rules_us']:,.1f} us, searched {row['searched_us']:,.1f} us, "
            f"ratio {row['ratio']:.3f} [{row['spread'][0]:.3f}, {row['spread'][1]:.3f}], noise "
            f"{row['noise']:.3f}; {verdict(row)}; {'; '.join(row['flips']) or 'no plan applied'}",
            flush=True,
        )
    lines = [
        "# Fusion plans searched per region vs the rules' plan (CPU)",
        "",
        "Command: `python scripts/bench_fusion.py " + " ".join(sys.argv[1:]) + "`",
        "",
        f"Machine: {machine_line()}; target `{Target.host().key}`. The machine was shared with other "
        f"engineers' jobs while this ran (load average {load_before[0]:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end, 2 cores): absolute times are noisy, the ratios come from one "
        "run with the contenders interleaved in rotated order.",
        "",
        'Each model is tuned once (`tune(..., fusion="search")`, the trials below are every record stored by '
        "the run, plan-search groups included); `rules` and `searched` are compiled from the same records, "
        "`rules again` is the rules' plan compiled a second time: rules / rules again is the noise band. "
        "Ratio = rules latency / searched latency per round (> 1: the searched plan is faster), median over "
        "rounds [min, max]; ratio of mins: the same with each round's fastest run (less sensitive to other "
        "jobs taking a core). Outputs checked against the numpy reference before timing.",
        "",
        "| model | tasks | regions | plans measured | trials | kernels rules -> searched | rules us | "
        "searched us | ratio [spread] | ratio of mins | noise band (rules / rules again) | verdict |",
        "|---|---:|---:|---:|---:|---|---:|---:|---|---:|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['tasks']} | {r['regions']} | {r['plans']} | {r['trials']} | "
            f"{r['kernels'][0]} -> {r['kernels'][1]} | {r['rules_us']:,.1f} | {r['searched_us']:,.1f} | "
            f"{r['ratio']:.3f} [{r['spread'][0]:.3f}, {r['spread'][1]:.3f}] | {r['min_ratio']:.3f} | "
            f"±{r['noise']:.3f} [{r['noise_spread'][0]:.3f}, {r['noise_spread'][1]:.3f}] | {verdict(r)} |"
        )
    lines += [
        "",
        "Edges flipped from the rules (region-local ids; sum of the region's kernels, rules -> searched):",
        "",
    ]
    for r in rows:
        lines.append(f"- {r['model']}: " + ("; ".join(r["flips"]) or "none (the rules' plan was best)"))
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


def main_flips(args: argparse.Namespace) -> int:
    from compiler.target import Target
    from scripts.bench_common import machine_line

    load_before = os.getloadavg()
    rows = []
    for name in args.models:
        found = bench_flips(name, args)
        rows += found
        for r in found:
            print(
                f"{name} {r['flip']}: ratio {r['ratio']:.3f}, ratio of mins {r['min_ratio']:.3f}", flush=True
            )
    lines = [
        "# Single-edge flips of the rules' fusion plan, default schedules (CPU)",
        "",
        "Command: `python scripts/bench_fusion.py " + " ".join(sys.argv[1:]) + "`",
        "",
        f"Machine: {machine_line()}; target `{Target.host().key}`; loaded by other engineers' jobs (load "
        f"average {load_before[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, 2 cores).",
        "",
        "No tuning: every kernel uses its sketch's default schedule. Each row flips one optional edge of the "
        "rules' plan (the plan search's first candidates); ratio = rules latency / flipped latency per "
        "round (> 1: the flip is faster), median over interleaved, rotated rounds [min, max]. Outputs "
        "checked against the numpy reference before timing.",
        "",
        *flips_table(rows),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
