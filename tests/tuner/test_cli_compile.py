"""`kiln compile`, `kiln run` and `kiln show` stages (in process, through tests/cli.py)."""

from __future__ import annotations

import numpy as np

from tests.cli import kiln


def test_compile_then_run(tmp_path):
    out = kiln("compile", "--model", "rmsnorm", "--target", "cpu", "-o", str(tmp_path / "m"))
    assert out.returncode == 0, out.stderr
    assert "kernels" in out.stdout
    run = kiln("run", str(tmp_path / "m"), "--repeats", "3", "--check")
    assert run.returncode == 0, run.stderr
    assert "median" in run.stdout and "vs the numpy reference" in run.stdout


def test_run_checks_given_inputs(tmp_path):
    assert kiln("compile", "--model", "softmax", "-o", str(tmp_path / "m")).returncode == 0
    np.savez(tmp_path / "bad.npz", x=np.zeros((3, 3), np.float32))
    bad = kiln("run", str(tmp_path / "m"), "--inputs", str(tmp_path / "bad.npz"))
    assert bad.returncode == 2 and "x" in bad.stderr and "Traceback" not in bad.stderr
    np.savez(tmp_path / "wrong_name.npz", y=np.zeros((64, 128), np.float32))
    bad = kiln("run", str(tmp_path / "m"), "--inputs", str(tmp_path / "wrong_name.npz"))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_run_missing_directory_is_clean():
    out = kiln("run", "/nonexistent/kiln-model")
    assert out.returncode == 2 and "Traceback" not in out.stderr


def test_show_stages():
    groups = kiln("show", "--model", "layernorm", "--stage", "groups")
    assert groups.returncode == 0 and "reduction" in groups.stdout
    loopir = kiln("show", "--model", "softmax", "--stage", "loopir")
    assert loopir.returncode == 0 and "rfactor" in loopir.stdout and "vectorized for" in loopir.stdout
    code = kiln("show", "--model", "mlp", "--stage", "code")
    assert code.returncode == 0 and "kiln_parallel_for(" in code.stdout and "void g0_matmul(" in code.stdout
