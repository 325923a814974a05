"""The CUDA contenders of `kiln bench` on the fake CuPy (the SIMT interpreter runs the kernels): prepared,
run, checked against the numpy reference. No timing figure means anything here; the GPU has not been
measured (no GPU was lent to this work)."""

from __future__ import annotations

import io

import pytest

from compiler.backends.cuda import nvrtc
from compiler.backends.cuda.codegen import kernel_names
from compiler.backends.cuda.device import current_cuda_target
from compiler.backends.cuda.lower import kernel_parts
from compiler.build import plan_model
from compiler.frontend.models import get_model
from compiler.loopir.stmt import PrimFunc
from compiler.target import Target
from tests.compiler.backends.cuda import fake_cupy
from tuner.bench.contenders import BenchContext, create_contenders
from tuner.bench.results import OK
from tuner.bench.runner import run_suite
from tuner.bench.suite import Suite, Workload


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):  # type: ignore[no-untyped-def]
    fake_cupy.install(monkeypatch)
    monkeypatch.delenv("KILN_DISABLE_CUPY", raising=False)
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(nvrtc, "_modules", {})
    current_cuda_target.cache_clear()
    fake_cupy.KERNELS.clear()
    fake_cupy.LAUNCHES.clear()
    yield fake_cupy
    current_cuda_target.cache_clear()


def test_kiln_on_the_fake_gpu_is_checked_and_timed(fake_gpu) -> None:  # type: ignore[no-untyped-def]
    for k in plan_model(get_model("softmax"), Target.parse("cuda")).kernels:
        for name, part in zip(kernel_names(k.func), kernel_parts(k.func.body)):
            fake_cupy.KERNELS[name] = PrimFunc(name, k.func.params, part, k.func.num_inputs)
    run = run_suite(
        Suite("g", (Workload("softmax", "softmax"),)), create_contenders("cuda", ["kiln", "kiln graph"]),
        BenchContext("cuda", 1), target_key="cuda/sm_90/Fake GPU", environment={},
        settings={"rounds": 2, "min_time": 0.001, "threads": 1}, measure_ceilings=False, log=io.StringIO(),
    )  # fmt: skip
    assert [r.contender for r in run.results] == ["kiln", "kiln graph"]
    for res in run.results:
        assert res.status == OK, res.error
        assert res.max_rel_err <= 1e-5 and len(res.rounds_us) == 2
    assert fake_gpu.LAUNCHES  # the kernels ran on the (fake) device
