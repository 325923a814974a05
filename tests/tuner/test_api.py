"""The library API: `tuner.tune(...)` returns a summary and always closes its run; `tuner.compile` reads the
records it left. Measurements are simulated (tuner.measure.sim), so no compiler or timing is involved."""

from __future__ import annotations

import zlib

import pytest

import tuner
from compiler.errors import KilnError
from db.database import TuningDatabase
from db.status import Status
from tests.cli import kiln
from tuner.api import TuneSummary, tune
from tuner.measure import Measurer, MeasureResult
from tuner.measure.sim import SimulatedBuilder, SimulatedRunner
from tuner.scheduler import Budget
from tuner.space import config_json


def simulated(latency: float = 10.0) -> Measurer:
    """Every valid config measures about ``latency`` us: a small offset from a checksum of its JSON tells
    configs apart, so the search sees a landscape."""
    runner = SimulatedRunner(
        lambda task, config: latency + zlib.crc32(config_json(config).encode()) % 97 / 10
    )
    return Measurer(SimulatedBuilder(), runner)


class ExplodingMeasurer:
    """A measurer whose every batch fails (as a lost device or a broken build setup would)."""

    def measure(self, inputs: list) -> list[MeasureResult]:
        raise RuntimeError("the measuring machine went away")

    def close(self) -> None:
        pass


@pytest.fixture
def url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'k.db'}"


def test_tune_returns_a_summary_of_what_it_measured(url: str) -> None:
    summary = tune("layernorm", "cpu", url, 6, batch=3, measurer=simulated(), time_model=False)
    assert isinstance(summary, TuneSummary) and summary.model == "layernorm"
    assert summary.measured == 6 and not summary.interrupted and summary.timing is None
    (task,) = summary.tasks
    assert task.measured == 6 and task.trials >= 6 and task.best_us is not None
    assert task.default_us is not None and task.best_us <= task.default_us  # the default is measured first
    assert task.speedup is not None and task.speedup >= 1.0
    assert summary.tuned_tasks == 1 and summary.coverage == 1.0
    assert summary.best_us == task.task.weight * task.best_us
    with TuningDatabase.open(url) as db:
        (run,) = db.runs("layernorm")
        records = db.find_records(task.task.workload_key, summary.target)
        assert run.id == summary.run_id and run.finished_at is not None
        assert run.command_line == "tuner.tune('layernorm')"
        assert len([r for r in records if r.run_id == summary.run_id]) == 6
        assert db.model_tasks("layernorm") == [(task.task.workload_key, 1.0)]
        best = db.best(task.task.workload_key, summary.target)
        assert best.median_us == pytest.approx(task.best_us) and best.config == task.best_config
    model = tuner.compile("layernorm", "cpu", db=url)  # exported from the package, reads the records
    assert model.kernels[0].extra["origin"] == "record" and model.kernels[0].config == task.best_config


def test_tune_takes_an_open_database_and_a_time_budget(url: str) -> None:
    with TuningDatabase.open(url) as db:
        summary = tuner.tune("softmax", db=db, budget=Budget(trials=4, seconds=60), measurer=simulated())
        again = tune("softmax", db=db, budget=2, measurer=simulated(), time_model=False)
        assert len(db.runs("softmax")) == 2
    assert summary.measured == 4 and again.measured == 2  # the second run measures only new configs
    assert again.tasks[0].trials >= 6 and again.tasks[0].measured == 2
    timing = summary.timing  # a whole-model CPU run ends by timing the compiled model, default vs tuned
    assert timing is not None and timing.kernels_from_records == timing.kernels == 1
    assert timing.default_us > 0 and timing.tuned_us > 0


def test_the_run_is_closed_when_measuring_fails(url: str) -> None:
    with pytest.raises(RuntimeError, match="went away"):
        tune("softmax", "cpu", url, 4, measurer=ExplodingMeasurer(), time_model=False)
    with TuningDatabase.open(url) as db:
        (run,) = db.runs("softmax")
        assert run.finished_at is not None


