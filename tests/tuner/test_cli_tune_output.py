"""Output of `kiln tune` for people and programs: the overall progress bar with ETA above the per-task
table, `--format json` (on `tune`, `compile` and `run`), and tuning curves (`kiln tune --plot`,
`kiln query curve`). Tuning measurements are simulated (tuner.measure.sim)."""

from __future__ import annotations

import io
import json
import re
import sys
import zlib

import pytest

from db.database import TuningDatabase
from tests.cli import kiln
from tuner.api import tune
from tuner.measure import Measurer
from tuner.measure.sim import SimulatedBuilder, SimulatedRunner
from tuner.progress import LiveProgress
from tuner.space import config_json

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def simulated() -> Measurer:
    runner = SimulatedRunner(lambda task, config: 10.0 + zlib.crc32(config_json(config).encode()) % 97 / 10)
    return Measurer(SimulatedBuilder(), runner)


@pytest.fixture
def url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'k.db'}"


@pytest.fixture
def sim(monkeypatch) -> None:
    """`kiln tune` in process with the simulated measurer."""
    monkeypatch.setattr("tuner.api.create_measurer", lambda target, workers=None: simulated())


def test_the_live_display_shows_an_overall_bar_with_eta(url: str, monkeypatch) -> None:
    """On a terminal (forced here), the live display is the overall bar (trials done of the budget,
    elapsed, ETA) above the per-task table; its last frame shows the whole budget spent."""
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich treats the StringIO as a terminal
    monkeypatch.setenv("COLUMNS", "160")
    screen = io.StringIO()
    tune(
        "layernorm",
        "cpu",
        url,
        12,
        batch=4,
        measurer=simulated(),
        time_model=False,
        progress=True,
        progress_file=screen,
    )
    text = ANSI.sub("", screen.getvalue())
    assert "━" in text and "kiln tune" in text
    assert re.search(r"12/12 trials\s+elapsed\s+\d:\d\d:\d\d\s+ETA \d:\d\d:\d\d", text), text[-2000:]
    assert re.search(r"4/12 trials\s+elapsed", text)  # an earlier frame, after the first batch
    assert "g0_reduce_sum" in text and "best us" in text  # the per-task table below the bar


def test_the_bar_renders_in_a_recording_console(url: str) -> None:
    """The renderable itself, recorded by a rich console with force_terminal: a time budget is shown
    by seconds, with what is left of it as the ETA."""
    from rich.console import Console

    summary = tune("softmax", "cpu", url, 4, batch=4, measurer=simulated(), time_model=False)
    console = Console(record=True, force_terminal=True, width=140, file=io.StringIO())
    from tuner.api import _database
    from tuner.search import TaskTuner

    with _database(url) as db:
        tuner = TaskTuner(summary.tasks[0].task, db, simulated(), seed=0)
        progress = LiveProgress([tuner], "10m", seconds=600, spent_seconds=150, done=4, console=console)
        console.print(progress.renderable())
    text = console.export_text()
    assert "kiln tune" in text and "━" in text and "4 trials" in text and "/600 s" in text
    eta = progress.eta_seconds()
    assert eta is not None and 0 < eta <= 450
    assert re.search(r"ETA 0:0[67]:\d\d", text), text


def test_without_a_terminal_each_batch_is_a_line_with_the_budget_and_eta(url: str, sim: None) -> None:
    out = kiln("tune", "--model", "layernorm", "--trials", "8", "--batch", "4", "--db", url, "--no-summary")
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("[")]
    assert len(lines) == 2 and "4/8 trials, ETA" in lines[0] and "8/8 trials, ETA 0:00:00" in lines[1]


def test_tune_format_json_is_the_summary_on_stdout(url: str, sim: None) -> None:
    out = kiln(
        "tune",
        "--model",
        "softmax",
        "--trials",
        "6",
        "--batch",
        "3",
        "--db",
        url,
        "--no-summary",
        "--format",
        "json",
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)  # nothing else on stdout
    assert data["model"] == "softmax" and data["trials"] == 6 and data["budget"]["trials"] == 6
    (task,) = data["tasks"]
    assert task["trials"] == 6 and task["best_us"] <= task["default_us"] and data["resumed"] is None
    assert "6/6 trials" in out.stderr  # the progress went to stderr
    with TuningDatabase.open(url) as db:
        (run,) = db.runs("softmax")
        assert run.id == data["run_id"]


