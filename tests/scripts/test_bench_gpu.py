"""scripts/bench_gpu.py without a GPU: its workloads are larger than the L2, failures are kept as data,
rounds rotate, rows and reports say what was measured (and what failed), the report is rewritten after
every workload, and a dry run builds the models."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from compiler.target import Target
from scripts import bench_gpu as B


def test_memory_bound_workloads_do_not_fit_the_l2():
    l2 = Target.cuda().l2_bytes
    graphs = B.workloads([])
    assert set(B.MEMORY_BOUND) < set(graphs) and f"matmul_{B.GEMM}" in graphs
    for name in B.MEMORY_BOUND:
        g = graphs[name]
        assert not B.is_compute_bound(g)
        biggest = max(int(np.prod(v.shape)) * 4 for v in [*g.inputs, *g.outputs])
        assert biggest >= 2 * l2, f"{name}: {biggest} bytes per operand"
    assert B.is_compute_bound(graphs[f"matmul_{B.GEMM}"])


def test_unknown_memory_bound_kind_is_an_error():
    with pytest.raises(ValueError, match="unknown memory-bound workload kind 'conv'"):
        B.memory_bound_graph("x", "conv", (4, 4))


def test_attempt_turns_an_exception_into_a_failure():
    assert B.attempt("build", lambda: 3) == 3

    def boom():
        raise RuntimeError("nvrtc: bad\nsecond line")

    f = B.attempt("build", boom)
    assert isinstance(f, B.Failed) and f.stage == "build" and f.error == "RuntimeError: nvrtc: bad"
    assert f.cell().startswith("failed (build: RuntimeError: nvrtc: bad")


def test_rounds_rotate_the_order():
    names = ["a", "b", "c"]
    assert [B.rotated(names, k) for k in range(4)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]
    assert B.rotated([], 2) == []


def test_checked_keeps_only_correct_contenders_and_says_why_for_the_others():
    want = [np.ones((2, 3), np.float32)]

    def raises():
        raise MemoryError("out of device memory")

    contenders = {
        "good": lambda: [np.ones((2, 3), np.float32) + 1e-5],
        "wrong": lambda: [np.zeros((2, 3), np.float32)],
        "crash": raises,
        "unbuilt": B.Failed("build", "torch.compile: no C++ compiler"),
    }
    ok, notes = B.checked(contenders, want)
    assert list(ok) == ["good"] and notes["good"] == pytest.approx(1e-5, rel=0.1)
    assert notes["wrong"].stage == "check" and "max rel err 1.00e+00" in notes["wrong"].error
    assert notes["crash"].stage == "run" and "out of device memory" in notes["crash"].error
    assert notes["unbuilt"] is contenders["unbuilt"]


class FakeClock:
    def __init__(self):
        self.order: list[str] = []

    def kernel_us(self, fn, calls):
        self.order.append(fn())
        return [float(len(self.order))] * calls

    def wall_us(self, fn, iters):
        return 100.0


def test_a_contender_failing_while_timed_is_kept_as_failed():
    clock = FakeClock()
    state = {"n": 0}

    def flaky():
        state["n"] += 1
        if state["n"] > 1:
            raise RuntimeError("illegal memory access")
        return "flaky"

    out = B.time_contenders(clock, {"a": lambda: "a", "b": flaky, "c": lambda: "c"}, iters=2, rounds=3)
    assert out["b"] == B.Failed("time", "RuntimeError: illegal memory access")
    assert out["a"]["status"] == "ok" and out["a"]["calls"] == 6 and out["a"]["wall_us"] == 100.0
    assert clock.order == ["a", "flaky", "c", "c", "a", "c", "a"]  # rotated; b dropped after failing


def entry(kind="memory", **contenders):
    return {
        "kind": kind,
        "flops": 2e9 if kind == "compute" else 0.0,
        "bytes": 4_000_000,
        "contenders": contenders,
    }


def ok(kernel, wall=None):
    return {
        "status": "ok",
        "kernel_us": kernel,
        "wall_us": wall or kernel * 2,
        "kernel_iqr_us": [kernel, kernel],
    }


def test_rows_show_failures_rates_fractions_and_targets():
    ceil = {"copy_gbs": 2000.0, "sgemm_tflops": B.Failed("sgemm_tflops", "no torch")}
    e = entry(
        kiln=ok(2.0),
        **{"kiln graph": ok(1.0), "torch eager": ok(4.0), "torch.compile max-autotune": ok(1.5)},
        **{"torch.compile": B.Failed("build", "InductorError: no compiler")},
    )
    row = B.workload_row("softmax_8192x8192", e, ceil)
    assert row["kiln graph"] == "1.0 / 2.0"
    assert row["torch.compile"].startswith("failed (build: InductorError")
    assert row["kiln rate"] == "4,000.0 GB/s (kiln graph)"  # 4 MB in 1 us
    assert row["of ceiling"] == "200% of copy" and row["target"] == ">= 90%: met"
    assert row["vs max-autotune"] == "1.50x"
    mm = B.workload_row(f"matmul_{B.GEMM}", entry("compute", kiln=ok(1000.0)), ceil)
    assert mm["kiln rate"] == "2.0 TFLOP/s (kiln)" and mm["of ceiling"] == "n/a (sgemm_tflops not measured)"
    assert "target" not in mm
    none = B.workload_row("x", entry(kiln=B.Failed("build", "CompileError: x")), ceil)
    assert none["kiln"].startswith("failed (build") and none["kiln rate"] == "no Kiln result"


def test_report_is_rewritten_after_every_workload(tmp_path):
    md, js = tmp_path / "gpu.md", tmp_path / "gpu.json"
    report = B.Report("head", {"copy_gbs": 1000.0}, str(md), str(js), "Fake GPU (sm_90)")
    report.add("a", entry(kiln=ok(10.0)))
    assert "| a |" in md.read_text() and json.loads(js.read_text())["results"]["a"]["kind"] == "memory"
    report.add("b", entry(kiln=B.Failed("time", "RuntimeError: launch failed")))
    data = json.loads(js.read_text())
    assert data["results"]["b"]["contenders"]["kiln"] == {
        "status": "failed",
        "stage": "time",
        "error": "RuntimeError: launch failed",
    }
    assert "failed (time: RuntimeError: launch failed)" in md.read_text()


def test_header_names_every_ceiling_or_its_failure():
    args = argparse.Namespace(iters=10, rounds=5)
    ceil = {
        "copy_gbs": 3000.0,
        "sgemm_tflops": 50.0,
        "tf32_tflops": B.Failed("tf32", "x"),
        "fp16_tflops": None,
    }
    text = B.header("H100 (sm_90)", ceil, args)
    assert "3,000.0 GB/s" in text and "50.0 TFLOP/s" in text and "TF32 failed (tf32: x)" in text
    assert "FP16 not measured" in text and "L2 flush" in text


def test_dry_run_builds_the_selected_workloads(monkeypatch, capsys):
    monkeypatch.setenv("KILN_DISABLE_CUPY", "1")
    args = argparse.Namespace(models=[], only=["softmax_1024x65536"], dry_run=True, db=None)
    assert B.run(args, None) == 0
    assert "softmax_1024x65536: 1 kernels" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="unknown workload"):
        B.selected(argparse.Namespace(models=[], only=["nope"]))


def test_tensor_core_gemms_are_compiled_for_their_math_mode_and_checked_at_its_tolerance():
    from compiler.builder import GraphBuilder

    assert B.TARGETS["hgemm_4096"] == ("fp16_tflops", 0.80) and B.TARGETS["tf32_gemm_4096"] == (
        "tf32_tflops",
        0.80,
    )
    assert B.target_spec("tf32_gemm_4096") == "cuda+tf32" and B.target_spec("hgemm_4096") == "cuda"
    b = GraphBuilder("hgemm_4096")
    small = b.build([b.matmul(b.input("a", (8, 16), "float16"), b.input("b", (16, 8), "float16"))])
    inputs = {"a": np.ones((8, 16), np.float16), "b": np.full((16, 8), 0.5, np.float16)}
    (want,) = B.reference("hgemm_4096", small, inputs)
    assert want.dtype == np.float16 and (want == 8).all()
    assert B.check_tol("hgemm_4096", small) == 1e-2
    assert B.check_tol("tf32_gemm_4096", small) == 1e-2  # a float16 output: its own tolerance
    b32 = GraphBuilder("tf32_gemm_4096")
    g32 = b32.build([b32.matmul(b32.input("a", (8, 16)), b32.input("b", (16, 8)))])
    assert B.check_tol("tf32_gemm_4096", g32) == 5e-3 and B.check_tol("matmul_4096", g32) == B.CHECK_TOL


def test_dry_run_builds_the_tensor_core_gemms_with_the_tensorcore_sketch(monkeypatch, capsys):
    monkeypatch.setenv("KILN_DISABLE_CUPY", "1")
    args = argparse.Namespace(models=[], only=["hgemm_4096", "tf32_gemm_4096"], dry_run=True, db=None)
    assert B.run(args, None) == 0
    out = capsys.readouterr().out
    assert "hgemm_4096: 1 kernels" in out and "tf32_gemm_4096: 1 kernels" in out
    assert out.count("sketches tensorcore") == 2


def test_render_rewrites_a_runs_table_from_its_json(tmp_path, monkeypatch, capsys):
    md, js = tmp_path / "gpu.md", tmp_path / "gpu.json"
    report = B.Report("head", {"copy_gbs": 1000.0}, str(md), str(js), "Fake GPU (sm_90)")
    report.add("a", entry(kiln=ok(10.0)))
    report.add("b", entry(kiln=B.Failed("time", "RuntimeError: launch failed")))
    out = tmp_path / "rendered.md"
    argv = ["bench_gpu.py", "--render", str(js), "--rounds", "3", "--ran", "the run (today)"]
    argv += ["--out", str(out)]
    monkeypatch.setattr("sys.argv", argv)
    assert B.main() == 0
    table = md.read_text().split("\n\n", 2)[2]
    assert out.read_text().endswith(table)  # the same rows, cell for cell
    assert "Fake GPU (sm_90), measured by the run (today)" in out.read_text()
    assert "Rendered from that run's JSON by `python scripts/bench_gpu.py --render" in capsys.readouterr().out


def test_render_names_a_file_that_is_not_a_runs_json(tmp_path, monkeypatch):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    monkeypatch.setattr("sys.argv", ["bench_gpu.py", "--render", str(bad)])
    with pytest.raises(SystemExit, match=r"bad\.json: not a bench_gpu --json file"):
        B.main()
