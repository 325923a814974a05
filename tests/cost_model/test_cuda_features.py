"""Cost-model features of CUDA loop IR: finite for every CUDA task of zoo models under the default and random
legal configs; launch shape, coalescing, vector width, registers and occupancy respond to the schedule; the
analytic model ranks obviously bad schedules below the default; the GBDT trains and predicts on them."""

from __future__ import annotations

import random

import numpy as np
import pytest

from compiler.backends import get_backend
from compiler.backends.cuda.sketches.common import localize
from compiler.backends.sketch import output_blocks, place_windows, prepare
from compiler.builder import GraphBuilder
from compiler.errors import KilnError, ScheduleError
from compiler.frontend.models import get_model
from compiler.target import Target
from cost_model.features import (
    FEATURE_NAMES,
    N_FEATURES,
    FeatureExtractor,
    extract,
    lower_candidate,
    occupancy_of,
)
from cost_model.gbdt import GBDTModel
from cost_model.model import AnalyticModel
from cost_model.store_features import Machine
from tuner.task import extract_tasks

CUDA = Target.cuda()


def _value(vec: np.ndarray, name: str) -> float:
    return float(vec[FEATURE_NAMES.index(name)])


def _random_configs(task, n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    space = task.space()
    out = []
    for _ in range(n * 10):
        config = {k.name: rng.choice(k.values) for k in space}
        try:
            task.check(config)
        except ScheduleError:
            continue
        out.append(config)
        if len(out) == n:
            break
    return out


@pytest.mark.parametrize("model", ["softmax_large", "layernorm", "mlp"])
def test_every_cuda_task_has_finite_features(model):
    tasks = extract_tasks(get_model(model), CUDA)
    assert tasks
    fx = FeatureExtractor()
    for task in tasks:
        configs = [task.default(), *_random_configs(task, 4, seed=len(task.name))]
        vectors = []
        for config in configs:
            try:
                vec = extract(lower_candidate(task.group, config, CUDA, task.sketch.name), task.group, CUDA)
            except (ScheduleError, KilnError):
                assert config is not configs[0], f"{task.name}: the default config does not lower"
                continue
            assert vec.shape == (N_FEATURES,) and vec.dtype == np.float32
            assert np.all(np.isfinite(vec)), (task.name, config)
            assert np.array_equal(vec, fx.get(task.group, CUDA, config, task.sketch.name))
            assert _value(vec, "gpu_log_threads") > 0 and _value(vec, "gpu_log_blocks") > 0
            assert 0 < _value(vec, "gpu_occupancy") <= 1
            assert 0 < _value(vec, "gpu_lane_util") <= 1
            assert _value(vec, "gpu_vec_width") >= 1
            fracs = [_value(vec, f"gpu_frac_{k}") for k in ("coalesced", "bcast", "strided")]
            assert all(0 <= x <= 1 for x in fracs) and abs(sum(fracs) - 1) < 1e-4, fracs
            vectors.append(vec)
        scores = AnalyticModel().predict(np.stack(vectors))
        assert np.all(np.isfinite(scores))


def _pointwise():
    b = GraphBuilder("pw")
    y = b.tanh(b.add(b.input("x", (4096, 4096)), b.input("y", (4096,))))
    (task,) = extract_tasks(b.build([y]), CUDA)
    return task


def _hand_scheduled(task, threads: int, per_thread: int):
    """The output's elements fused, split into blocks of ``threads`` threads each handling ``per_thread``
    *consecutive* elements: a threadIdx.x stride of ``per_thread`` (uncoalesced when > 1)."""
    sch, _ = prepare(task.group)
    for out in output_blocks(sch):
        spatial = place_windows(sch, out)
        f = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
        bx, tx, _step = sch.split(f, [None, threads, per_thread])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
    localize(sch)
    return get_backend(CUDA).lower(sch.func, unroll=False)


def test_coalescing_and_vector_width_of_the_default_pointwise_schedule():
    task = _pointwise()
    default = FeatureExtractor().for_task(task, task.default())
    assert task.default()["vector"] == 4
    # float4 accesses: neighbouring threads are 4 elements apart, which is one access width: coalesced
    assert _value(default, "gpu_vec_width") > 1
    assert _value(default, "gpu_frac_strided") == 0.0
    assert _value(default, "gpu_frac_coalesced") > 0.5
    scalar = FeatureExtractor().for_task(task, dict(task.default(), vector=1))
    assert _value(scalar, "gpu_vec_width") == 1.0
    assert _value(scalar, "gpu_frac_strided") == 0.0


def test_analytic_model_ranks_bad_schedules_below_the_default():
    task = _pointwise()
    default = FeatureExtractor().for_task(task, task.default())
    uncoalesced = extract(_hand_scheduled(task, 256, 8), task.group, CUDA)
    one_thread = extract(_hand_scheduled(task, 1, 1), task.group, CUDA)
    assert _value(uncoalesced, "gpu_frac_strided") == 1.0
    assert _value(uncoalesced, "gpu_frac_coalesced") == 0.0
    assert _value(one_thread, "gpu_log_threads") == pytest.approx(1.0)  # log2(1 + 1)
    assert _value(one_thread, "gpu_lane_util") == pytest.approx(1 / 32)
    scores = AnalyticModel().predict(np.stack([default, uncoalesced, one_thread]))
    assert np.all(np.isfinite(scores))
    assert scores[0] > scores[1] and scores[0] > scores[2], scores


def test_analytic_model_puts_the_reduction_default_in_the_better_half():
    task = next(t for t in extract_tasks(get_model("softmax_large"), CUDA) if t.kind == "reduction")
    fx = FeatureExtractor()
    configs = _random_configs(task, 24, seed=1)
    vecs = [v for v in (fx.for_task(task, c) for c in configs) if v is not None]
    scores = AnalyticModel().predict(np.stack(vecs))
    default = AnalyticModel().predict(fx.for_task(task, task.default()))[0]
    assert np.isfinite(default) and np.all(np.isfinite(scores))
    assert default >= np.median(scores)


def test_reported_registers_override_the_estimate_and_limit_occupancy():
    task = _pointwise()
    func = lower_candidate(task.group, dict(task.default(), threads=1024), CUDA, task.sketch.name)
    estimated = extract(func, task.group, CUDA)
    assert _value(estimated, "gpu_regs_reported") == 0.0
    assert _value(estimated, "gpu_occupancy") == 1.0
    heavy = extract(func, task.group, CUDA, registers=128)
    assert _value(heavy, "gpu_regs_reported") == 1.0 and _value(heavy, "gpu_regs") == 128.0
    # 1024 threads x 64 registers = all 65536 registers of an SM: one resident block, 32 of 64 warps
    medium = extract(func, task.group, CUDA, registers=64)
    assert _value(medium, "gpu_occupancy") == pytest.approx(0.5)
    assert _value(medium, "gpu_occ_limiter") == 3.0
    assert _value(heavy, "gpu_occupancy") == 0.0  # 128 registers: the block does not fit an SM
    scores = AnalyticModel().predict(np.stack([estimated, medium, heavy]))
    assert np.all(np.isfinite(scores)) and scores[0] > scores[1] > scores[2]
    fx = FeatureExtractor()  # the extractor keeps reported and estimated vectors apart
    config = dict(task.default(), threads=1024)
    assert np.array_equal(fx.for_task(task, config, registers=64), medium)
    assert np.array_equal(fx.for_task(task, config), estimated)


def test_occupancy_follows_the_targets_sm_limits():
    h100, ada = Machine.of(CUDA), Machine.of(Target.cuda("sm_89", "NVIDIA L4", 58))
    assert (h100.sm_threads, ada.sm_threads) == (2048, 1536)
    occ, limiter, per_sm = occupancy_of(h100, 256, 0, 32)
    assert (occ, limiter, per_sm) == (1.0, 0, 8)
    occ, limiter, per_sm = occupancy_of(h100, 32, 0, 32)  # 32 blocks of one warp: half the warps
    assert (occ, limiter, per_sm) == (0.5, 1, 32)
    occ, limiter, _ = occupancy_of(h100, 256, 100 * 1024, 32)  # two blocks' shared memory fit
    assert limiter == 2 and occ == pytest.approx(16 / 64)
    occ, _, _ = occupancy_of(ada, 1024, 0, 32)
    assert occ == pytest.approx(32 / 48)


def test_gbdt_trains_and_ranks_cuda_candidates():
    task = _pointwise()
    fx = FeatureExtractor()
    configs = _random_configs(task, 30, seed=3)
    x = np.stack([fx.for_task(task, c) for c in configs])
    # a synthetic latency that prefers wide vectors and big blocks, which the model has to learn
    lat = np.array([100.0 / c["vector"] + 2000.0 / c["threads"] for c in configs])
    model = GBDTModel(seed=0, min_fit=8)
    model.update(x, lat, [task.group.workload_key] * len(configs))
    pred = model.predict(x)
    assert np.all(np.isfinite(pred))
    best, worst = int(np.argmin(lat)), int(np.argmax(lat))
    assert pred[best] > pred[worst]
