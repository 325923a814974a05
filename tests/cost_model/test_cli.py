"""`kiln cost-model train` and `features` (in process; `eval` runs as a subprocess in
tests/tuner/test_cost_filter.py)."""

from __future__ import annotations

import numpy as np

from cost_model.features import FEATURE_VERSION, N_FEATURES
from cost_model.model import load_model
from tests.cost_model.test_model import make_db
from tuner.cli import main


def test_train_saves_a_model_that_loads(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'k.db'}"
    make_db(url).close()
    out = tmp_path / "m.npz"
    assert main(["cost-model", "train", "--db", url, "--target", "cpu", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "trained gbdt on 75 records of 3 workloads" in text
    model = load_model(out)
    assert model.kind == "gbdt" and model.n_samples == 75
    assert model.predict(np.zeros((2, N_FEATURES))).shape == (2,)


def test_eval_json_and_errors(tmp_path, capsys):
    import json

    url = f"sqlite:///{tmp_path / 'k.db'}"
    make_db(url).close()
    args = ["cost-model", "eval", "--db", url, "--target", "cpu", "--format", "json", "--plot", ""]
    assert main([*args, "--model", "analytic", "--baseline", "random"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"analytic", "random"}
    assert len(data["analytic"]["workloads"]) == 3 and 0 < data["analytic"]["mean"]["top5"] <= 1
    assert main([*args, "--min-records", "1000"]) == 2
    assert "no workload" in capsys.readouterr().err


def test_features_lists_every_name(capsys):
    assert main(["cost-model", "features"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"feature version {FEATURE_VERSION}: {N_FEATURES} features"
    assert len(lines) == N_FEATURES + 1 and "est_log_cycles" in "\n".join(lines)
