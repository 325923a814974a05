"""Measurement API without hardware: results, simulated builder/runner, Measurer semantics, factories,
the output comparison and gcc error attribution."""

from __future__ import annotations

import json

import numpy as np
import pytest
import threadpoolctl

import compiler.reference as reference
from compiler.errors import KilnError
from compiler.frontend.models import get_model
from compiler.target import Target
from db.status import Status
from tests.tuner.fault_sketch import fault_task
from tuner.measure import (
    Builder,
    BuildResult,
    MeasureInput,
    Measurer,
    MeasureResult,
    Runner,
    RunResult,
    create_builder,
    create_runner,
)
from tuner.measure.check import task_data
from tuner.measure.cpu import LocalBuilder, LocalRunner
from tuner.measure.cpu.build import blame
from tuner.measure.cpu.run_worker import compare
from tuner.measure.sim import SimulatedBuilder, SimulatedRunner
from tuner.space import config_json
from tuner.task import extract_tasks

GOOD = {"fault": "none", "vector": 8, "parallel": "none"}
GOOD2 = {"fault": "none", "vector": 1, "parallel": "outer"}
INVALID = {"fault": "invalid", "vector": 8, "parallel": "none"}


@pytest.fixture(scope="module")
def task():
    return fault_task("cpu")


def test_measure_result_median_and_json():
    r = MeasureResult([3.0, 1.0, 2.0, 10.0], Status.OK)
    assert r.ok and r.median_us == 2.5
    assert r.to_json()["status"] == "ok" and r.to_json()["median_us"] == 2.5
    bad = MeasureResult(None, Status.TIMEOUT, "slow")
    assert not bad.ok and bad.median_us is None


def test_simulated_runner_replays_by_config_json(task):
    timings = {config_json(GOOD): 5.0, config_json(GOOD2): [7.0, 8.0, 9.0]}
    with Measurer("simulated", SimulatedRunner(timings)) as m:
        res = m.measure([MeasureInput(task, GOOD2), MeasureInput(task, INVALID), MeasureInput(task, GOOD)])
    assert [r.status for r in res] == [Status.OK, Status.INVALID_CONFIG, Status.OK]
    assert res[0].latencies_us == [7.0, 8.0, 9.0] and res[0].median_us == 8.0
    assert res[2].latencies_us == [5.0, 5.0, 5.0]
    assert "invalid on purpose" in res[1].error and res[1].latencies_us is None


def test_simulated_runner_statuses_missing_and_callable(task):
    third = {"fault": "none", "vector": 8, "parallel": "outer"}
    timings = {
        (task.workload_key, config_json(GOOD)): "timeout",
        config_json(GOOD): 1.0,  # the (workload, config) key wins
        config_json(GOOD2): (Status.WRONG_RESULT, "off by 0.5"),
    }
    runner = SimulatedRunner(timings)
    res = Measurer("simulated", runner).measure([MeasureInput(task, c) for c in (GOOD, GOOD2, third)])
    assert [r.status for r in res] == [Status.TIMEOUT, Status.WRONG_RESULT, Status.RUNTIME_ERROR]
    assert res[1].error == "off by 0.5" and "no recorded timing" in res[2].error
    assert len(runner.history) == 3

    def fn(t, config):
        if config["parallel"] == "outer":
            raise RuntimeError("boom")
        return 2.0 * config["vector"]

    res = Measurer("simulated", SimulatedRunner(fn, repeats=5, noise=0.1, seed=1)).measure(
        [MeasureInput(task, GOOD), MeasureInput(task, GOOD2)]
    )
    assert res[0].ok and len(res[0].latencies_us) == 5
    assert all(14.4 <= x <= 17.6 for x in res[0].latencies_us)
    assert res[1].status == Status.RUNTIME_ERROR and "boom" in res[1].error


def test_simulated_builder_fail_hook(task):
    b = SimulatedBuilder(fail=lambda t, c: "no vectors today" if c["vector"] == 8 else None)
    res = Measurer(b, SimulatedRunner(lambda t, c: 1.0)).measure(
        [MeasureInput(task, GOOD), MeasureInput(task, GOOD2), MeasureInput(task, "not a dict")]
    )
    assert [r.status for r in res] == [Status.COMPILE_ERROR, Status.OK, Status.INVALID_CONFIG]
    assert res[0].error == "no vectors today"


