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


def test_exhaust_set_alternates_kinds_and_frees_the_gpu_knobs():
    """The exhaustive set (fixed before measuring): contraction, reduction, contraction, ... from 8000, each
    searched over GPU_FREE_KNOBS with every other knob at the sketch's default."""
    target = Target.cuda()
    specs = cuda_bench.exhaust_specs(target)
    assert specs[:4] == [f"synth:rand{k}@gpu" for k in (8000, 8002, 8003, 8005)]
    kinds = [cpu_bench.get_task(s, target, sub=True).kind for s in specs]
    assert kinds == ["contraction", "reduction"] * cuda_bench.EXHAUST_PER_KIND
    assert cuda_bench.FIRST + cuda_bench.COUNT <= cuda_bench.EXHAUST_FIRST  # disjoint from collect's draws
    task = cpu_bench.get_task(specs[0], target, sub=True)
    free = {k.name for k in task.space() if len(k.values) > 1}
    assert free == set(cpu_bench.GPU_FREE_KNOBS["contraction"])
    default = task.default()
    fixed = [k for k in default if k not in free]
    assert all(c[k] == default[k] for c in cpu_bench.valid_configs(task)[:50] for k in fixed)


def test_an_unknown_sub_space_suffix_is_named():
    with pytest.raises(SystemExit, match=r"synth:rand8000@gpus: unknown sub-space @gpus; known: @cold"):
        cpu_bench.get_task("synth:rand8000@gpus", Target.cuda(), sub=True)


def _complete_table(url: str, target: Target, spec: str, ex: FeatureExtractor) -> None:
    """Every valid config of ``spec`` with a latency the inverse of the analytic prior's estimate (the
    prior ranks the best config last)."""
    db = TuningDatabase.open(url)
    db.commit_target(target.key, target.to_json())
    task = cpu_bench.get_task(spec, target, sub=True)
    db.commit_workload(task.workload_key, task.group.canonical(), task.kind, task.flops, task.bytes)
    recs = []
    for c in cpu_bench.valid_configs(task):
        est = float(ex.get(task.group, target, c, task.sketch.name)[EST_INDEX])
        lat = float(2.0**-est)
        recs.append(RecordIn(task.workload_key, target.key, task.sketch.name, task.sketch.version, c,
                             [lat, lat, lat], Status.OK))  # fmt: skip
    db.commit_records(recs)
    db.close()


def test_search_replays_only_complete_sub_spaces_and_never_writes_the_data(tmp_path):
    """A database holding one whole reduction sub-space (latencies the inverse of the prior's ranking) and
    part of a contraction's: only the complete one is searched; every method's trials come from the table;
    the data file is unchanged; the report states the protocol and the target comparison."""
    target = Target.cuda()
    ex = FeatureExtractor()
    data = tmp_path / "exhaust.db"
    url = f"sqlite:///{data}"
    _complete_table(url, target, "synth:rand8002@gpu", ex)
    db = TuningDatabase.open(url)
    task = cpu_bench.get_task("synth:rand8000@gpu", target, sub=True)
    db.commit_workload(task.workload_key, task.group.canonical(), task.kind, task.flops, task.bytes)
    db.commit_records([RecordIn(task.workload_key, target.key, task.sketch.name, task.sketch.version,
                                task.default(), [10.0], Status.OK)])  # fmt: skip
    db.close()
    train = f"sqlite:///{tmp_path}/train.db"
    tdb = TuningDatabase.open(train)
    tdb.commit_target(target.key, target.to_json())
    t2 = cuda_bench.workload_task(7002, target)
    tdb.commit_workload(t2.workload_key, t2.group.canonical(), t2.kind, t2.flops, t2.bytes)
    pool = cuda_bench.uniform_pool(t2, 12, 7002)
    tdb.commit_records([RecordIn(t2.workload_key, target.key, t2.sketch.name, t2.sketch.version, c,
                                 [float(i + 1)], Status.OK) for i, c in enumerate(pool)])  # fmt: skip
    tdb.close()
    before = data.read_bytes()
    report = tmp_path / "search.md"
    cuda_bench.main([
        "search", "--db", url, "--train", train, "--work", str(tmp_path / "work"), "--seeds", "0,1",
        "--trials", "12", "--methods", "tpe,tpe+analytic,tpe+gbdt,tpe+gbdt-warm", "--report", str(report),
        "--out", str(tmp_path), "--resamples", "50",
    ])  # fmt: skip
    assert data.read_bytes() == before
    text = report.read_text()
    assert "Sub-spaces searched: synth:rand8002@gpu." in text
    assert "| synth:rand8002@gpu | reduction | 162 |" in text
    assert "synth:rand8000@gpu |" not in text
    assert "2 seeds (0-1), 12 measured trials per run" in text
    assert "cold GBDT better than TPE + analytic prior" in text
    runs = list((tmp_path / "work" / "results").glob("t12_nodefault_*/*__*__*.json"))
    assert len(runs) == 8
    # --run-dir reports those runs again without running anything; runs of another protocol are refused
    again = tmp_path / "again.md"
    common = ["search", "--db", url, "--train", train, "--work", str(tmp_path / "nothing")]
    common += ["--out", str(tmp_path), "--resamples", "50"]
    cuda_bench.main([*common, "--trials", "12", "--run-dir", str(runs[0].parent), "--report", str(again)])
    assert not (tmp_path / "nothing" / "results").exists()
    assert again.read_text().split("## Search efficiency")[1] == text.split("## Search efficiency")[1]
    with pytest.raises(SystemExit, match=r"runs of target cuda/.* with 12 trials, not .* with 64"):
        cuda_bench.main([*common, "--run-dir", str(runs[0].parent)])


def test_compare_splits_partial_and_whole_tiles(tmp_path, capsys):
    """compare: per contraction sub-space, after/before medians of the configs with partial edge tiles and
    of those whose tiles divide the output (1472 x 1344: bm 128 leaves a partial tile, 64 does not)."""
    target = Target.cuda("sm_90", "NVIDIA H200")
    task = cpu_bench.get_task("synth:rand8000@gpu", target, sub=True)
    configs = cpu_bench.valid_configs(task)
    partial = [c for c in configs if c["bm"] == 128][:3]
    whole = [c for c in configs if c["bm"] == 64 and 1344 % c["bn"] == 0][:3]
    urls = []
    for name, factor in (("before", 1.0), ("after", 0.5)):
        url = f"sqlite:///{tmp_path}/{name}.db"
        urls.append(url)
        db = TuningDatabase.open(url)
        db.commit_target(target.key, target.to_json())
        db.commit_workload(task.workload_key, task.group.canonical(), task.kind, task.flops, task.bytes)
        recs = [(c, 100.0 * (factor if c in partial else 1.0)) for c in partial + whole]
        db.commit_records([RecordIn(task.workload_key, target.key, task.sketch.name, task.sketch.version, c,
                                    [lat], Status.OK) for c, lat in recs])  # fmt: skip
        db.close()
    cuda_bench.main(["compare", "--before", urls[0], "--after", urls[1]])
    out = capsys.readouterr().out
    assert "| synth:rand8000@gpu | 1472 x 1344 | 3 | 0.50 | 3 | 1.00 | 100.0 | 50.0 |" in out
