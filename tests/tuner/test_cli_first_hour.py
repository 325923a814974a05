"""What a new user touches in the first hour says what it did, and nothing surprises silently: `kiln
--version`, `kiln models --export-onnx`, a clear line when the onnx extra is missing, `--input-shape`
refused for built-in models, read-only uses of a database that never create it, warnings as one line,
artifact file modes, every command's `--db` help naming the same default, and models too large for memory
refused with the bytes they need (in process through tests/cli.py, a real process where one is needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

import tuner
import tuner.commands.common as common
from compiler.frontend.models import get_model
from compiler.runtime import memory_plan
from tests.cli import ROOT, kiln

MISSING_DB_COMMANDS = [
    ("compile", "--model", "softmax", "--use-db", "-o", "out"),
    ("compile", "--model", "softmax", "--db", "sqlite:///missing.db", "-o", "out"),
    ("query", "best", "--model", "softmax", "--target", "cpu"),
    ("query", "best", "--model", "softmax", "--target", "cpu", "--db", "sqlite:///missing.db"),
    ("db", "info"),
]


def _dynamic_relu(path: Path) -> Path:
    """An ONNX Relu whose input has two dynamic dimensions (N, M)."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", "M"])
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", "M"])
    graph = helper.make_graph([helper.make_node("Relu", ["input"], ["output"])], "relu", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _one_error_line(stderr: str, command: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"kiln {command}: error: "), stderr
    return lines[0]


def test_version_is_the_distributions():
    out = kiln("--version")
    assert out.returncode == 0
    try:
        expected = metadata.version("kiln-tuner")
    except metadata.PackageNotFoundError:
        expected = tuner.__version__
    assert out.stdout.strip() == f"kiln {expected}"
    assert expected == tuner.__version__  # pyproject.toml reads the version from tuner/__init__.py


def test_export_onnx_writes_a_file_the_commands_take(tmp_path):
    pytest.importorskip("onnx")
    path = tmp_path / "mlp.onnx"
    out = kiln("models", "--export-onnx", "mlp", str(path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"wrote {path}: model mlp (x: f32[256,784])")
    summary = json.loads(kiln("models", "--onnx", str(path), "--format", "json").stdout)
    assert summary["dynamic_inputs"] == [] and [i["shape"] for i in summary["inputs"]] == [[256, 784]]
    assert kiln("compile", "--model", str(path), "-o", str(tmp_path / "m")).returncode == 0
    run = kiln("run", str(tmp_path / "m"), "--repeats", "2", "--check")
    assert run.returncode == 0 and "vs the numpy reference" in run.stdout, run.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("nosuch", "x.onnx"), "unknown model 'nosuch'"),
        (("mlp", "mlp.txt"), "must end in .onnx"),
        (("mlp", "no/such/dir/mlp.onnx"), "does not exist"),
    ],
)
def test_export_onnx_bad_arguments(tmp_path, monkeypatch, args, message):
    pytest.importorskip("onnx")
    monkeypatch.chdir(tmp_path)
    out = kiln("models", "--export-onnx", *args)
    assert out.returncode == 2 and message in _one_error_line(out.stderr, "models")
    assert not any(tmp_path.iterdir())


def test_missing_onnx_package_names_the_extra(tmp_path, monkeypatch):
    real = common.find_spec
    monkeypatch.setattr(common, "find_spec", lambda name: None if name == "onnx" else real(name))
    for args in (
        ("models", "--export-onnx", "mlp", str(tmp_path / "mlp.onnx")),
        ("models", "--onnx", str(tmp_path / "mlp.onnx")),
        ("compile", "--model", str(tmp_path / "mlp.onnx"), "-o", str(tmp_path / "m")),
        ("show", "--model", str(tmp_path / "mlp.onnx"), "--stage", "graph"),
    ):
        out = kiln(*args)
        line = _one_error_line(out.stderr, args[0])
        assert out.returncode == 2 and "needs the onnx package" in line and 'pip install -e ".[onnx]"' in line
    assert not (tmp_path / "mlp.onnx").exists()