def test_measurer_dedupes_identical_candidates_and_keeps_order(task):
    runner = SimulatedRunner(lambda t, c: {1: 3.0, 8: 4.0}[c["vector"]])
    inputs = [MeasureInput(task, dict(c)) for c in (GOOD, GOOD2, GOOD, GOOD2, GOOD)]
    res = Measurer("simulated", runner).measure(inputs)
    assert [r.median_us for r in res] == [4.0, 3.0, 4.0, 3.0, 4.0]
    assert len(runner.history) == 2  # measured once each
    res[0].latencies_us.append(99.0)  # results do not share their lists
    assert res[2].latencies_us == [4.0, 4.0, 4.0]


def test_measure_rounds_builds_once_and_orders_each_round(task):
    third = {"fault": "none", "vector": 8, "parallel": "outer"}
    latency = {("none", 8): 8.0, ("outer", 1): 1.0, ("outer", 8): 4.0}
    runner = SimulatedRunner(lambda t, c: latency[(c["parallel"], c["vector"])])
    builder = SimulatedBuilder()
    measurer = Measurer(builder, runner)
    inputs = [MeasureInput(task, dict(c)) for c in (GOOD, GOOD2, third, INVALID)]
    rounds = measurer.measure_rounds(inputs, 3)
    assert len(builder.built) == 3  # the valid ones, built once, not once per round
    for res in rounds:  # each round in input order; the invalid config fails every round
        assert [r.median_us for r in res] == [8.0, 1.0, 4.0, None]
        assert res[3].status == Status.INVALID_CONFIG

    def order() -> list[float]:
        got = [latency[(c["parallel"], c["vector"])] for c in (json.loads(c) for _, c in runner.history)]
        runner.history.clear()
        return got

    assert order() == [8, 1, 4, 4, 1, 8, 8, 1, 4]  # forward, reversed, forward
    measurer.measure_rounds(inputs, 3, rotate=True)
    assert order() == [8, 1, 4, 1, 4, 8, 4, 8, 1]  # round r starts at the r-th candidate


class _BrokenRunner(Runner):
    def run(self, inputs, builds):
        raise RuntimeError("runner bug")


class _SilentRunner(Runner):
    def run(self, inputs, builds):
        return [RunResult(Status.OK, []) for _ in inputs]


class _ShortBuilder(Builder):
    def build(self, inputs):
        return [BuildResult(Status.OK)]


def test_measurer_never_raises_for_broken_parts(task):
    inputs = [MeasureInput(task, GOOD), MeasureInput(task, GOOD2)]
    res = Measurer("simulated", _BrokenRunner()).measure(inputs)
    assert [r.status for r in res] == [Status.RUNTIME_ERROR] * 2 and "runner bug" in res[0].error
    res = Measurer(_ShortBuilder(), SimulatedRunner({})).measure(inputs)
    assert [r.status for r in res] == [Status.COMPILE_ERROR] * 2 and "returned 1 results" in res[0].error
    assert Measurer("simulated", SimulatedRunner({})).measure([]) == []
    res = Measurer("simulated", _SilentRunner()).measure(inputs[:1])
    assert res[0].status == Status.RUNTIME_ERROR and "no latencies" in res[0].error


