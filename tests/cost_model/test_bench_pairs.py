"""scripts/bench_cost_model.py: `collect --pairs` (pool configs and one-knob variants), held-out sets."""

import importlib.util
import sys
from pathlib import Path

import pytest

from tuner.space import config_json

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_cost_model.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_cost_model", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_cost_model", mod)
    spec.loader.exec_module(mod)
    return mod


def test_pairs_differ_in_the_knob_alone_and_keep_the_pool(bench):
    target = bench.bench_target(1)
    task = bench.get_task("synth:matmul_768", target)
    pool = bench.uniform_pool(task, 12, seed=3)
    out = bench.with_knob_pairs(task, pool, "pack_a")
    keys = [config_json(c) for c in out]
    assert len(keys) == len(set(keys))
    assert {config_json(c) for c in pool} <= set(keys)
    values = {k.name: k.values for k in task.space()}["pack_a"]
    by_rest: dict[str, set] = {}
    for c in out:
        task.check(c)
        rest = config_json({k: v for k, v in c.items() if k != "pack_a"})
        by_rest.setdefault(rest, set()).add(c["pack_a"])
    assert len(by_rest) == len({config_json({k: v for k, v in c.items() if k != "pack_a"}) for c in pool})
    assert all(vals == set(values) for vals in by_rest.values())


def test_pairs_of_an_unknown_knob_name_the_knob(bench):
    target = bench.bench_target(1)
    task = bench.get_task("synth:matmul_768", target)
    with pytest.raises(SystemExit, match="pack_c"):
        bench.with_knob_pairs(task, bench.uniform_pool(task, 2, seed=0), "pack_c")


def test_second_held_out_set_is_new_and_stays_out_of_development(bench):
    """HELDOUT2's workloads build, are in no table, pool or cold set of the script, and every held-out set
    is excluded from development (heldout_keys: devcv, the warm starts and heldout's training sets)."""
    target = bench.bench_target(1)
    held2 = {bench.get_task(s, target).workload_key for s in bench.HELDOUT2.split(",")}
    assert len(held2) == len(bench.HELDOUT2.split(","))
    sets = ("BENCH", "DEV", "HELDOUT", "COLD_FIRST", "COLD_CANDIDATES", "COLD_EXTENSION", "MK_CANDIDATES")
    others = ",".join(getattr(bench, name) for name in (*sets, "MK_DEV", "DEV_CANDIDATES"))
    used = {
        bench.get_task(s.removesuffix("@cold").removesuffix("@mk"), target).workload_key
        for s in others.split(",")
    }
    assert not held2 & used
    assert held2 <= bench.heldout_keys(target)


def test_random_workloads_are_fixed_by_their_index_and_kind_cycles(bench):
    """The random cold set is defined by random_workload's seed alone: the same index builds the same
    workload in every process, kinds cycle pointwise / reduction / contraction, and every sub-space is
    searchable (enough valid configs)."""
    target = bench.bench_target(1)
    kinds = []
    for k in range(6):
        a = bench.get_task(f"synth:rand{k}@cold", target, sub=True)
        b = bench.get_task(f"synth:rand{k}@cold", target, sub=True)
        assert a.workload_key == b.workload_key
        kinds.append(a.kind)
        assert len(bench.valid_configs(a)) >= bench.COLD_MIN_CONFIGS
    assert kinds == ["pointwise", "reduction", "contraction"] * 2
    assert len(bench.RAND_CANDIDATES.split(",")) == 24


def test_the_third_held_out_set_stays_out_of_training(bench):
    target = bench.bench_target(1)
    keys = {bench.get_task(s, target).workload_key for s in bench.HELDOUT3.split(",")}
    rand = {bench.get_task(s, target).workload_key for s in bench.RAND_CANDIDATES.split(",")}
    assert len(keys) == 9 and keys <= bench.heldout_keys(target) and not keys & rand
    assert [bench.get_task(s, target).kind for s in bench.HELDOUT3.split(",")[:3]] == [
        "reduction",
        "contraction",
        "pointwise",
    ]


def test_the_fourth_held_out_set_and_the_random_development_pools_are_disjoint(bench):
    target = bench.bench_target(1)

    def keys(specs: str) -> set[str]:
        return {bench.get_task(s, target).workload_key for s in specs.split(",")}

    held4, devrand = keys(bench.HELDOUT4), keys(bench.DEVRAND)
    assert len(held4) == 12 and len(devrand) == 90
    assert held4 <= bench.heldout_keys(target) and not devrand & bench.heldout_keys(target)
    assert not (held4 | devrand) & keys(bench.RAND_CANDIDATES.replace("@cold", ""))
    assert bench.workload_list("DEVRAND") == bench.DEVRAND.split(",")
    assert bench.workload_list("HELDOUT4") == bench.HELDOUT4.split(",")
    assert bench.workload_list("a,,b") == ["a", "b"]


