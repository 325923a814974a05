"""The CUDA builder and runner (tuner.measure.cuda) without a GPU: their worker processes import the fake
CuPy (``cupy_module``, the simulation hook), whose kernels run in the SIMT interpreter, with injected faults
(NVRTC error, too many resources, sticky illegal address, hang, wrong result, out-of-bounds write); then
tune -> query -> compile -> run for ``--target cuda`` end to end."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import tuner
from compiler.backends.cuda.codegen import kernel_names
from compiler.backends.cuda.device import current_cuda_target
from compiler.backends.cuda.lower import kernel_parts
from compiler.build import plan_model
from compiler.errors import KilnError
from compiler.frontend.models import get_model
from compiler.loopir.stmt import PrimFunc
from compiler.reference import random_inputs, run_reference
from db.database import TuningDatabase
from db.status import Status
from tests.compiler.backends.cuda import fake_cupy
from tuner.measure import MeasureInput, Measurer
from tuner.measure.cuda import LocalBuilder, LocalRunner
from tuner.measure.cuda.build import kernel_name
from tuner.records import database_config_source
from tuner.task import extract_tasks

FAKE = "tests.compiler.backends.cuda.fake_cupy"


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    fake_cupy.install(monkeypatch)
    monkeypatch.delenv("KILN_DISABLE_CUPY", raising=False)
    monkeypatch.delenv(fake_cupy.FAULTS_ENV, raising=False)
    registry = tmp_path / "kernels"
    registry.mkdir()
    monkeypatch.setenv(fake_cupy.REGISTRY_ENV, str(registry))  # spawned workers inherit it
    current_cuda_target.cache_clear()
    fake_cupy.KERNELS.clear()
    yield fake_cupy
    current_cuda_target.cache_clear()


def inject(monkeypatch, faults: dict[str, str]) -> None:
    monkeypatch.setenv(fake_cupy.FAULTS_ENV, json.dumps(faults))


def measurer(timeout_s: float = 60.0) -> Measurer:
    return Measurer(
        LocalBuilder(workers=2, cupy_module=FAKE),
        LocalRunner(cupy_module=FAKE, repeats=3, warmup_ms=0.0, sample_ms=0.0, timeout_s=timeout_s),
        "cuda",
    )


def softmax_inputs() -> list[MeasureInput]:
    """The softmax task's default config and two other legal configs."""
    (task,) = extract_tasks(get_model("softmax"), "cuda")
    default = task.default()
    configs = [default]
    for knob in task.space():
        for v in knob.values:
            c = {**default, knob.name: v}
            if c in configs:
                continue
            try:
                task.check(c)
            except Exception:
                continue
            configs.append(c)
            break
        if len(configs) == 3:
            break
    assert len(configs) == 3
    return [MeasureInput(task, c) for c in configs]


def test_build_check_and_time_on_the_fake_gpu(fake_gpu):
    inputs = softmax_inputs()
    with measurer() as m:
        builds = m.builder.build(inputs)
        assert [b.status for b in builds] == [Status.OK] * 3, [b.error for b in builds]
        kernels = builds[0].info["kernels"]
        assert kernels[0]["name"].startswith(kernel_name(inputs[0]))
        assert kernels[0]["num_regs"] == 32 and "local_size_bytes" in kernels[0]
        results = m.measure(inputs)
    assert [r.status for r in results] == [Status.OK] * 3, [r.error for r in results]
    assert all(len(r.latencies_us) == 3 and r.median_us > 0 for r in results)


def test_invalid_config_is_not_built(fake_gpu):
    (inp, *_) = softmax_inputs()
    with measurer() as m:
        (r,) = m.measure([MeasureInput(inp.task, {"no_such_knob": 1})])
    assert r.status == Status.INVALID_CONFIG


