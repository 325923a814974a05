"""Several processes writing one database at once: nothing lost, nothing doubled."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

from db.database import TuningDatabase
from tests.db.helpers import CPU, commit_worker, wkey

WORKERS = 4
PER_WORKER = 500


def test_four_writers_commit_2000_records(shared_url: str) -> None:
    """4 processes open the same fresh database together (racing to create the schema), commit the same
    workloads and targets, then 500 records each, one transaction per record."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager, ProcessPoolExecutor(max_workers=WORKERS, mp_context=ctx) as pool:
        barrier = manager.Barrier(WORKERS)
        futures = [pool.submit(commit_worker, shared_url, w, PER_WORKER, barrier) for w in range(WORKERS)]
        ids = [f.result(timeout=300) for f in futures]
    all_ids = [i for chunk in ids for i in chunk]
    assert len(all_ids) == WORKERS * PER_WORKER == 2000
    assert len(set(all_ids)) == 2000
    with TuningDatabase.open(shared_url, create=False) as db:
        assert db.count_records() == 2000
        assert db.count_records("ok") == 2000
        assert len(db.workloads()) == 2 and db.target_keys() == sorted(db.target_keys())
        frame = db.records()
        assert sorted(frame["id"]) == sorted(all_ids)
        per_worker = frame["config"].map(lambda c: c["w"]).value_counts().to_dict()
        assert per_worker == dict.fromkeys(range(WORKERS), PER_WORKER)
        assert db.best(wkey(0), CPU).median_us == 1.0  # worker 0's first record
        assert len(db.best_many([wkey(0), wkey(1)], CPU)) == 2