@pytest.fixture
def no_cupy(monkeypatch):
    """This machine as CI sees it: no CuPy (even where one is installed)."""
    from compiler.backends.cuda.device import current_cuda_target

    monkeypatch.setenv("KILN_DISABLE_CUPY", "1")
    current_cuda_target.cache_clear()
    yield
    current_cuda_target.cache_clear()


def test_tune_for_cuda_without_cupy_says_so_in_one_line_before_opening_a_run(url: str, no_cupy) -> None:
    """`kiln tune --target cuda` on a machine without CuPy (or a GPU): one line naming what is missing and
    the install command, a non-zero exit, and no run row at all (the check comes before the run)."""
    out = kiln("tune", "--model", "softmax", "--target", "cuda", "--trials", "2", "--db", url, "--no-summary")
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("kiln tune: error:") and "CuPy is not installed" in lines[0]
    assert 'pip install -e ".[cuda]"' in lines[0]
    from compiler.backends.cuda.device import CudaUnavailable

    with pytest.raises(CudaUnavailable, match="tuning for the cuda target needs CuPy"):
        tune("softmax", "cuda", url, 2)
    with TuningDatabase.open(url, create=True) as db:
        assert db.runs() == []


def test_tune_for_cuda_with_a_given_measurer_needs_no_cupy(url: str, no_cupy) -> None:
    """The check is about the default measurer: a measurer passed in (here simulated) is used as is."""
    summary = tune("softmax", "cuda", url, 2, measurer=simulated(), time_model=False)
    assert summary.measured == 2 and summary.target.startswith("cuda/")
    with TuningDatabase.open(url) as db:
        (run,) = db.runs("softmax")
        assert run.finished_at is not None


def test_bad_arguments_are_kiln_errors(url: str) -> None:
    with pytest.raises(KilnError, match="at least 1 trial"):
        tune("softmax", db=url, budget=0)
    with pytest.raises(KilnError, match="cost model"):
        tune("softmax", db=url, budget=2, cost_model="oracle")
    with pytest.raises(KilnError, match="matches no task"):
        tune("softmax", db=url, budget=2, tasks=["zzzz"])
    with TuningDatabase.open(url, create=True) as db:
        assert db.runs() == []  # argument errors are found before a run is opened


def test_records_of_a_failed_measurement_are_data(url: str) -> None:
    """Candidates that fail are recorded with their status and never become the best."""
    runner = SimulatedRunner(lambda task, config: Status.WRONG_RESULT if config != task.default() else 5.0)
    summary = tune(
        "softmax", db=url, budget=4, measurer=Measurer(SimulatedBuilder(), runner), time_model=False
    )
    (task,) = summary.tasks
    assert task.best_us == 5.0 and task.errors.get("wrong_result", 0) >= 1


@pytest.mark.parametrize("cost_model", ["analytic", "gbdt"])
def test_cuda_tuning_with_a_cost_model_then_compile_from_the_records(
    url: str, no_cupy, cost_model, tmp_path
) -> None:
    """The cost models rank CUDA candidates inside a tune (simulated measurements), and `kiln compile
    --target cuda --db` (code generation only: no GPU needed) uses the best record."""
    summary = tune(
        "softmax", "cuda", url, 12, batch=4, cost_model=cost_model, measurer=simulated(), time_model=False
    )
    assert summary.measured == 12
    out = kiln("compile", "--model", "softmax", "--target", "cuda", "--db", url, "-o", str(tmp_path / "m"))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "m" / "model.cu").exists()
    assert "coverage: 1 of 1 kernels use tuning records" in out.stdout
    model = tuner.compile("softmax", "cuda", db=url)
    with TuningDatabase.open(url) as db:
        for kernel in model.kernels:
            best = db.best(kernel.workload_key, summary.target)
            assert best is not None and kernel.config == best.config
            assert kernel.extra["origin"] == "record"
