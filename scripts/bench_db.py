#!/usr/bin/env python
"""Benchmark of the tuning database (a script, not a test).

Measures, on file SQLite and on a throwaway PostgreSQL server (started here, PostgreSQL defaults: fsync and
synchronous_commit on):

- ``best()`` latency on a database of 100k records over 1k workloads (target: median < 2 ms);
- ``best_many()`` for 100 workloads at once;
- ``select_record()`` latency (what compile asks per kernel: the records and every confirmation of the
  workload, :mod:`db.selection`), each workload with a confirmation of its third-best ok config (faster)
  and of its best one (not faster), timed in the same rounds as ``best()``;
- commit throughput in records/s with one writer and with four writer processes (``commit_record``, one
  transaction per record, the way the tuner commits).

    python scripts/bench_db.py [--records 100000] [--workloads 1000] [--backends sqlite,postgresql]

Prints a Markdown table (copy it into benchmarks/db.md with the machine and date).
"""

from __future__ import annotations

import argparse
import multiprocessing
import platform
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from db.database import RecordIn, TuningDatabase  # noqa: E402
from db.records import ConfirmationIn  # noqa: E402

TARGET = "cpu/x86_64/bench/2"
OTHER_TARGET = "cuda/sm_90/bench"
STATUSES = ("compile_error", "runtime_error", "timeout", "wrong_result", "invalid_config")


def workload_key(i: int) -> str:
    import hashlib

    return hashlib.sha256(f"bench-{i}".encode()).hexdigest()


def populate(db: TuningDatabase, n_records: int, n_workloads: int, seed: int = 0) -> None:
    """n_workloads workloads; n_records records spread evenly, 90% ok on the main target, the rest errors
    or on a second target (so the index has to filter)."""
    rng = random.Random(seed)
    for i in range(n_workloads):
        db.commit_workload(workload_key(i), {"bench": i}, "pointwise", 1e6, 1e6)
    db.commit_target(TARGET, {"bench": True})
    db.commit_target(OTHER_TARGET, {"bench": True})
    batch: list[RecordIn] = []
    for j in range(n_records):
        w = workload_key(j % n_workloads)
        roll = rng.random()
        target = OTHER_TARGET if roll > 0.95 else TARGET
        status = "ok" if roll < 0.9 or roll > 0.95 else rng.choice(STATUSES)
        lat = [rng.uniform(5, 500) for _ in range(3)] if status == "ok" else None
        config = {"tile": rng.choice([8, 16, 32, 64]), "vector": rng.choice([1, 4, 8]), "j": j}
        batch.append(
            RecordIn(w, target, "pointwise", 1, config, lat, status, None if status == "ok" else "err")
        )
        if len(batch) == 2000:
            db.commit_records(batch)
            batch = []
    if batch:
        db.commit_records(batch)


DEFAULT = {"tile": 8, "vector": 1}  # no record has it (each config has a unique "j")


def confirm_some(db: TuningDatabase, n_workloads: int) -> None:
    """Per workload, confirm its best ok config not faster and its third best faster (the rule then reads
    past a not-faster record and an unconfirmed one to reach the confirmed one)."""
    for i in range(n_workloads):
        top = db.top_k(workload_key(i), TARGET, 3)
        for rec, faster in ((top[0], False), (top[-1], True)):
            best = [100.0] * 3
            db.commit_confirmation(
                ConfirmationIn(rec.workload_key, TARGET, "pointwise", 1, rec.config, DEFAULT, best,
                               [150.0 if faster else 50.0] * 3)
            )  # fmt: skip


