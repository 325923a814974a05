"""scripts/bench_cost_model_cuda.py: the held-out rule and the held-out check over a CUDA tuning database."""

import numpy as np
import pytest

from compiler.target import Target
from cost_model.features import EST_INDEX, FeatureExtractor
from db.database import RecordIn, TuningDatabase
from db.status import Status
from scripts import bench_cost_model as cpu_bench
from scripts import bench_cost_model_cuda as cuda_bench
from tuner.space import config_json


def test_held_out_rule_takes_one_of_each_kind_in_every_nine():
    first = cuda_bench.FIRST
    for start in range(first, first + cuda_bench.COUNT - 8, 9):
        held = [k for k in range(start, start + 9) if cuda_bench.held_out(k)]
        assert held == [start, start + 1, start + 2]  # random_workload's kind is k % 3: one of each


def test_cuda_range_is_disjoint_from_the_cpu_sets():
    used = set()
    for name in ("HELDOUT3", "HELDOUT4", "DEVRAND", "RAND_CANDIDATES"):
        used |= {int(s.split("rand")[1].split("@")[0]) for s in getattr(cpu_bench, name).split(",")}
    cuda = set(range(cuda_bench.FIRST, cuda_bench.FIRST + cuda_bench.COUNT))
    assert not used & cuda
    assert cpu_bench.FULL_FIRST + 1000 <= cuda_bench.FIRST  # the whole-space (4000..), defer (5000..) draws


def test_heldout_scores_each_pool_and_a_perfect_prior_ranks_first(tmp_path):
    """Records whose latencies follow the analytic prior exactly: the prior's held-out top-1 is 1.000, every
    held-out workload gets a row, the report names both databases."""
    target = Target.cuda()
    ex = FeatureExtractor()
    urls = []
    for part, ks in (("a", range(7000, 7005)), ("b", range(7005, 7009))):
        url = f"sqlite:///{tmp_path}/cm_{part}.db"
        urls.append(url)
        db = TuningDatabase.open(url)
        db.commit_target(target.key, target.to_json())
        for k in ks:
            task = cuda_bench.workload_task(k, target)
            db.commit_workload(task.workload_key, task.group.canonical(), task.kind, task.flops, task.bytes)
            recs = []
            pool = {config_json(c): c for c in [task.default(), *cuda_bench.uniform_pool(task, 7, k)]}
            for c in pool.values():
                est = float(ex.get(task.group, target, c, task.sketch.name)[EST_INDEX])
                lat = float(2.0**est) / 1e3
                recs.append(RecordIn(task.workload_key, target.key, task.sketch.name, task.sketch.version, c,
                                     [lat, lat * 1.01, lat * 0.99], Status.OK))  # fmt: skip
            db.commit_records(recs)
        db.close()
    report = tmp_path / "report.md"
    argv = ["heldout", *(x for u in urls for x in ("--db", u)), "--report", str(report)]
    cuda_bench.main(argv)
    text = report.read_text()
    assert "cm_a.db`: 5 workloads" in text and "cm_b.db`: 4 workloads" in text
    assert "9 workloads (6 development, 3 held out)" in text
    prior_row = next(line for line in text.splitlines() if line.startswith("| analytic prior |"))
    cells = [c.strip() for c in prior_row.strip("|").split("|")]
    assert cells[4] == "1.000"  # held-out top-1 of the prior the latencies follow
    for k in (7000, 7001, 7002):
        assert f"| rand{k} |" in text
    assert not np.isnan(float(cells[5]))
    for kind in ("contraction", "pointwise", "reduction"):  # the defaults against their pools, 3 of each kind
        assert any(line.startswith(f"| {kind} | 3 |") for line in text.splitlines())


def test_heldout_names_a_missing_database(tmp_path):
    with pytest.raises(SystemExit, match="no such database file"):
        cuda_bench.main(["heldout", "--db", f"sqlite:///{tmp_path}/none.db"])