def test_factories_accept_names_and_instances(monkeypatch):
    monkeypatch.setenv("KILN_DISABLE_CUPY", "1")  # as on a machine without CuPy
    runner = SimulatedRunner({})
    assert create_runner(runner) is runner and Runner.create(runner) is runner
    assert isinstance(create_builder("simulated"), SimulatedBuilder)
    assert isinstance(Builder.create("simulated"), SimulatedBuilder)
    assert isinstance(create_runner("simulated", timings={}), SimulatedRunner)
    with pytest.raises(KilnError, match="unknown runner 'gpu'"):
        create_runner("gpu")
    with pytest.raises(KilnError, match="unknown builder"):
        create_builder("remote")
    install = r'needs CuPy .* not installed: pip install -e "\.\[cuda\]"$'
    with pytest.raises(KilnError, match="measuring CUDA candidates " + install):
        create_runner("local", "cuda/sm_90/NVIDIA H100 80GB HBM3")
    with pytest.raises(KilnError, match="building CUDA candidates " + install):
        create_builder("local", "cuda/sm_90/NVIDIA H100 80GB HBM3")
    with pytest.raises(KilnError, match=r"no local builder for rocm targets: .* in tuner/measure/rocm/"):
        create_builder("local", Target(kind="rocm", arch="gfx90a", device="MI250"))
    assert isinstance(create_builder("local", "cpu"), LocalBuilder)
    assert isinstance(create_runner("local", "cpu"), LocalRunner)


def test_run_result_defaults():
    r = RunResult(Status.OK, [1.0])
    assert r.error == "" and r.seconds == 0.0


def test_compare_tolerance_nan_and_exact():
    ref = np.array([[1.0, -200.0], [3.0, np.nan]], np.float32)
    assert compare(ref.copy(), ref, "y") is None
    near = ref.copy()
    near[0, 0] += 0.019  # tolerance is 1e-4 * 200 = 0.02
    assert compare(near, ref, "y") is None
    far = ref.copy()
    far[1, 0] += 0.05
    msg = compare(far, ref, "y")
    assert msg is not None and "max |error| 0.05" in msg and "[1, 0]" in msg
    unwritten = ref.copy()
    unwritten[0, 1] = np.nan
    assert "NaN" in compare(unwritten, ref, "y")
    filled = ref.copy()
    filled[1, 1] = 0.0
    assert "NaN" in compare(filled, ref, "y")
    ints = np.arange(6, dtype=np.int32)
    assert compare(ints.copy(), ints, "i") is None
    wrong = ints.copy()
    wrong[4] = 7
    assert "1 of 6 elements differ" in compare(wrong, ints, "i")
    inf = np.array([np.inf, 1.0], np.float32)
    assert "got inf" in compare(
        np.array([np.inf, np.inf], np.float32), np.array([np.inf, 1.0], np.float32), "z"
    )
    assert compare(inf.copy(), inf, "z") is None


def test_gcc_errors_are_attributed_to_their_kernels():
    source = "\n".join(
        ["/* prelude */", "void kiln_set_num_threads(int n) {}", "void cand3(float* x) {", "  bad;", "}",
         "void cand7(float* x) {", "  worse;", "}"]
    )  # fmt: skip
    msg = (
        "gcc failed to compile kernel(s) cand3, cand7:\n"
        "kernel.c:4:3: error: 'bad' undeclared\nkernel.c:7:3: error: 'worse' undeclared"
    )
    blamed = blame(source, msg, {"cand3": 3, "cand7": 7})
    assert set(blamed) == {3, 7} and "'bad'" in blamed[3] and "'worse'" not in blamed[3]
    assert blamed[3].startswith("gcc failed to compile kernel(s) cand3:") and "'worse'" in blamed[7]
    assert blame(source, "gcc timed out after 8 s", {"cand3": 3, "cand7": 7}) == {}
    prelude = "gcc failed to compile kernel(s) prelude:\nkernel.c:1:1: error: junk"
    assert blame(source, prelude, {"cand3": 3, "cand7": 7}) == {}


def test_reference_runs_with_one_blas_thread(monkeypatch):
    """The numpy reference of a task is computed with one BLAS/OpenMP thread, so no BLAS thread is left
    spinning on the cores while the first candidate (the default config) is timed."""
    seen: list[int] = []
    real = reference.run_reference

    def spy(graph, inputs):
        seen.extend(p["num_threads"] for p in threadpoolctl.threadpool_info())
        return real(graph, inputs)

    monkeypatch.setattr(reference, "run_reference", spy)
    task = extract_tasks(get_model("matmul"), Target.parse("cpu"))[0]
    data = task_data(task)
    assert seen and set(seen) == {1}, seen  # every thread pool numpy and scikit-learn loaded: one thread
    assert data.refs[0].shape == tuple(task.group.outputs[0].type.shape)
