"""torch.compile with Kiln: torch.nn modules compiled through compiler.frontend.torch.kiln_backend (and the
registered ``kiln`` backend) compared with eager; recompilation on a new shape; ops Kiln cannot import
falling back to eager. Skipped, with the reason printed, where torch is not installed."""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")

from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from compiler.frontend.torch import kiln_backend  # noqa: E402
from compiler.frontend.torch_fx import unsupported_reason  # noqa: E402
from tests.tuner.torch_models import GPTBlock, SwiGLU  # noqa: E402

pytestmark = pytest.mark.xdist_group(name="torch_backend")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Dynamo keeps at most 8 compiled graphs per function (nn.Linear.forward is shared by every test):
    each test starts from an empty cache, so none runs in eager for having hit that limit."""
    torch._dynamo.reset()
    yield


class WithCumsum(nn.Module):
    """Two linear layers around an op Kiln has no import for (cumsum)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.cumsum(self.a(x), dim=-1).relu())


class PadActivations(nn.Module):
    """Constant padding, a convolution and the clamp-like activations (relu6, hardtanh, leaky_relu,
    hardswish, hardsigmoid, clamp)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(F.pad(x, (1, 2, 0, 1), value=0.5))
        acts = [F.relu6(y), F.hardtanh(y), F.leaky_relu(y, 0.2), F.hardswish(y), F.hardsigmoid(y)]
        return torch.cat([*acts, y.clamp(min=-0.1)], dim=1)


def conv_net() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, bias=False),
        nn.BatchNorm2d(8),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 4),
    )


def randomize_batch_norm(module: nn.Module) -> nn.Module:
    """Non-trivial running statistics, so eval-mode BatchNorm really normalizes."""
    gen = torch.Generator().manual_seed(1)
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen))
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
    return module


MODULES = {
    "mlp": (lambda: nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)), (4, 16)),
    "conv_bn": (lambda: randomize_batch_norm(conv_net()), (2, 3, 12, 12)),
    "encoder": (lambda: nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0), (8, 2, 32)),
    "gpt_block": (GPTBlock, (2, 8, 32)),
    "rmsnorm_swiglu": (SwiGLU, (2, 8, 32)),
    "pad_activations": (PadActivations, (2, 3, 8, 8)),
}


class Recorder:
    """Kiln graphs the backend compiled (the on_model option)."""

    def __init__(self) -> None:
        self.graphs: list = []
        self.models: list = []

    def __call__(self, graph, model) -> None:
        self.graphs.append(graph)
        self.models.append(model)


def compiled(module: nn.Module, **options):
    return torch.compile(module, backend=kiln_backend, dynamic=False, options=options or None)


@pytest.mark.parametrize("name", list(MODULES))
def test_module_matches_eager(name: str, caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    make, shape = MODULES[name]
    module = make().eval()
    x = torch.randn(*shape)
    rec = Recorder()
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="kiln.torch"):
        got = compiled(module, on_model=rec)(x)
        want = module(x)
    assert not caplog.records, f"{name}: something fell back: {caplog.text}"
    assert len(rec.graphs) == 1, f"{name}: expected one Kiln graph, got {len(rec.graphs)}"
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_new_input_shape_recompiles_with_a_graph_per_shape() -> None:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)).eval()
    rec = Recorder()
    fn = compiled(module, on_model=rec)
    with torch.no_grad():
        for batch in (4, 6, 4):
            x = torch.randn(batch, 16)
            torch.testing.assert_close(fn(x), module(x), rtol=1e-4, atol=1e-4)
    # the third call hits Dynamo's guards for batch 4: no third Kiln graph
    assert [g.inputs[0].shape for g in rec.graphs] == [(4, 16), (6, 16)]


def test_unsupported_op_falls_back_to_eager_and_still_matches(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    module = WithCumsum().eval()
    x = torch.randn(3, 8)
    rec = Recorder()
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="kiln.torch"):
        got = compiled(module, on_model=rec)(x)
    torch.testing.assert_close(got, module(x), rtol=1e-4, atol=1e-4)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "aten.cumsum.default" in lines[0] and "PyTorch eager" in lines[0], lines
    assert len(rec.graphs) == 2  # the linear layers on either side are Kiln pieces


def test_fused_encoder_fast_path_falls_back_whole(caplog: pytest.LogCaptureFixture) -> None:
    """batch_first=True in eval under no_grad takes PyTorch's fused encoder op: it runs in eager, reported."""
    torch.manual_seed(0)
    module = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).eval()
    x = torch.randn(2, 8, 32)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="kiln.torch"):
        got = compiled(module)(x)
        want = module(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert "_transformer_encoder_layer_fwd" in caplog.text


def test_unsupported_reason_names_the_op() -> None:
    gm = torch.fx.symbolic_trace(lambda x: torch.cumsum(x, 0))
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    node.meta["val"] = torch.empty(3)
    assert "cumsum" in unsupported_reason(node)


def test_dynamic_graph_runs_in_eager_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    module = nn.Linear(4, 4).eval()
    fn = torch.compile(module, backend=kiln_backend, dynamic=True)
    x = torch.randn(3, 4)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="kiln.torch"):
        torch.testing.assert_close(fn(x), module(x))
    assert "dynamic=False" in caplog.text


