from __future__ import annotations

import io

import numpy as np
import pytest

from compiler.builder import GraphBuilder
from tests.tuner.bench.fakes import BrokenContender, MissingContender, WrongContender, fake_pair
from tuner.bench.contenders import BenchContext, create_contenders
from tuner.bench.results import ERROR, OK, UNAVAILABLE, WRONG
from tuner.bench.runner import graph_costs, rel_err, run_suite
from tuner.bench.suite import Suite, Workload

SETTINGS = {"rounds": 4, "min_time": 0.01, "threads": 1}


def _run(contenders, **kw):  # type: ignore[no-untyped-def]
    suite = Suite("t", (Workload("softmax", "softmax"),))
    return run_suite(
        suite, contenders, BenchContext("cpu", 1), target_key="cpu/test", environment={"host": "h"},
        settings=SETTINGS, measure_ceilings=False, log=io.StringIO(), **kw,
    )  # fmt: skip


def test_checked_then_timed_and_failures_recorded() -> None:
    run = _run([*fake_pair(), WrongContender(), BrokenContender(), MissingContender()])
    by = {r.contender: r for r in run.results}
    assert by["fake kiln"].status == OK and by["fake kiln"].max_rel_err == 0.0
    assert len(by["fake kiln"].rounds_us) == 4
    assert by["fake kiln"].median_us == pytest.approx(1000, rel=0.05)
    assert by["fake peer"].median_us == pytest.approx(2000, rel=0.05)
    assert by["wrong"].status == WRONG and by["wrong"].rounds_us == [] and "> 0.001" in by["wrong"].error
    assert by["broken"].status == ERROR and "op softmax of softmax is not supported" in by["broken"].error
    assert by["missing"].status == UNAVAILABLE and by["missing"].error == "missingpkg is not installed"
    assert all(r.flops > 0 and r.bytes == 2 * 64 * 128 * 4 for r in run.results)
    assert by["fake kiln"].info["graph"] == "softmax"
    assert run.started_at <= run.finished_at


def test_slowdown_applies_to_the_named_contender_only() -> None:
    run = _run(fake_pair(), slowdown={"fake peer": 1.3})
    assert run.settings["slowdown"] == {"fake peer": 1.3}
    assert run.result("softmax", "fake peer").median_us == pytest.approx(2600, rel=0.05)
    assert run.result("softmax", "fake kiln").median_us == pytest.approx(1000, rel=0.05)


def test_graph_costs_are_derived_from_shapes() -> None:
    b = GraphBuilder("mm")
    out = b.matmul(b.input("a", (64, 32)), b.input("b", (32, 16)))
    flops, contraction, nbytes = graph_costs(b.build([out]))
    assert contraction == flops == 2 * 64 * 32 * 16
    assert nbytes == 4 * (64 * 32 + 32 * 16 + 64 * 16)


def test_rel_err() -> None:
    ref = [np.array([1.0, -4.0])]
    assert rel_err([np.array([1.0, -4.002])], ref, np.asarray) == pytest.approx(0.0005)
    assert rel_err([np.array([1.0])], ref, np.asarray) == float("inf")
    assert rel_err([], ref, np.asarray) == float("inf")
    assert rel_err([np.array([np.nan, 0.0])], ref, np.asarray) == float("inf")


def test_contender_registry() -> None:
    names = [c.name for c in create_contenders("cpu", None)]
    assert names == ["kiln default", "kiln tuned", "numpy", "onnxruntime", "torch eager", "torch.compile"]
    cuda = [c.name for c in create_contenders("cuda", None)]
    assert "torch.compile max-autotune" in cuda and "cupy" in cuda
    with pytest.raises(
        Exception, match="unknown contender\\(s\\) 'tvm' for --target cpu; known: kiln default"
    ):
        create_contenders("cpu", ["tvm"])


def test_real_contenders_agree_on_a_small_model() -> None:
    """Kiln, numpy and onnxruntime (IOBinding into preallocated outputs) pass the check on softmax."""
    run = _run(create_contenders("cpu", ["kiln default", "numpy", "onnxruntime"]))
    for r in run.results:
        assert r.status == OK, (r.contender, r.error)
        assert r.max_rel_err <= 1e-5
    assert "IOBinding" in run.result("softmax", "onnxruntime").note
    assert "single-threaded" in run.result("softmax", "numpy").note


def test_torch_peer_refuses_a_graph_with_unmapped_ops_by_name() -> None:
    pytest.importorskip("torch", reason="the torch peer needs torch (the torch extra)")
    from compiler.errors import KilnError
    from tuner.bench.torch_peer import graph_to_torch

    b = GraphBuilder("cat")
    x, y = b.input("x", (2, 3)), b.input("y", (2, 3))
    with pytest.raises(KilnError, match=r"no torch mapping for op\(s\) concat of cat"):
        graph_to_torch(b.build([b.concat([b.relu(x), y], axis=0)]))
