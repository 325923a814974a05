"""`kiln bench` end to end: the regression gate on in-memory contenders with controlled timings (the
verdict must not depend on this shared machine's noise), and one real run of the quick suite for the
plumbing (stored, exported, reported, compared)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.bench import contenders as contenders_module
from tuner.bench.contenders import InMemoryContender
from tuner.bench.timing import ManualClock
from tuner.cli import main

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def fake_suite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A suite file timing two in-memory contenders ("fake kiln" 1000 us, "fake peer" 3000 us) on softmax;
    each `kiln bench` invocation gets contenders with a fresh noise seed."""
    seeds = iter(range(100, 200))
    clock = ManualClock()
    registry = dict(contenders_module.CPU_CONTENDERS)
    registry["fake kiln"] = lambda: InMemoryContender("fake kiln", 1000.0, seed=next(seeds), clock=clock)
    registry["fake peer"] = lambda: InMemoryContender("fake peer", 3000.0, seed=next(seeds), clock=clock)
    monkeypatch.setitem(contenders_module.REGISTRY, "cpu", registry)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.delenv("KILN_BENCH_SLOWDOWN", raising=False)
    path = tmp_path / "fake.toml"
    path.write_text(
        'contenders = ["fake kiln", "fake peer"]\nrounds = 5\nmin_time = 0.02\n'
        '[[workload]]\nmodel = "softmax"\n'
    )
    return path


def _bench(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(["bench", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_slowed_contender_fails_the_gate(
    fake_suite: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db = f"sqlite:///{tmp_path / 'k.db'}"
    common = ["--suite", str(fake_suite), "--db", db, "--no-ceilings"]
    status, out, err = _bench(capsys, *common, "--json", str(tmp_path / "first.json"))
    assert status == 0 and "stored bench run 1" in err and "| `softmax` | 1,001 ±0% | 2,993 ±1% |" in out

    status, out, err = _bench(capsys, *common, "--baseline", "last")  # same code again
    assert status == 0, out + err
    assert "compared with bench run 1" in out and out.count("no significant change") == 2
    assert "regression" not in out.replace("no significant regression", "")

    monkeypatch.setenv("KILN_BENCH_SLOWDOWN", "fake kiln=1.3")  # the test hook: every call 30% longer
    status, out, err = _bench(capsys, *common, "--baseline", "last", "--json", str(tmp_path / "slow.json"))
    assert status == 1, out + err
    kiln_line = next(line for line in out.splitlines() if line.split()[:3] == ["softmax", "fake", "kiln"])
    assert "regression" in kiln_line and "1.3" in kiln_line
    assert "significant regression: softmax (fake kiln) 1.3" in err
    peer_line = next(line for line in out.splitlines() if line.split()[:3] == ["softmax", "fake", "peer"])
    assert "no significant change" in peer_line
    monkeypatch.delenv("KILN_BENCH_SLOWDOWN")

    status, out, _ = _bench(capsys, "compare", "1", "3", "--db", db, "--format", "json")
    assert status == 1
    verdicts = {v["contender"]: v for v in json.loads(out)}
    assert (
        verdicts["fake kiln"]["verdict"] == "regression" and verdicts["fake peer"]["verdict"] != "regression"
    )
    status, out, _ = _bench(capsys, "compare", "1", "2", "--db", db)
    assert status == 0 and "regression" not in out
    status, out, _ = _bench(capsys, "compare", "3", "1", "--db", db)  # the other way round: faster
    assert status == 0 and "improvement" in out
    status, _, _ = _bench(capsys, "compare", str(tmp_path / "first.json"), str(tmp_path / "slow.json"))
    assert status == 1  # exported files compare like stored runs (no database needed)
    status, _, _ = _bench(capsys, "compare", "1", "3", "--db", db, "--threshold", "0.5")
    assert status == 0  # a 30% slowdown is under a 50% threshold

    status, out, _ = _bench(capsys, "list", "--db", db, "--format", "json")
    runs = json.loads(out)
    assert [r["run"] for r in runs] == [1, 2, 3] and all(r["suite"] == "fake" for r in runs)
    status, out, _ = _bench(capsys, "report", "3", "--db", db)
    assert "Test hook active: KILN_BENCH_SLOWDOWN {'fake kiln': 1.3}" in out


def test_bad_hook_and_unknown_contender_are_one_line_errors(
    fake_suite: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db = f"sqlite:///{tmp_path / 'k.db'}"
    monkeypatch.setenv("KILN_BENCH_SLOWDOWN", "fake kiln")
    status, _, err = _bench(capsys, "--suite", str(fake_suite), "--db", db)
    assert status == 2 and "CONTENDER=FACTOR" in err and "Traceback" not in err
    monkeypatch.setenv("KILN_BENCH_SLOWDOWN", "tvm=1.3")
    status, _, err = _bench(capsys, "--suite", str(fake_suite), "--db", db)
    assert status == 2 and "names contender(s) not in this run: tvm" in err
    monkeypatch.delenv("KILN_BENCH_SLOWDOWN")
    status, _, err = _bench(capsys, "--suite", str(fake_suite), "--db", db, "--contenders", "tvm")
    assert status == 2 and "unknown contender(s) 'tvm'" in err
    status, _, err = _bench(capsys, "--suite", str(fake_suite), "--db", db, "--baseline", "last")
    assert status == 2 and "holds 0 bench run(s) of suite 'fake'" in err


@pytest.mark.slow
def test_quick_suite_end_to_end(tmp_path: Path) -> None:
    """The real quick suite (fewer, shorter rounds): stored, exported, reported with charts, compared."""
    db = f"sqlite:///{tmp_path / 'k.db'}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("KILN_BENCH_SLOWDOWN", None)
    cmd = [sys.executable, "-m", "tuner.cli", "bench", "--suite", "quick", "--db", db, "--rounds", "4"]
    cmd += ["--min-time", "0.02", "--out", str(tmp_path / "r.md"), "--plot", str(tmp_path / "bars.png")]
    cmd += ["--csv", str(tmp_path / "r.csv")]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "stored bench run 1" in done.stderr
    text = (tmp_path / "r.md").read_text()
    for model in ("softmax", "layernorm", "mlp"):
        assert f"| `{model}` |" in text
    assert "kiln default us" in text and "onnxruntime us" in text and "numpy us" in text
    assert "- `kiln tuned`: unavailable:" in text  # a fresh database holds no tuning records
    assert "Load average" in text and "Ceilings" in text
    assert (tmp_path / "bars.png").read_bytes()[:4] == b"\x89PNG"
    rows = (tmp_path / "r.csv").read_text().splitlines()
    assert len(rows) == 1 + 3 * 5  # header + 3 workloads x 5 contenders
    compare = [sys.executable, "-m", "tuner.cli", "bench", "compare", "1", "1", "--db", db]
    done = subprocess.run(compare, capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert done.returncode == 0 and "no significant regression" in done.stderr
    export = [sys.executable, "-m", "tuner.cli", "bench", "export", "last", "--db", db]
    done = subprocess.run(export, capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    data = json.loads(done.stdout)
    assert data["format"] == "kiln-bench-run/1" and data["environment"]["cpu"]["threads"] >= 1
    assert data["settings"]["omp_wait_policy"] and data["ceilings"]["sgemm_gflops"] > 0
