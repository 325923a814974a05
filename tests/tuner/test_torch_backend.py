"""The registered ``kiln`` torch.compile backend with a tuning database: tune_module tunes a torch module's
tasks ahead of time, compiled modules then use those records, per input shape; ``tune`` on the first call.
Measurements are simulated (tuner.measure.sim). Skipped, with the reason printed, without torch."""

from __future__ import annotations

import functools

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")

from torch import nn  # noqa: E402

from db.database import TuningDatabase  # noqa: E402
from tests.cli import kiln  # noqa: E402
from tests.tuner.test_api import simulated  # noqa: E402
from tuner.torch_backend import kiln_backend, tune_module  # noqa: E402

pytestmark = pytest.mark.xdist_group(name="torch_backend")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Dynamo keeps at most 8 compiled graphs per function (nn.Linear.forward is shared by every test):
    each test starts from an empty cache, so none runs in eager for having hit that limit."""
    torch._dynamo.reset()
    yield


@pytest.fixture
def url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'k.db'}"


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).eval()


def record_origins(module: nn.Module, x: torch.Tensor, **options) -> list[str]:
    """Compile ``module`` with the kiln backend and ``options``, check it against eager, and return the
    origin ('record' or 'default') of every kernel of the Kiln model(s) it built."""
    models: list = []
    backend = functools.partial(kiln_backend, on_model=lambda graph, model: models.append(model))
    with torch.no_grad():
        got = torch.compile(module, backend=backend, dynamic=False, options=options)(x)
        torch.testing.assert_close(got, module(x), rtol=1e-4, atol=1e-4)
    assert len(models) == 1
    return [k.extra.get("origin") for k in models[0].kernels]


def test_tune_module_then_compile_uses_the_records_per_shape(url: str) -> None:
    module = mlp()
    x4, x6 = torch.randn(4, 16), torch.randn(6, 16)
    (summary,) = tune_module(module, [x4], url, budget=4, measurer=simulated())
    assert summary.measured == 4 and summary.tasks
    with TuningDatabase.open(url) as db:
        assert db.runs(summary.model)
    assert "record" in record_origins(module, x4, db=url)
    # another batch size is another graph with other workloads: no records until it is tuned too
    assert "record" not in record_origins(mlp(), x6, db=url)
    tune_module(module, [x6], url, budget=4, measurer=simulated())
    assert "record" in record_origins(mlp(), x6, db=url)
    assert "record" in record_origins(mlp(), x4, db=url)


def test_tune_option_tunes_on_the_first_call(url: str) -> None:
    module = mlp()
    x = torch.randn(3, 16)
    summaries: list = []
    backend = functools.partial(kiln_backend, measurer=simulated(), summaries=summaries)
    with torch.no_grad():
        got = torch.compile(module, backend=backend, dynamic=False, options={"db": url, "tune": 3})(x)
    torch.testing.assert_close(got, module(x), rtol=1e-4, atol=1e-4)
    assert len(summaries) == 1 and summaries[0].measured == 3
    assert "record" in record_origins(mlp(), x, db=url)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tune": "lots"}, "use 'off' or a number of trials"),
        ({"tune": 4}, "tune needs a database"),
        ({"colour": "blue"}, "unknown kiln backend option"),
    ],
)
def test_bad_options_say_what_is_wrong(options: dict, message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KILN_DB", raising=False)
    with pytest.raises(Exception, match=message):
        torch.compile(nn.Linear(2, 2), backend="kiln", dynamic=False, options=options)(torch.randn(1, 2))


def test_cli_takes_a_torch_model_as_module_function(url: str) -> None:
    shown = kiln("show", "--model", "tests.tuner.torch_models:mlp", "--stage", "graph")
    assert shown.returncode == 0, shown.stderr
    assert "tests.tuner.torch_models.mlp" in shown.stdout and "matmul" in shown.stdout
    model = "tests.tuner.torch_models:mlp"
    tuned = kiln("tune", "--model", model, "--trials", "2", "--db", url, "--no-summary")
    assert tuned.returncode == 0, tuned.stderr
    with TuningDatabase.open(url) as db:
        assert db.runs("tests.tuner.torch_models.mlp")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("tests.tuner.no_such_module:mlp", "cannot import tests.tuner.no_such_module"),
        ("tests.tuner.torch_models:nothing", "has no function nothing"),
        ("tests.tuner.torch_models:not_a_model", "must return (torch.nn.Module, example_inputs)"),
        ("tests.tuner.torch_models:with_cumsum", "makes 2 Kiln graphs"),
    ],
)
def test_cli_torch_model_errors_are_one_line(spec: str, message: str) -> None:
    result = kiln("show", "--model", spec, "--stage", "graph")
    assert result.returncode != 0, result.stdout
    assert message in result.stderr and "Traceback" not in result.stderr, result.stderr