def time_best(db: TuningDatabase, n_workloads: int, calls: int = 2000, seed: int = 1) -> dict[str, float]:
    rng = random.Random(seed)
    keys = [workload_key(rng.randrange(n_workloads)) for _ in range(calls)]
    for k in keys[:50]:  # warm up connections and statement caches
        db.best(k, TARGET)
        db.select_record(k, TARGET, DEFAULT)
    times, selects = [], []
    for i, k in enumerate(keys):  # the two alternate which goes first
        for which in ("best", "select") if i % 2 == 0 else ("select", "best"):
            t0 = time.perf_counter()
            found = db.best(k, TARGET) if which == "best" else db.select_record(k, TARGET, DEFAULT).record
            (times if which == "best" else selects).append((time.perf_counter() - t0) * 1e3)
            assert found is not None
    times.sort()
    selects.sort()
    many = []
    for _ in range(20):
        chunk = [workload_key(rng.randrange(n_workloads)) for _ in range(100)]
        t0 = time.perf_counter()
        db.best_many(chunk, TARGET)
        many.append((time.perf_counter() - t0) * 1e3)
    return {
        "best_median_ms": statistics.median(times),
        "best_p90_ms": times[int(0.9 * len(times))],
        "best_p99_ms": times[int(0.99 * len(times))],
        "best_many_100_ms": statistics.median(many),
        "select_median_ms": statistics.median(selects),
        "select_p99_ms": selects[int(0.99 * len(selects))],
    }


def _writer(url: str, worker: int, count: int, barrier) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    with TuningDatabase.open(url) as db:
        db.best(workload_key(0), TARGET)  # connect before the clock starts
        barrier.wait()
        t0 = time.perf_counter()
        for i in range(count):
            db.commit_record(
                RecordIn(workload_key(i % 10), TARGET, "pointwise", 2, {"w": worker, "i": i}, [1.0 + i], "ok")
            )
        return t0, time.perf_counter()


def time_commits(url: str, writers: int, per_writer: int) -> float:
    """Records per second with ``writers`` processes committing ``per_writer`` records each."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager, ProcessPoolExecutor(writers, mp_context=ctx) as pool:
        barrier = manager.Barrier(writers)
        spans = [
            f.result() for f in [pool.submit(_writer, url, w, per_writer, barrier) for w in range(writers)]
        ]
    start = min(s for s, _ in spans)
    end = max(e for _, e in spans)
    return writers * per_writer / (end - start)


def bench_backend(name: str, url: str, args: argparse.Namespace) -> dict[str, float]:
    t0 = time.perf_counter()
    with TuningDatabase.open(url) as db:
        populate(db, args.records, args.workloads)
        fill_s = time.perf_counter() - t0
        assert db.count_records() == args.records
        confirm_some(db, args.workloads)
        result = time_best(db, args.workloads)
    result["fill_records_per_s"] = args.records / fill_s
    result["commit_1_writer_per_s"] = time_commits(url, 1, args.commits)
    result["commit_4_writers_per_s"] = time_commits(url, 4, args.commits // 2)
    print(f"{name}: {result}", file=sys.stderr)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--workloads", type=int, default=1_000)
    parser.add_argument("--commits", type=int, default=2_000, help="records per writer for 1 writer")
    parser.add_argument("--backends", default="sqlite,postgresql")
    args = parser.parse_args()

    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as tmp:
        if "sqlite" in args.backends:
            results["SQLite file (WAL, synchronous=NORMAL)"] = bench_backend(
                "sqlite", f"sqlite:///{tmp}/bench.db", args
            )
        if "postgresql" in args.backends:
            from tests.postgres import running_server

            with running_server(durable=True) as pg:
                pg.janitor("kiln_bench").init()
                url = pg.url("kiln_bench")
                results["PostgreSQL 15 (local, fsync on)"] = bench_backend("postgresql", url, args)

    print(f"{args.records:,} records over {args.workloads:,} workloads; Python {platform.python_version()}\n")
    print(
        "| backend | best() median | best() p90 | best() p99 | best_many(100) | select_record() median | "
        "select_record() p99 | bulk fill | commit, 1 writer | commit, 4 writers |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        print(
            f"| {name} | {r['best_median_ms']:.3f} ms | {r['best_p90_ms']:.3f} ms | "
            f"{r['best_p99_ms']:.3f} ms | "
            f"{r['best_many_100_ms']:.1f} ms | {r['select_median_ms']:.3f} ms | "
            f"{r['select_p99_ms']:.3f} ms | "
            f"{r['fill_records_per_s']:,.0f} rec/s | "
            f"{r['commit_1_writer_per_s']:,.0f} rec/s | {r['commit_4_writers_per_s']:,.0f} rec/s |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
