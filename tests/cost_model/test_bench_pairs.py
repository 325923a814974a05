"""scripts/bench_cost_model.py's ``collect --pairs``: pool configs plus their one-knob variants."""

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
