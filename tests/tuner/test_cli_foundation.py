"""`kiln models` and `kiln show` (in process through tests/cli.py; `kiln --help` also as a real process)."""

from __future__ import annotations

import json

from tests.cli import kiln, kiln_process


def test_models_lists_every_model():
    out = kiln("models", "--format", "json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    names = {r["name"] for r in rows}
    assert {"softmax", "encoder_layer", "resblock"} <= names and len(names) == 11
    assert all(r["ops"] >= 1 for r in rows)


def test_show_decomposed_softmax():
    out = kiln("show", "--model", "softmax", "--stage", "decomposed")
    assert out.returncode == 0, out.stderr
    assert "reduce_max(%0) {axes=[1], keepdims=true} : f32[64,1]" in out.stdout
    assert "= divide(%4, %6) : f32[64,128]" in out.stdout


def test_show_unknown_model_is_a_clean_error():
    out = kiln("show", "--model", "nope")
    assert out.returncode == 2
    assert "unknown model 'nope'" in out.stderr and "Traceback" not in out.stderr


def test_every_command_has_help():
    top = kiln_process("--help")  # the module entry point, as the console script runs it
    assert top.returncode == 0 and "tune" in top.stdout and "query" in top.stdout
    assert kiln("--help").stdout == top.stdout
    for cmd in ("models", "show"):
        assert kiln(cmd, "--help").returncode == 0