def test_devcv_rule_picks_the_best_variant_never_below_the_prior(bench):
    prior = [0.843, 0.942, 0.997, 0.988]
    aggregates = {
        "analytic": prior,
        "{} (default)": [0.970, 0.964, 0.9972, 0.9884],
        "wide": [0.972, 0.967, 0.997, 0.987],  # best mean, but below the prior on mean top-5
        "low": [0.940, 0.954, 0.9969, 0.988],  # 0.9969 prints as 0.997: not below
    }
    assert bench.devcv_rule(aggregates).endswith(": {} (default)")
    del aggregates["{} (default)"]
    assert bench.devcv_rule(aggregates).endswith(": low")
    del aggregates["low"]
    assert bench.devcv_rule(aggregates) == (
        "Rule: **fails**, every variant is below the prior somewhere (best mean wide: mean top-5)"
    )
    assert bench.higher(0.9796, 0.979) and not bench.higher(0.9804, 0.9796)


def test_the_whole_space_cold_set_is_drawn_by_its_rule_and_disjoint_from_every_other_set(bench):
    target = bench.bench_target(1)
    specs = bench.full_candidates(target)
    tasks = [bench.get_task(s, target, sub=True) for s in specs]
    assert [t.kind for t in tasks] == ["reduction"] * 3 + ["contraction"] * 3
    assert all(t.flops <= bench.FULL_MAX_FLOPS and t.free is None for t in tasks)
    # the whole space: no knob pinned to the default, unlike the @cold sub-space of the same workload
    whole = tasks[-1].space()
    sub = bench.get_task(specs[-1].replace("@full", "@cold"), target, sub=True).space()
    assert any(len(k.values) > 1 for k in whole if k.name not in bench.COLD_FREE_KNOBS["contraction"])
    assert all(len(k.values) == 1 for k in sub if k.name not in bench.COLD_FREE_KNOBS["contraction"])
    keys = {t.workload_key for t in tasks}
    others = ",".join(
        [bench.HELDOUT3, bench.HELDOUT4, bench.DEVRAND, bench.RAND_CANDIDATES.replace("@cold", "")]
    )
    assert not keys & {bench.get_task(s, target).workload_key for s in others.split(",")}
    assert not keys & bench.heldout_keys(target)
    # drawn in index order from FULL_FIRST: every skipped index below the last pick is another kind or too big
    picked = {int(s.removeprefix("synth:rand").removesuffix("@full")) for s in specs}
    for k in range(bench.FULL_FIRST, max(picked)):
        if k not in picked:
            t = bench.get_task(f"synth:rand{k}", target)
            assert (
                t.kind == "pointwise"
                or t.flops > bench.FULL_MAX_FLOPS
                or k > max(p for p in picked if bench.get_task(f"synth:rand{p}", target).kind == t.kind)
            )


def test_a_run_knows_only_the_features_it_computed_itself(bench):
    from cost_model.features import FeatureExtractor

    target = bench.bench_target(1)
    task = bench.get_task("synth:matmul_768", target)
    config = task.default()
    shared = FeatureExtractor()
    first, second = bench.run_extractor(shared), bench.run_extractor(shared)
    key = first.key(task.group, task.target, config, task.sketch.name)
    vec = first.for_task(task, config)
    assert first.peek(key)[0] and shared.misses == 1
    # another run has not featurized it: not known there (a new process would not know it either) ...
    assert second.peek(key) == (False, None)
    # ... and featurizing it there lowers nothing again
    assert (second.for_task(task, config) == vec).all() and shared.misses == 1 and shared.hits == 1


def _row(name, gbdt1, gbdt5, prior1, prior5, best=100.0, twins_out=True):
    return {
        "workload": name,
        "weight": 1,
        "best": best,
        "twins_out": twins_out,
        "gbdt_top1": gbdt1,
        "gbdt_top5": gbdt5,
        "analytic_top1": prior1,
        "analytic_top5": prior5,
    }