def test_tune_plot_and_query_curve(url: str, sim: None, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "curve.png"
    out = kiln(
        "tune",
        "--model",
        "mlp",
        "--trials",
        "24",
        "--batch",
        "4",
        "--db",
        url,
        "--no-summary",
        "--plot",
        str(png),
    )
    assert out.returncode == 0, out.stderr
    assert f"tuning curves written to {png}" in out.stdout and png.read_bytes()[:8] == PNG_MAGIC
    q = kiln("query", "curve", "--model", "mlp", "--db", url, "--format", "json")
    assert q.returncode == 0, q.stderr
    rows = json.loads(q.stdout)
    with TuningDatabase.open(url) as db:
        tasks = db.model_tasks("mlp")
        assert len(rows) == db.count_records() == 24
        for key, _ in tasks:
            mine = [r for r in rows if r["workload"] == key]
            records = sorted(db.find_records(key), key=lambda r: r.id)  # measurement order
            assert [r["trial"] for r in mine] == list(range(1, len(records) + 1))
            ok = [rec.median_us if rec.status.value == "ok" else None for rec in records]
            assert [r["median_us"] for r in mine] == ok
            best = [r["best_us"] for r in mine if r["best_us"] is not None]
            assert best == sorted(best, reverse=True) and best[-1] == min(m for m in ok if m is not None)
    png2 = tmp_path / "q.png"
    p = kiln("query", "curve", "--model", "mlp", "--target", "cpu", "--db", url, "--plot", str(png2))
    assert p.returncode == 0 and png2.read_bytes()[:8] == PNG_MAGIC, p.stderr
    table = kiln("query", "curve", "--model", "mlp", "--db", url)
    assert table.returncode == 0 and "best_us" in table.stdout


def test_curves_of_an_unknown_model_and_without_matplotlib(
    url: str, sim: None, tmp_path, monkeypatch
) -> None:
    assert kiln("tune", "--model", "softmax", "--trials", "2", "--db", url, "--no-summary").returncode == 0
    none = kiln("query", "curve", "--model", "resnet_block", "--db", url)
    assert none.returncode != 0 and "no tasks recorded for model 'resnet_block'" in none.stderr
    assert "Traceback" not in none.stderr
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    q = kiln("query", "curve", "--model", "softmax", "--db", url, "--plot", str(tmp_path / "x.png"))
    assert q.returncode != 0 and "pip install matplotlib" in q.stderr and "Traceback" not in q.stderr
    t = kiln("tune", "--model", "softmax", "--trials", "2", "--db", url, "--plot", str(tmp_path / "y.png"))
    assert t.returncode != 0 and "pip install matplotlib" in t.stderr and len(t.stderr.splitlines()) == 1
    with TuningDatabase.open(url) as db:
        assert len(db.runs("softmax")) == 1  # refused before a run was opened


def test_compile_and_run_format_json(tmp_path) -> None:
    out_dir = tmp_path / "m"
    c = kiln("compile", "--model", "softmax", "-o", str(out_dir), "--format", "json")
    assert c.returncode == 0, c.stderr
    data = json.loads(c.stdout)
    assert data["model"] == "softmax" and data["output"] == str(out_dir) and data["kernels"] >= 1
    assert data["kernels_from_records"] is None and data["exit_status"] == 0
    assert "compiled softmax" in c.stderr  # the text went to stderr
    r = kiln("run", str(out_dir), "--repeats", "3", "--check", "--format", "json")
    assert r.returncode == 0, r.stderr
    ran = json.loads(r.stdout)
    assert ran["model"] == "softmax" and ran["repeats"] == 3 and ran["min_us"] <= ran["median_us"]
    assert ran["check"]["ok"] is True and ran["outputs"][0]["shape"]


def test_kiln_tune_ranks_with_the_gbdt_by_default_and_none_is_the_sampler_alone(
    url: str, monkeypatch
) -> None:
    """`kiln tune`'s default cost model is the GBDT (benchmarks/default_cost_model.md); `--cost-model none`
    still tunes with the sampler alone; the library's tune() keeps none (`kiln bench --tune` uses it)."""
    import inspect

    import tuner.api

    seen: list[str] = []

    def fake_tune(*args, **kwargs):
        seen.append(kwargs["cost_model"])
        raise SystemExit(0)

    monkeypatch.setattr(tuner.api, "tune", fake_tune)
    assert kiln("tune", "--model", "softmax", "--db", url, "--trials", "8").returncode == 0
    assert (
        kiln("tune", "--model", "softmax", "--db", url, "--trials", "8", "--cost-model", "none").returncode
        == 0
    )
    assert seen == ["gbdt", "none"]
    assert inspect.signature(tune).parameters["cost_model"].default == "none"