def test_unknown_option_is_one_clear_error() -> None:
    with pytest.raises(Exception, match="unknown kiln backend option"):
        compiled(nn.Linear(2, 2), colour="blue")(torch.randn(1, 2))


def test_registered_backend_name_kiln(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KILN_DB", raising=False)
    module = nn.Sequential(nn.Linear(8, 8), nn.Tanh()).eval()
    x = torch.randn(2, 8)
    with torch.no_grad():
        got = torch.compile(module, backend="kiln", dynamic=False)(x)
    torch.testing.assert_close(got, module(x), rtol=1e-4, atol=1e-4)


def test_training_step_sees_updated_weights(caplog: pytest.LogCaptureFixture) -> None:
    """With gradients on, the weights are inputs of the Kiln forward (an optimizer step is seen by the next
    call) and the backward runs in eager: gradients and later outputs match eager."""
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    twin = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    twin.load_state_dict(module.state_dict())
    fn = compiled(module)
    opt, twin_opt = torch.optim.SGD(module.parameters(), lr=0.1), torch.optim.SGD(twin.parameters(), lr=0.1)
    x = torch.randn(3, 8)
    with caplog.at_level(logging.WARNING, logger="kiln.torch"):
        for _ in range(2):
            for f, o in ((fn, opt), (twin, twin_opt)):
                o.zero_grad()
                f(x).pow(2).sum().backward()
                o.step()
            for p, q in zip(module.parameters(), twin.parameters()):
                torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert "backward graph" in caplog.text


def test_embedding_with_integer_ids(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Embedding(50, 16), nn.Linear(16, 4), nn.Softmax(dim=-1)).eval()
    ids = torch.randint(0, 50, (2, 5))
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="kiln.torch"):
        got = compiled(module)(ids)
    assert not caplog.records, caplog.text
    torch.testing.assert_close(got, module(ids), rtol=1e-4, atol=1e-5)


def test_a_float16_module_runs_in_kiln_and_matches_float32_eager(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)).eval()
    x = torch.randn(4, 16)
    rec = Recorder()
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="kiln.torch"):
        got = compiled(module.half(), on_model=rec)(x.half())
        want = module.float()(x)
    assert not caplog.records, caplog.text
    assert [v.dtype for v in rec.graphs[0].inputs] == ["float16"] and got.dtype == torch.float16
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)


def test_a_bfloat16_module_imports_compiles_for_cuda_and_runs_eager_on_the_cpu(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from compiler.build import compile as kiln_compile
    from compiler.frontend.torch import capture_graphs

    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(16, 32), nn.ReLU()).eval().to(torch.bfloat16)
    x = torch.randn(4, 16).to(torch.bfloat16)
    (graph,) = capture_graphs(module, [x])
    assert graph.inputs[0].dtype == "bfloat16"
    assert "kiln_bf16" in kiln_compile(graph, "cuda").source
    torch._dynamo.reset()
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="kiln.torch"):
        got = compiled(module)(x)  # the cpu target refuses bfloat16: the graph runs in eager, saying why
        want = module(x)
    assert "cpu target does not support bfloat16" in caplog.text
    assert torch.equal(got, want)