@pytest.mark.parametrize("command", ["compile", "show", "tune"])
def test_input_shape_is_refused_for_built_in_models(tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KILN_DB", raising=False)
    extra = {"compile": ["-o", "out"], "show": ["--stage", "graph"], "tune": ["--trials", "4"]}[command]
    out = kiln(command, "--model", "softmax", "--input-shape", "x=1x2", *extra)
    line = _one_error_line(out.stderr, command)
    assert out.returncode == 2
    assert "--input-shape x=1x2 does not apply to the built-in model softmax" in line
    assert not any(tmp_path.iterdir())  # nothing compiled, no database created


def test_input_shape_still_sets_dynamic_onnx_dims(tmp_path):
    model = _dynamic_relu(tmp_path / "relu.onnx")
    out = kiln("show", "--model", str(model), "--input-shape", "input=2x3", "--stage", "graph")
    assert out.returncode == 0 and "f32[2,3]" in out.stdout, out.stderr


@pytest.mark.parametrize("args", MISSING_DB_COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_read_only_uses_never_create_the_database(tmp_path, monkeypatch, args):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KILN_DB", raising=False)
    out = kiln(*args)
    line = _one_error_line(out.stderr, args[0])
    assert out.returncode == 2 and "does not exist" in line and "kiln tune" in line
    assert not any(tmp_path.iterdir())  # no kiln.db, no missing.db, no compiled model


def test_python_warnings_print_as_one_line_without_source(tmp_path):
    # a real process: pytest records warnings itself, so the CLI's formatting shows only outside it
    script = textwrap.dedent(
        """
        import sys, warnings
        import tuner.commands.models as models
        from tuner.cli import main

        def warn_and_list(args):
            warnings.warn("the cache is cold", UserWarning, stacklevel=1)
            return 0

        models.run = warn_and_list
        sys.exit(main(["models"]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == "kiln: warning: the cache is cold\n"


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_artifact_files_share_one_mode(tmp_path, umask):
    old = os.umask(umask)
    try:
        out = kiln("compile", "--model", "softmax", "-o", str(tmp_path / "m"))
    finally:
        os.umask(old)
    assert out.returncode == 0, out.stderr
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "m").iterdir()}
    assert set(modes) == {"manifest.json", "model.c", "model.so", "params.npz"}
    assert set(modes.values()) == {0o666 & ~umask}, modes


def test_every_db_option_names_the_same_default():
    for args in (
        ("cost-model", "eval"),
        ("cost-model", "train"),
        ("query", "best"),
        ("db", "info"),
        ("compile",),
        ("tune",),
    ):
        out = kiln(*args, "--help")
        text = " ".join(out.stdout.split())
        assert out.returncode == 0 and common.DEFAULT_DB_HELP in text, (args, text)


def test_a_model_too_large_for_memory_is_refused_at_compile_and_tune(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KILN_DB", raising=False)
    model = _dynamic_relu(tmp_path / "relu.onnx")
    for command, extra in (("compile", ["-o", "big"]), ("tune", ["--trials", "4"])):
        out = kiln(command, "--model", str(model), "--input-shape", "input=1000000x1000000", *extra)
        line = _one_error_line(out.stderr, command)
        # input and output: 2 * 10^12 float32 elements
        assert out.returncode == 2 and "model relu does not fit in memory" in line
        assert "(8,000,000,000,000 bytes)" in line and "available" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["relu.onnx"]


def test_the_planned_buffers_are_checked_too(tmp_path, monkeypatch):
    # mlp's inputs, params and outputs fit; its intermediate between the two matmuls does not
    graph = get_model("mlp")
    io_bytes = sum(v.type.nbytes for v in (*graph.inputs, *graph.params, *graph.outputs))
    monkeypatch.setattr(memory_plan, "available_memory", lambda: io_bytes + 1)
    out = kiln("compile", "--model", "mlp", "-o", str(tmp_path / "m"))
    line = _one_error_line(out.stderr, "compile")
    assert "model mlp does not fit in memory: its buffers need" in line
    assert not (tmp_path / "m").exists()


def test_out_of_memory_in_a_command_is_one_line(monkeypatch):
    import tuner.commands.compile as compile_command

    def allocate(args):
        raise MemoryError("Unable to allocate 37.3 GiB for an array with shape (100000, 100000)")

    monkeypatch.setattr(compile_command, "run_compile", allocate)
    out = kiln("compile", "--model", "softmax", "-o", "unused")
    line = _one_error_line(out.stderr, "compile")
    assert out.returncode == 2 and "out of memory: Unable to allocate 37.3 GiB" in line