FAULTS = {
    "compile_error": (Status.COMPILE_ERROR, r"NVRTC failed to compile kernel\(s\) cand_\w+ .*injected_fault"),
    "resources": (Status.INVALID_CONFIG, "resources.*255 registers"),
    "sticky": (Status.RUNTIME_ERROR, "CUDA error during the verification run: .*illegal memory access"),
    "hang": (Status.TIMEOUT, "did not finish within"),
    "wrong_result": (Status.WRONG_RESULT, "max .error. .* exceeds"),
    "oob": (Status.RUNTIME_ERROR, "out-of-bounds write: .* after output buffer"),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_an_injected_fault_is_a_status_and_the_next_candidate_still_runs(fake_gpu, monkeypatch, fault):
    bad, good, other = softmax_inputs()
    inject(monkeypatch, {kernel_name(bad): fault})
    status, message = FAULTS[fault]
    with measurer(timeout_s=10.0 if fault == "hang" else 60.0) as m:
        results = m.measure([bad, good, other])
        restarts = m.runner.worker.restarts
    assert results[0].status == status, results[0].error
    assert results[0].latencies_us is None
    assert re.search(message, results[0].error, re.S), results[0].error
    assert [r.status for r in results[1:]] == [Status.OK, Status.OK], [r.error for r in results[1:]]
    if fault in ("sticky", "hang"):  # the poisoned / hung worker was replaced by a fresh one
        assert restarts == 1


def test_the_fake_sticky_error_poisons_its_process(fake_gpu, monkeypatch):
    inject(monkeypatch, {"k": "sticky"})
    monkeypatch.setattr(fake_cupy, "_sticky", [])
    fake_cupy.KERNELS["k"] = object()
    fn = fake_cupy.RawModule(code="").get_function("k")
    with pytest.raises(fake_cupy.CUDARuntimeError, match="illegal memory access"):
        fn((1, 1, 1), (1, 1, 1), ())
    with pytest.raises(fake_cupy.CUDARuntimeError, match="illegal memory access"):
        fake_cupy.empty((4,))


def test_without_cupy_the_builder_and_runner_say_so_in_one_line(monkeypatch):
    monkeypatch.setenv("KILN_DISABLE_CUPY", "1")
    for make, what in ((LocalBuilder, "building"), (LocalRunner, "measuring")):
        with pytest.raises(KilnError) as err:
            make()
        text = str(err.value)
        assert text.startswith(f"{what} CUDA candidates needs CuPy") and "\n" not in text
        assert text.endswith('pip install -e ".[cuda]"')
    with pytest.raises(KilnError, match="cupy_module 'no_such_module_here' cannot be imported"):
        LocalRunner(cupy_module="no_such_module_here")


def test_tune_query_compile_run_for_cuda_on_the_fake_gpu(fake_gpu, tmp_path):
    url = f"sqlite:///{tmp_path / 'k.db'}"
    with measurer() as m:
        # no confirmation rounds: the fake GPU's wall-clock timings could confirm the best record slower
        # than the default, and this test is about the record reaching the compiled model
        summary = tuner.tune(
            "softmax", "cuda", url, 4, batch=2, measurer=m, time_model=False, seed=1, confirm_rounds=0
        )
    (task,) = summary.tasks
    with TuningDatabase.open(url) as db:
        records = db.find_records(task.task.workload_key, summary.target)
    # a sampled config the sketch's check refuses is recorded as invalid_config, never measured
    statuses = [str(r.status) for r in records]
    assert "ok" in statuses and set(statuses) <= {"ok", "invalid_config"}, [r.error for r in records]
    assert summary.target.startswith("cuda/sm_90/Fake GPU") and summary.measured == 4
    assert task.best_us is not None and task.best_us <= task.default_us
    with TuningDatabase.open(url) as db:
        best = db.best(task.task.workload_key, summary.target)
        assert best.config == task.best_config and best.median_us == pytest.approx(task.best_us)
        plan = plan_model("softmax", "cuda", configs=database_config_source(db))
    model = tuner.compile("softmax", "cuda", db=url)
    (kernel,) = model.kernels
    assert kernel.extra["origin"] == "record" and kernel.config == task.best_config
    for k in plan.kernels:  # the fake device runs the loop IR of the same plan (the records' configs)
        for name, part in zip(kernel_names(k.func), kernel_parts(k.func.body)):
            fake_cupy.KERNELS[name] = PrimFunc(name, k.func.params, part, k.func.num_inputs)
    graph = get_model("softmax")
    inputs = random_inputs(graph, seed=3)
    for out, ref in zip(model.run(inputs), run_reference(graph, inputs)):
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)