def test_pooled_held_out_judges_the_mean_difference_by_its_interval(bench, capsys):
    """All held-out sets pooled: GBDT is better only when the paired bootstrap interval of the mean
    top-5 difference lies above 0; one workload's win among ties is not enough; twins-kept rows are not
    pooled."""
    better = {
        "A": [_row(f"a{i}", 0.99, 0.99, 0.90, 0.95) for i in range(6)],
        "B": [_row(f"b{i}", 0.98, 1.00, 0.97, 0.96, best=10.0 * (i + 1)) for i in range(5)]
        + [_row("kept", 0.1, 0.1, 1.0, 1.0, twins_out=False)],
    }
    bench.print_pooled_heldout(better, resamples=200)
    out = capsys.readouterr().out
    assert "| A | 6 | 0.990 | 0.900 | 0.990 | 0.950 |" in out
    assert "Pooled over the 11 held-out workloads" in out
    assert "| top-5, mean | 0.995 | 0.955 | +0.040 (+0.040 to +0.040) | 11 | 0 |" in out
    assert "all held-out sets pooled" in out and "**met**" in out and "not met" not in out
    ties = [_row(f"t{i}", 0.95, 0.98, 0.95, 0.98) for i in range(9)]
    one_win = {"A": [_row("w", 1.0, 1.0, 0.9, 0.9), *ties]}
    bench.print_pooled_heldout(one_win, resamples=200)
    out = capsys.readouterr().out
    # a positive mean (+0.010) whose interval reaches 0 (resamples without the one win) is not "better"
    assert "| top-5, mean | 0.982 | 0.972 | +0.010 (+0.000 to " in out and "| 1 | 0 |" in out
    assert "**not met**" in out and "**met**" not in out


def test_headroom_is_what_the_prior_leaves_and_the_gbdt_share_of_it(bench):
    # (kind, prior top-1, prior top-5, GBDT top-1, GBDT top-5)
    rows = [
        ("reduction", 0.80, 0.90, 0.90, 1.00),  # room 0.10 at top-5, all of it taken
        ("reduction", 1.00, 1.00, 0.95, 0.98),  # no room, and the GBDT loses 0.02
        ("pointwise", 0.99, 0.995, 0.99, 0.995),  # room 0.005: below the 0.01 that counts a workload
    ]
    table = bench.headroom_table({"dev": rows}).splitlines()
    cells = {}
    for line in table[2:]:
        _, kind, n, k, prior, room, with_room, gain, share, better, worse = line.strip("| ").split(" | ")
        cells[kind, k] = (n, prior, room, with_room, gain, share, better, worse)
    assert cells["**all**", "5"] == (
        "3",
        f"{(0.90 + 1 + 0.995) / 3:.3f}",
        f"{(0.10 + 0 + 0.005) / 3:.3f}",
        "1",  # one workload with room above 0.01
        f"{(0.10 - 0.02) / 3:+.3f}",
        f"{(0.10 - 0.02) / 0.105:+.0%}",
        "1",
        "1",
    )
    assert cells["reduction", "1"][4] == f"{(0.10 - 0.05) / 2:+.3f}"
    assert cells["pointwise", "5"][2:6] == ("0.005", "0", "+0.000", "+0%")
    assert ("contraction", "5") not in cells  # a kind without rows gets no line


def test_first_batch_line_names_the_workloads_that_decide_the_cold_ratio(bench):
    by_seed = {
        ("a", "tpe+analytic"): {0: 1, 1: 3},
        ("a", "tpe+gbdt"): {0: 1, 1: 3},  # the same trials, all within the first batch: a tie by construction
        ("b", "tpe+analytic"): {0: 2, 1: 12},
        ("b", "tpe+gbdt"): {0: 2, 1: 65},  # past the first batch: decides
        ("c", "tpe+analytic"): {0: 4, 1: 4},
        ("c", "tpe+gbdt"): {0: 4, 1: 5},  # within the batch but not the same trials: decides
    }
    line = bench.first_batch_line(by_seed, ["a", "b", "c"], "tpe+gbdt", batch=8, budget=64)
    assert "on 1 of 3 workloads" in line
    assert "b: TPE + analytic 2, 12, cold GBDT 2, >64" in line
    assert "c: TPE + analytic 4, 4, cold GBDT 4, 5" in line
    assert "a:" not in line
    tied = bench.first_batch_line({k: v for k, v in by_seed.items() if k[0] == "a"}, ["a"], "tpe+gbdt", 8, 64)
    assert "on 1 of 1 workloads" in tied and tied.endswith("nothing else decides the direct ratio")
