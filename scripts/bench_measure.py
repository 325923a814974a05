#!/usr/bin/env python
"""Measurement throughput (a script, not a test): measured candidates per second, end to end.

For each task, ``--n`` distinct random configs that pass the sketch's check are measured in batches of
``--batch`` with ``LocalBuilder`` + ``LocalRunner`` (check, schedule, lower, C codegen, gcc, verification
against numpy, timing). Worker start-up is measured once, before, and reported apart. Prints candidates/s
and where the time went (build phase vs run phase wall time), then a sanity check of the harness's timing:
the default config of each task timed by the runner vs the same kernel timed through a compiled model
(``CompiledModel.timeit``), one thread each, best of three, interleaved.

    python scripts/bench_measure.py [--n 50] [--batch 10] [--tasks softmax,matmul] [--min-time-ms 20]

Tasks: ``softmax`` (the built-in softmax model, [64,128]) and ``matmul`` ([64,128] @ [128,64]).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from compiler.build import compile as compile_graph  # noqa: E402
from compiler.builder import GraphBuilder  # noqa: E402
from compiler.errors import ScheduleError  # noqa: E402
from compiler.frontend.models import get_model  # noqa: E402
from compiler.reference import random_inputs  # noqa: E402
from compiler.target import Target  # noqa: E402
from tuner.measure import MeasureInput, Measurer  # noqa: E402
from tuner.space import config_json  # noqa: E402
from tuner.task import Task, extract_tasks  # noqa: E402


def bench_tasks(names: list[str], target: Target) -> dict[str, Task]:
    out = {}
    for name in names:
        if name == "softmax":
            graph = get_model("softmax")
        elif name == "matmul":
            b = GraphBuilder("small_matmul")
            graph = b.build([b.matmul(b.input("a", (64, 128)), b.input("b", (128, 64)))])
        else:
            raise SystemExit(f"unknown task {name!r} (softmax, matmul)")
        out[name] = extract_tasks(graph, target)[0]
    return out


def random_configs(task: Task, n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    space = task.space()
    seen: set[str] = set()
    out: list[dict] = []
    for _ in range(100000):
        if len(out) == n:
            break
        config = {k.name: rng.choice(k.values) for k in space}
        try:
            task.check(config)
        except ScheduleError:
            continue
        if config_json(config) not in seen:
            seen.add(config_json(config))
            out.append(config)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=50, help="configs per task")
    ap.add_argument("--batch", type=int, default=10, help="candidates per measure() call")
    ap.add_argument("--tasks", default="softmax,matmul")
    ap.add_argument("--min-time-ms", type=float, default=20.0, help="measured time per candidate")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chunks-per-worker", type=int, default=None, help="LocalBuilder option")
    args = ap.parse_args()
    target = Target.host()
    tasks = bench_tasks(args.tasks.split(","), target)
    print(f"# measurement throughput on {target.key} ({target.cores} cores)")
    runner_options = {"min_time_ms": args.min_time_ms}
    builder_options = {}
    if args.chunks_per_worker:
        builder_options["chunks_per_worker"] = args.chunks_per_worker
    with Measurer("local", "local", target, builder_options, runner_options) as m:
        t0 = time.perf_counter()
        first = next(iter(tasks.values()))
        m.measure([MeasureInput(first, first.default())])
        print(f"worker start-up (first candidate, excluded below): {time.perf_counter() - t0:.2f} s")
        rows = []
        for name, task in tasks.items():
            configs = random_configs(task, args.n, args.seed)
            before = (m.stats.build_wall_s, m.stats.run_wall_s)
            statuses: Counter[str] = Counter()
            medians = []
            t0 = time.perf_counter()
            for k in range(0, len(configs), args.batch):
                batch = [MeasureInput(task, c) for c in configs[k : k + args.batch]]
                for r in m.measure(batch):
                    statuses[str(r.status)] += 1
                    if r.median_us is not None:
                        medians.append(r.median_us)
            wall = time.perf_counter() - t0
            build = m.stats.build_wall_s - before[0]
            run = m.stats.run_wall_s - before[1]
            rows.append((name, len(configs), wall, build, run, statuses, medians))
    print()
    print(
        "| task | candidates | wall s | candidates/s | build s (per cand ms) | run s (per cand ms) "
        "| statuses | best / median us |"
    )
    print("|---|---:|---:|---:|---:|---:|---|---|")
    total_n = total_wall = 0.0
    for name, n, wall, build, run, statuses, medians in rows:
        total_n += n
        total_wall += wall
        st = ", ".join(f"{k} {v}" for k, v in sorted(statuses.items()))
        lat = f"{min(medians):.2f} / {statistics.median(medians):.2f}" if medians else "-"
        print(
            f"| {name} | {n} | {wall:.2f} | {n / wall:.1f} | {build:.2f} ({1e3 * build / n:.0f}) "
            f"| {run:.2f} ({1e3 * run / n:.0f}) | {st} | {lat} |"
        )
    print(f"\noverall: {total_n / total_wall:.1f} candidates/s")
    print()
    print("| task | runner us (default config) | CompiledModel.timeit us | ratio |")
    print("|---|---:|---:|---:|")
    for name, task in tasks.items():
        runner_us, model_us = harness_vs_model(task, args.min_time_ms)
        print(f"| {name} | {runner_us:.1f} | {model_us:.1f} | {runner_us / model_us:.2f} |")


def harness_vs_model(task: Task, min_time_ms: float) -> tuple[float, float]:
    """Best of three interleaved rounds: the runner's median for the task's default config, and the
    median of a one-kernel compiled model of the task's group with that config, one thread each."""
    model = compile_graph(task.group.subgraph, task.target)
    model.num_threads = 1
    inputs = random_inputs(task.group.subgraph, 0)
    runner_us, model_us = [], []
    with Measurer("local", "local", task.target, {}, {"min_time_ms": min_time_ms, "num_threads": 1}) as m:
        for _ in range(3):
            (r,) = m.measure([MeasureInput(task, dict(task.default()))])
            if r.median_us is None:
                raise SystemExit(f"{task.name}: the default config did not measure: {r.status} {r.error}")
            runner_us.append(r.median_us)
            model_us.append(model.timeit(inputs, repeats=30)["median_us"])
    return min(runner_us), min(model_us)


if __name__ == "__main__":
    main()
