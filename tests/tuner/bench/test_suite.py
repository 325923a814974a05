from __future__ import annotations

from pathlib import Path

import pytest

from compiler.errors import KilnError
from tuner.bench.suite import QUICK_MODELS, ZOO_MODELS, builtin_suite, load_suite_file, resolve_suite


def test_builtin_suites() -> None:
    quick = resolve_suite(["quick"])
    assert [w.model for w in quick.workloads] == list(QUICK_MODELS)
    assert "torch.compile" not in (quick.contenders or ())  # its compilation alone breaks the 2-minute budget
    zoo = resolve_suite(["zoo"])
    assert [w.name for w in zoo.workloads] == list(ZOO_MODELS) and zoo.contenders is None


def test_onnx_folder(tmp_path: Path) -> None:
    (tmp_path / "b.onnx").write_bytes(b"")
    (tmp_path / "a.onnx").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("")
    suite = resolve_suite(["onnx", str(tmp_path)])
    assert [w.name for w in suite.workloads] == ["a", "b"]
    assert suite.workloads[0].onnx_path == tmp_path / "a.onnx"
    (tmp_path / "empty").mkdir()
    with pytest.raises(KilnError, match=r"no \*\.onnx file"):
        builtin_suite("onnx", str(tmp_path / "empty"))
    with pytest.raises(KilnError, match="not a folder"):
        builtin_suite("onnx", str(tmp_path / "missing"))
    with pytest.raises(KilnError, match="needs exactly one folder"):
        resolve_suite(["onnx"])


def test_unknown_suite() -> None:
    with pytest.raises(KilnError, match="unknown suite 'nope'; built-in suites: quick, zoo, onnx"):
        resolve_suite(["nope"])


def test_suite_file(tmp_path: Path) -> None:
    (tmp_path / "nets").mkdir()
    (tmp_path / "nets" / "bert.onnx").write_bytes(b"")
    path = tmp_path / "mine.toml"
    path.write_text(
        'contenders = ["kiln default", "numpy"]\nrounds = 4\nmin_time = 0.05\n'
        '[[workload]]\nmodel = "layernorm"\n'
        '[[workload]]\nmodel = "nets/bert.onnx"\nname = "bert"\ninput_shapes = { input_ids = [1, 128] }\n'
    )
    suite = load_suite_file(path)
    assert suite.name == "mine" and suite.rounds == 4 and suite.min_time == 0.05
    assert suite.contenders == ("kiln default", "numpy")
    layer, bert = suite.workloads
    assert layer.model == "layernorm" and layer.onnx_path is None
    assert bert.name == "bert" and bert.model == str(tmp_path / "nets" / "bert.onnx")
    assert bert.input_shapes == {"input_ids": (1, 128)}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("rounds = [", "is not valid TOML"),
        ('colour = "red"\n[[workload]]\nmodel = "mlp"\n', "unknown key\\(s\\) colour"),
        ("rounds = 5\n", "needs at least one \\[\\[workload\\]\\]"),
        ("[[workload]]\nname = 'x'\n", "workload 1 needs model"),
        ('[[workload]]\nmodel = "gone.onnx"\n', "ONNX file .*gone.onnx does not exist"),
        ('rounds = 1\n[[workload]]\nmodel = "mlp"\n', "rounds must be an integer of at least 2"),
        ('min_time = -1\n[[workload]]\nmodel = "mlp"\n', "min_time must be a positive number"),
        ('[[workload]]\nmodel = "mlp"\n[[workload]]\nmodel = "mlp"\n', "repeated: mlp"),
        ('[[workload]]\nmodel = "mlp"\ninput_shapes = { x = [0] }\n', "input_shapes.x must be a list"),
    ],
)
def test_suite_file_errors_name_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(KilnError, match=message) as info:
        load_suite_file(path)
    assert str(path) in str(info.value) or "TOML" in str(info.value)


def test_missing_suite_file(tmp_path: Path) -> None:
    with pytest.raises(KilnError, match="cannot read suite file"):
        resolve_suite([str(tmp_path / "none.toml")])
