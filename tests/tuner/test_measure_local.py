"""LocalBuilder + LocalRunner end to end: fault injection (every failure gets its status, the worker
survives or restarts), batching fallbacks in the builder, and real tasks of built-in models."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from compiler.errors import ScheduleError
from compiler.frontend.models import get_model
from db.status import Status
from tests.tuner.fault_sketch import (
    EXPECTED,
    FAULTS,
    SLOW_BUILD,
    fault_codegen,
    fault_codegen_prelude,
    fault_task,
)
from tuner.measure import MeasureInput, Measurer
from tuner.measure.cpu import LocalBuilder, LocalRunner
from tuner.task import extract_tasks


def cfg(fault: str, vector: int = 8, parallel: str = "none") -> dict:
    return {"fault": fault, "vector": vector, "parallel": parallel}


@pytest.fixture(scope="module")
def task():
    return fault_task("cpu")


@pytest.fixture(scope="module")
def measurer():
    builder = LocalBuilder(timeout_s=10.0, codegen=fault_codegen)
    runner = LocalRunner(timeout_s=2.0, min_time_ms=5.0)
    with Measurer(builder, runner) as m:
        yield m


def test_fault_batch_measures_completely(measurer, task):
    inputs = [MeasureInput(task, cfg(f)) for f in FAULTS]
    inputs += [MeasureInput(task, cfg("none", 1, "outer")), MeasureInput(task, cfg("none", 8, "outer"))]
    results = measurer.measure(inputs)
    assert len(results) == len(inputs)
    got = {inp.config["fault"]: r for inp, r in zip(inputs, results)}
    assert {f: str(r.status) for f, r in got.items()} == EXPECTED
    for inp, r in zip(inputs, results):
        if inp.config["fault"] == "none":
            assert r.ok and len(r.latencies_us) >= 3 and all(x > 0 for x in r.latencies_us)
            # (a parallel 1 us kernel takes milliseconds when other processes hold the cores)
            assert 0.05 < r.median_us < 1e6 and r.error == ""
        else:
            assert r.latencies_us is None and r.median_us is None and r.error
    assert "out-of-bounds write" in got["oob_write"].error and "'multiply'" in got["oob_write"].error
    assert "after output buffer" in got["oob_write"].error
    assert "SIGSEGV" in got["crash"].error
    assert "did not finish within 2 s" in got["hang"].error
    assert "max |error| 0.5" in got["wrong"].error
    assert "gcc failed" in got["compile_error"].error and "error:" in got["compile_error"].error
    assert "invalid on purpose" in got["invalid"].error
    # the worker was restarted after the crash and the hang: measuring again just works
    again = measurer.measure([MeasureInput(task, cfg("none")), MeasureInput(task, cfg("wrong"))])
    assert [r.status for r in again] == [Status.OK, Status.WRONG_RESULT]


def test_crash_restarts_the_worker(measurer, task):
    runner = measurer.runner
    measurer.measure([MeasureInput(task, cfg("none"))])
    pid, starts = runner.worker.process.pid, runner.worker.restarts
    # wrong results and out-of-bounds writes are caught in the worker, which keeps running
    survived = measurer.measure([MeasureInput(task, cfg("wrong")), MeasureInput(task, cfg("oob_write"))])
    assert [r.status for r in survived] == [Status.WRONG_RESULT, Status.RUNTIME_ERROR]
    assert runner.worker.process.pid == pid and runner.worker.restarts == starts
    crashed = measurer.measure([MeasureInput(task, cfg("crash"))])
    assert crashed[0].status == Status.RUNTIME_ERROR and "crashed" in crashed[0].error
    after = measurer.measure([MeasureInput(task, cfg("none", 1))])
    assert after[0].ok
    assert runner.worker.restarts == starts + 1 and runner.worker.process.pid != pid


def test_gcc_error_in_a_batch_spares_the_others(task):
    inputs = [MeasureInput(task, cfg("none")), MeasureInput(task, cfg("compile_error")),
              MeasureInput(task, cfg("none", 1, "outer"))]  # fmt: skip
    # one worker, one chunk: all three in one translation unit
    with LocalBuilder(workers=1, chunks_per_worker=1, codegen=fault_codegen) as b:
        res = b.build(inputs)
        assert [r.status for r in res] == [Status.OK, Status.COMPILE_ERROR, Status.OK]
        assert res[0].artifact == res[2].artifact  # the good ones were compiled together again
        assert "this" in res[1].error
    # errors gcc reports outside every kernel: the candidates are compiled one by one
    with LocalBuilder(workers=1, chunks_per_worker=1, codegen=fault_codegen_prelude) as b:
        res = b.build(inputs)
        assert [r.status for r in res] == [Status.OK, Status.COMPILE_ERROR, Status.OK]
        assert res[0].artifact != res[2].artifact and Path(res[0].artifact).exists()
        b.release(res)
        assert not Path(res[0].artifact).exists()


def test_build_timeout_kills_only_its_candidate(task):
    with LocalBuilder(workers=1, timeout_s=1.0) as b:
        res = b.build([MeasureInput(task, cfg(SLOW_BUILD)), MeasureInput(task, cfg("none"))])
        assert [r.status for r in res] == [Status.COMPILE_ERROR, Status.OK]
        assert "timed out" in res[0].error
        assert b.build([MeasureInput(task, cfg("none", 1))])[0].status == Status.OK


def _random_valid(t, n: int, seed: int) -> list[dict]:
    rng, out = random.Random(seed), [t.default()]
    space = t.space()
    while len(out) < n:
        c = {k.name: rng.choice(k.values) for k in space}
        try:
            t.check(c)
        except ScheduleError:
            continue
        out.append(c)
    return out


def test_real_tasks_measure_ok_with_plausible_latencies(measurer):
    (softmax,) = extract_tasks(get_model("softmax"), "cpu")
    matmul = extract_tasks(get_model("mlp"), "cpu")[1]  # [256,128] @ [10,128]^T + bias
    assert softmax.kind == "reduction" and matmul.kind == "contraction"
    inputs = [MeasureInput(t, c) for t in (softmax, matmul) for c in _random_valid(t, 3, 1)]
    results = measurer.measure(inputs)
    for inp, r in zip(inputs, results):
        assert r.status in (Status.OK, Status.INVALID_CONFIG), (inp.config, r.error)
        if r.ok:
            # physical lower bound: 2 cores cannot do more than ~1 TFLOP/s or move more than ~1 TB/s
            floor_us = max(inp.task.flops / 1e12, inp.task.bytes / 1e12) * 1e6
            assert floor_us < r.median_us < 1e6, (inp.config, r.latencies_us)
            assert len(r.latencies_us) >= 3 and r.build_seconds > 0 and r.run_seconds > 0
    assert results[0].ok and results[3].ok  # the defaults
