"""Shared helpers of the database tests: keys, record factories, a concurrent writer process."""

from __future__ import annotations

import hashlib
from typing import Any

from db.database import RecordIn, TuningDatabase

CPU = "cpu/x86_64/AMD EPYC 9B14/2"
GPU = "cuda/sm_90/NVIDIA H100 80GB HBM3"
GPU2 = "cuda/sm_80/NVIDIA A100-SXM4-40GB"


def wkey(i: int | str) -> str:
    """A workload key like the compiler's (sha256 hex)."""
    return hashlib.sha256(f"workload-{i}".encode()).hexdigest()


def add_basics(db: TuningDatabase, n_workloads: int = 3) -> list[str]:
    """Commit ``n_workloads`` workloads and the CPU and GPU targets; return the workload keys."""
    keys = [wkey(i) for i in range(n_workloads)]
    for i, key in enumerate(keys):
        db.commit_workload(key, {"ops": ["add"], "shape": [i + 1, 64]}, "pointwise", 1e6 * (i + 1), 8e6)
    db.commit_target(CPU, {"kind": "cpu", "cores": 2})
    db.commit_target(GPU, {"kind": "cuda", "arch": "sm_90"})
    return keys


def rec(
    workload: str,
    target: str = CPU,
    latencies: list[float] | None = None,
    *,
    status: str = "ok",
    config: dict[str, Any] | None = None,
    sketch: str = "pointwise",
    version: int = 1,
    error: str | None = None,
    run_id: int | None = None,
) -> RecordIn:
    """A RecordIn with sensible defaults (ok, latencies [10.0])."""
    if latencies is None and status == "ok":
        latencies = [10.0]
    return RecordIn(
        workload_key=workload,
        target_key=target,
        sketch=sketch,
        sketch_version=version,
        config=config if config is not None else {"vector": 8},
        latencies_us=latencies,
        status=status,
        error=error,
        run_id=run_id,
    )


def commit_worker(url: str, worker: int, count: int, barrier: Any) -> list[int]:
    """Run in a separate process: open ``url`` (maybe creating it), wait for the others, then commit
    ``count`` records one transaction each; return their ids."""
    barrier.wait(timeout=120)
    with TuningDatabase.open(url) as db:
        add_basics(db, 2)
        barrier.wait(timeout=120)
        keys = [wkey(0), wkey(1)]
        ids = []
        for i in range(count):
            r = rec(keys[i % 2], latencies=[float(worker * count + i + 1)], config={"w": worker, "i": i})
            ids.append(db.commit_record(r))
        return ids
