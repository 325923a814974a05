"""Tuning a float16 matmul on cuda end to end on the fake GPU (tests/compiler/backends/cuda/fake_cupy.py:
kernels built by the real builder workers, run in the SIMT interpreter by the runner worker, checked
against the reference with the float16 tolerance): the tensor-core candidates are measured ok and the
best record compiles back into the model."""

from __future__ import annotations

import pytest

import tuner
from compiler.builder import GraphBuilder
from db.database import TuningDatabase
from tests.tuner.test_measure_cuda import fake_gpu, measurer  # noqa: F401

pytestmark = pytest.mark.xdist_group("fake_gpu_tuning")


def test_tuning_a_float16_matmul_on_the_fake_gpu_measures_tensor_core_candidates(fake_gpu, tmp_path):  # noqa: F811
    b = GraphBuilder("tc_tune_e2e")
    graph = b.build([b.relu(b.matmul(b.input("a", (64, 32), "float16"), b.input("w", (32, 48), "float16")))])
    url = f"sqlite:///{tmp_path / 'k.db'}"
    with measurer() as m:
        summary = tuner.tune(
            graph, "cuda", url, 4, batch=2, measurer=m, time_model=False, seed=1, confirm_rounds=0
        )
    (task,) = summary.tasks
    assert task.task.sketch.name == "tensorcore"
    with TuningDatabase.open(url) as db:
        records = db.find_records(task.task.workload_key, summary.target)
    statuses = [str(r.status) for r in records]
    assert statuses.count("ok") >= 2 and set(statuses) <= {"ok", "invalid_config"}, [r.error for r in records]
    assert {r.sketch for r in records} == {"tensorcore"}
    model = tuner.compile(graph, "cuda", db=url)
    (kernel,) = model.kernels
    assert kernel.sketch == "tensorcore" and kernel.extra["origin"] == "record"
