"""Loop-IR features: fixed length, named, deterministic, versioned, fast, and responsive to the schedule
(SIMD, parallelism, register tiles, thread/block bindings on the GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.backends.cpu.sketches.reduction import cached_rows
from compiler.builder import GraphBuilder
from compiler.target import Target
from cost_model.features import (
    EST_INDEX,
    FEATURE_NAMES,
    FEATURE_VERSION,
    N_FEATURES,
    FeatureExtractor,
    extract,
    lower_candidate,
)
from tuner.task import extract_tasks

CPU = Target.host()
AVX512 = Target("cpu", "x86_64", "test cpu", cores=2, vector_bytes=64)


def _softmax(rows: int = 64, cols: int = 256, target: Target = AVX512):
    b = GraphBuilder("sm")
    (task,) = extract_tasks(b.build([b.softmax(b.input("x", (rows, cols)))]), target)
    return task


def _matmul(m: int = 64, k: int = 128, n: int = 128, target: Target = AVX512):
    b = GraphBuilder("mm")
    y = b.relu(b.matmul(b.input("a", (m, k)), b.input("b", (k, n))))
    (task,) = extract_tasks(b.build([y]), target)
    return task


def _pointwise(target: Target = AVX512):
    b = GraphBuilder("pw")
    (task,) = extract_tasks(b.build([b.tanh(b.add(b.input("x", (256, 512)), b.input("y", (512,))))]), target)
    return task


def f(task, config, name: str) -> float:
    vec = FeatureExtractor().for_task(task, config)
    assert vec is not None
    return float(vec[FEATURE_NAMES.index(name)])


def test_names_length_and_version():
    assert isinstance(FEATURE_VERSION, int) and FEATURE_VERSION >= 1
    assert len(FEATURE_NAMES) == N_FEATURES == len(set(FEATURE_NAMES))
    assert FEATURE_NAMES[EST_INDEX] == "est_log_cycles"
    groups = {n.split("_")[0] for n in FEATURE_NAMES}
    assert {"wl", "fn", "gpu", "tot", "wm", "r", "est", "s0", "s1", "s2"} <= groups


@pytest.mark.parametrize("make", [_softmax, _matmul, _pointwise])
def test_fixed_length_finite_and_deterministic(make):
    task = make()
    config = task.default()
    a = extract(lower_candidate(task.group, config, task.target), task.group, task.target)
    b = FeatureExtractor().for_task(make(), config)  # a fresh group and extractor
    assert a.dtype == np.float32 and a.shape == (N_FEATURES,)
    assert np.all(np.isfinite(a))
    np.testing.assert_array_equal(a, b)


def test_invalid_config_has_no_features():
    task = _softmax()
    bad = dict(task.default(), vector=3)
    assert FeatureExtractor().for_task(task, bad) is None


def test_vectorized_differs_from_scalar_and_is_estimated_faster():
    task = _softmax()
    base = dict(task.default(), accum=1, unroll=1)
    scalar, vector = dict(base, vector=1), dict(base, vector=16)
    fx = FeatureExtractor()
    vs, vv = fx.for_task(task, scalar), fx.for_task(task, vector)
    assert f(task, scalar, "s0_vec_lanes") == 1 and f(task, vector, "s0_vec_lanes") == 16
    assert vv[FEATURE_NAMES.index("wm_vec_eff")] > vs[FEATURE_NAMES.index("wm_vec_eff")]
    assert vv[EST_INDEX] < vs[EST_INDEX]


def test_more_accumulators_mean_more_dependency_chains():
    task = _softmax()
    one, four = dict(task.default(), vector=8, accum=1), dict(task.default(), vector=8, accum=4)
    assert f(task, four, "wm_log_chains") > f(task, one, "wm_log_chains")


def test_parallelism_shows():
    task = _softmax(rows=512)
    par, ser = dict(task.default(), parallel="rows"), dict(task.default(), parallel="none")
    assert f(task, par, "wm_speedup") == 2.0 and f(task, ser, "wm_speedup") == 1.0
    assert f(task, par, "fn_parallel_entries") == 1 and f(task, ser, "fn_parallel_entries") == 0
    fx = FeatureExtractor()
    assert fx.for_task(task, par)[EST_INDEX] < fx.for_task(task, ser)[EST_INDEX]


def test_register_tile_reduces_load_instructions():
    task = _matmul()
    small = dict(task.default(), mr=1, nr=16, vector=16, pack_b=0, pack_a=0)
    big = dict(small, mr=6, nr=32)
    assert f(task, big, "tot_log_mem_instr") < f(task, small, "tot_log_mem_instr")
    assert f(task, big, "wm_log_chains") > f(task, small, "wm_log_chains")


def test_workload_summary_grows_with_the_workload():
    small, large = _softmax(rows=64), _softmax(rows=1024)
    assert f(large, large.default(), "wl_log_flops") > f(small, small.default(), "wl_log_flops")
    assert f(small, small.default(), "wl_kind_reduction") == 1.0
    assert f(_matmul(), _matmul().default(), "wl_kind_contraction") == 1.0


def test_gpu_launch_features():
    cuda = Target.cuda()
    task = _matmul(256, 256, 256, target=cuda)
    config = task.default()
    names = ("gpu_log_threads", "gpu_log_blocks", "gpu_occupancy", "fn_log_shared_bytes", "s0_log_threads")
    values = {n: f(task, config, n) for n in names}
    assert all(v > 0 for v in values.values()), values
    cpu = _matmul()
    assert f(cpu, cpu.default(), "gpu_log_threads") == 0.0


def test_extraction_is_memoized():
    task = _matmul(256, 256, 256, target=CPU)
    fx = FeatureExtractor()
    configs = []
    for mr in (1, 2, 4, 6):
        for nr in (16, 32):
            c = dict(task.default(), mr=mr, nr=nr)
            try:
                task.check(c)
            except Exception:
                continue
            configs.append(c)
    first = [fx.for_task(task, c) for c in configs]
    again = [fx.for_task(task, c) for c in configs]
    assert fx.hits == len(configs) and fx.misses == len(configs)
    assert all(a is b for a, b in zip(first, again))  # the memo returns what it computed, not a recomputation


def test_tlb_misses_of_a_b_panel_read_in_place():
    # B of 1024 columns: rows 4 KiB apart, so the K loop of the micro-kernel touches a new page every step
    # when B is read in place (512 pages, beyond a first-level TLB) and a few pages when B is packed
    task = _matmul(m=64, k=512, n=1024)
    packed = dict(task.default(), mr=4, nr=32, vector=16, pack_a=0, pack_b=1, mc_tiles=1, nc_tiles=1)
    in_place = dict(packed, pack_b=0)
    assert f(task, in_place, "s0_log_tlb_misses") > f(task, packed, "s0_log_tlb_misses") + 3
    assert f(task, in_place, "est_log_cycles") > f(task, packed, "est_log_cycles")
    small = _matmul(m=32, k=16, n=64)  # all of it in a few pages: no misses
    assert f(small, small.default(), "s0_log_tlb_misses") == 0.0


def _add(rows: int, cols: int, target: Target = AVX512):
    b = GraphBuilder("add")
    (task,) = extract_tasks(b.build([b.add(b.input("x", (rows, cols)), b.input("y", (rows, cols)))]), target)
    return task


def test_streaming_stores_are_described_and_priced_by_cache_residency():
    """The ``store`` knob (non-temporal stores) used to leave the vector unchanged, so no model could tell
    a streamed candidate from its cached twin. The estimate now charges a streamed output that would have
    stayed in the last-level cache (DRAM on every call) and credits one that would not (no
    read-for-ownership)."""
    small = _pointwise()  # 1 MiB
    cached = dict(small.default(), vector=16, store="cached")
    stream = dict(cached, store="stream")
    fx = FeatureExtractor()
    assert f(small, stream, "s0_stream") == 1.0 and f(small, cached, "s0_stream") == 0.0
    assert f(small, stream, "fn_stream_frac") == 1.0 and f(small, cached, "fn_stream_frac") == 0.0
    assert f(small, stream, "fn_stream_llc") < 0 == f(small, cached, "fn_stream_llc")
    assert fx.for_task(small, stream)[EST_INDEX] > fx.for_task(small, cached)[EST_INDEX]
    # only full-vector float32 stores stream (codegen): a scalar loop's stores do not
    assert f(small, dict(stream, vector=1), "s0_stream") == 0.0
    large = _add(4096, 4096)  # 192 MiB: overflows the cache whatever the store does
    cached = dict(large.default(), vector=16, store="cached")
    stream = dict(cached, store="stream")
    assert f(large, stream, "fn_stream_llc") > 0
    assert fx.for_task(large, stream)[EST_INDEX] < fx.for_task(large, cached)[EST_INDEX]


def test_split_store_streams_the_rows_past_the_cached_ones():
    task = _softmax(rows=4096, cols=1024)  # 16 MiB in: 8 MiB of the output fits in 3/4 of a 32 MiB L3
    rows = cached_rows(task.group, task.target)
    assert 0 < rows < 4096
    split = dict(task.default(), store="split")
    streamed = 1.0 - rows / 4096
    assert f(task, split, "fn_stream_frac") == pytest.approx(streamed)
    assert max(f(task, split, f"s{k}_stream") for k in range(3)) == pytest.approx(streamed)
    assert f(task, dict(split, store="stream"), "fn_stream_frac") == 1.0


def test_workload_size_against_the_last_level_cache():
    small, large = _softmax(rows=64), _softmax(rows=8192, cols=1024)
    assert f(small, small.default(), "wl_log_llc") < 0 < f(large, large.default(), "wl_log_llc")
