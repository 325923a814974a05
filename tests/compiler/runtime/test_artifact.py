"""A compiled model directory with a missing or damaged file: loading it (``CompiledModel.load``, ``kiln
run``) names the file and the ``kiln compile`` command that rewrites the directory; a truncated or foreign
shared object is such an error too (checked against its sha256 before it is loaded), never a crash or a
silent rebuild. Files are written with one mode (0666 less the umask)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from compiler.errors import KilnError
from compiler.runtime import CompiledModel, artifact
from tests.cli import kiln


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A softmax compiled by `kiln compile` (its manifest records how)."""
    d = tmp_path_factory.mktemp("artifact") / "softmax"
    out = kiln("compile", "--model", "softmax", "-o", str(d))
    assert out.returncode == 0, out.stderr
    return d


@pytest.fixture
def model_dir(compiled: Path, tmp_path: Path) -> Path:
    d = tmp_path / "m"
    shutil.copytree(compiled, d)
    return d


def _fails(directory: Path, *words: str) -> str:
    """Loading ``directory`` fails with a KilnError naming ``words``, and `kiln run` says it in one line."""
    with pytest.raises(KilnError) as info:
        CompiledModel.load(directory)
    message = str(info.value)
    for word in words:
        assert word in message, message
    assert "; recompile it with `kiln compile --model " in message, message
    out = kiln("run", str(directory), "--repeats", "1")
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0] == f"kiln run: error: {message}"
    return message


def test_missing_params(model_dir: Path) -> None:
    (model_dir / "params.npz").unlink()
    message = _fails(model_dir, f"{model_dir / 'params.npz'} is missing")
    assert f"kiln compile --model softmax -o {model_dir}" in message


def test_damaged_params(model_dir: Path) -> None:
    (model_dir / "params.npz").write_bytes(b"PK\x03\x04 not really a zip")
    _fails(
        model_dir, f"{model_dir / 'params.npz'} does not match its manifest", "kiln compile --model softmax"
    )


def test_missing_source(model_dir: Path) -> None:
    (model_dir / "model.c").unlink()
    _fails(model_dir, f"{model_dir / 'model.c'} is missing", "kiln compile --model softmax")


def test_edited_source(model_dir: Path) -> None:
    with open(model_dir / "model.c", "a") as f:
        f.write("/* edited */\n")
    _fails(model_dir, "does not match its manifest", "kiln compile --model softmax")


def test_missing_manifest(model_dir: Path) -> None:
    (model_dir / "manifest.json").unlink()
    _fails(model_dir, f"{model_dir / 'manifest.json'} is missing", "kiln compile")


def test_manifest_not_json(model_dir: Path) -> None:
    path = model_dir / "manifest.json"
    path.write_text(path.read_text()[:200])
    _fails(model_dir, f"{path} is damaged (not JSON", "kiln compile")


def test_manifest_without_a_field(model_dir: Path) -> None:
    path = model_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["buffers"]
    path.write_text(json.dumps(manifest))
    _fails(model_dir, f"{path} is damaged (no buffers)", "kiln compile --model softmax")


def test_manifest_with_a_malformed_field(model_dir: Path) -> None:
    path = model_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["buffers"] = [{"id": 0}]
    path.write_text(json.dumps(manifest))
    _fails(model_dir, f"{path} is damaged (", "kiln compile --model softmax")


def test_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(KilnError, match="is not a directory"):
        CompiledModel.load(tmp_path / "nothing")


def test_truncated_shared_object_is_a_clear_error(model_dir: Path) -> None:
    so = model_dir / "model.so"
    so.write_bytes(so.read_bytes()[:100])
    _fails(model_dir, "model.so does not match its manifest")


def test_foreign_shared_object_is_a_clear_error(model_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    assert kiln("compile", "--model", "mlp", "-o", str(other)).returncode == 0
    shutil.copy(other / "model.so", model_dir / "model.so")
    _fails(model_dir, "model.so does not match its manifest")


def test_missing_shared_object_is_a_clear_error(model_dir: Path) -> None:
    (model_dir / "model.so").unlink()
    _fails(model_dir, "model.so is missing")


def test_params_replaced_by_other_valid_params_are_refused(model_dir: Path) -> None:
    np.savez(model_dir / "params.npz", p0=np.zeros(3, np.float32))
    _fails(model_dir, "params.npz does not match its manifest")


def test_an_intact_copy_loads_and_runs_like_the_original(compiled: Path, model_dir: Path) -> None:
    x = np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32)
    (expected,) = CompiledModel.load(compiled).run({"x": x})
    (got,) = CompiledModel.load(model_dir).run({"x": x})
    np.testing.assert_array_equal(got, expected)


def test_recompile_hint_spells_the_compile_command(tmp_path: Path) -> None:
    manifest = {
        "target": {"kind": "cuda"},
        "meta": {"model_source": "m.onnx", "input_shapes": {"input_ids": [1, 128]}},
    }
    assert artifact.recompile_hint(tmp_path, manifest) == (
        f"recompile it with `kiln compile --model m.onnx --input-shape input_ids=1x128 --target cuda "
        f"-o {tmp_path}`"
    )
    assert (
        artifact.recompile_hint(tmp_path) == f"recompile it with `kiln compile --model MODEL -o {tmp_path}`"
    )


def test_file_mode_follows_the_umask() -> None:
    old = os.umask(0o027)
    try:
        assert artifact.file_mode() == 0o640
    finally:
        os.umask(old)
    assert artifact.file_mode() == 0o666 & ~old