def test_tuning_goes_on_after_faults(fake_gpu, monkeypatch, tmp_path):
    """A tuning run whose candidates hit every fault but the hang still finds a best ok config."""
    (task,) = extract_tasks(get_model("softmax"), "cuda")
    faults = ["compile_error", "resources", "sticky", "wrong_result", "oob"]
    bad = {}
    for knob in task.space():  # every non-default legal value of the first knobs: faulty candidates
        for v in knob.values:
            c = {**task.default(), knob.name: v}
            try:
                task.check(c)
            except Exception:
                continue
            if c != task.default() and len(bad) < len(faults):
                bad[kernel_name(MeasureInput(task, c))] = faults[len(bad)]
    inject(monkeypatch, bad)
    url = f"sqlite:///{tmp_path / 'k.db'}"
    with measurer() as m:
        summary = tuner.tune("softmax", "cuda", url, 8, batch=4, measurer=m, time_model=False)
    (result,) = summary.tasks
    assert summary.measured == 8 and result.best_us is not None
    with TuningDatabase.open(url) as db:
        records = db.find_records(result.task.workload_key, summary.target)
    statuses = {str(r.status) for r in records}
    assert "ok" in statuses and len(records) == 8


def test_with_cupy_but_no_gpu_the_builder_and_runner_say_so_in_one_line(fake_gpu, monkeypatch):
    monkeypatch.setattr(fake_cupy.runtime, "getDeviceCount", lambda: 0)
    for make, what in ((LocalBuilder, "building"), (LocalRunner, "measuring")):
        with pytest.raises(KilnError) as err:
            make()
        assert str(err.value) == (
            f"{what} CUDA candidates needs an NVIDIA GPU: "
            "CuPy is installed but no NVIDIA GPU is visible (cudaGetDeviceCount() == 0)"
        )


def test_the_runner_refuses_a_launch_beyond_the_kernels_resources(fake_gpu, monkeypatch):
    """Resources the builder could not see (here: injected after the build) are invalid_config at run."""
    inputs = softmax_inputs()[:2]
    with measurer() as m:
        builds = m.builder.build(inputs)
        assert [b.status for b in builds] == [Status.OK] * 2
        inject(monkeypatch, {kernel_name(inputs[0]): "resources"})  # the runner worker starts after this
        runs = m.runner.run(inputs, builds)
    assert runs[0].status == Status.INVALID_CONFIG and "255 registers" in runs[0].error
    assert runs[1].status == Status.OK and len(runs[1].latencies_us) == 3


def test_a_hung_compilation_is_killed_after_the_per_candidate_timeout(fake_gpu, monkeypatch):
    bad, good, _ = softmax_inputs()
    inject(monkeypatch, {kernel_name(bad): "compile_hang"})
    with LocalBuilder(workers=1, timeout_s=5.0, cupy_module=FAKE) as builder:
        builds = builder.build([bad, good])
    assert builds[0].status == Status.COMPILE_ERROR and "build timed out" in builds[0].error
    assert builds[1].status == Status.OK, builds[1].error


def test_a_kernel_over_the_shared_memory_limit_is_invalid_before_compiling(fake_gpu):
    """The contraction check estimates the staged tiles; lowering rounds a cooperative copy up to the block's
    1024 threads (A's 32 x 64 tile becomes 64 x 68 per stage), so 3 cp.async stages need 248,832 bytes, over
    the 227 KiB opt-in limit. The H200 refused these launches (CUDA_ERROR_INVALID_VALUE) until the builder
    checked the lowered kernels: now invalid_config, named, before NVRTC."""
    from compiler.builder import GraphBuilder

    b = GraphBuilder("wide")
    (task,) = extract_tasks(b.build([b.matmul(b.input("a", (512, 512)), b.input("b", (512, 512)))]), "cuda")
    tile = {"bm": 32, "bn": 256, "bk": 64, "stages": 3, "double_buffer": 0, "smem_pad": 4, "swizzle": 0}
    over = {**task.default(), **tile, "tm": 1, "tn": 8}  # 1024 threads
    fits = {**task.default(), **tile, "tm": 2, "tn": 8}  # 512 threads: 224,256 bytes
    for c in (over, fits):
        task.check(c)  # the sketch's estimate passes both
    with measurer() as m:
        builds = m.builder.build([MeasureInput(task, over), MeasureInput(task, fits)])
    assert builds[0].status == Status.INVALID_CONFIG
    assert re.search(r"needs 248832 bytes of shared memory per block, over the 232448 bytes", builds[0].error)
    assert builds[1].status == Status.OK, builds[1].error
