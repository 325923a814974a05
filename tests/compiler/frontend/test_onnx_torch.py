"""torch.nn modules exported with torch.onnx.export (the classic TorchScript exporter), imported and
compared with onnxruntime, and compiled for the CPU and compared with onnxruntime and torch itself.
Skipped, with the reason printed, where torch is not installed."""

from __future__ import annotations

import io
import warnings

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch) for the export tests")

from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from compiler.frontend.models import get_model  # noqa: E402
from compiler.frontend.onnx import load_onnx  # noqa: E402
from compiler.passes import optimize  # noqa: E402
from compiler.reference import run_reference  # noqa: E402
from tests.compiler.frontend.onnx_util import (  # noqa: E402
    check_model,
    compiled_model,
    onnx,
)


def export(module: nn.Module, x: torch.Tensor, opset: int, dynamic: bool = False) -> object:
    buf = io.BytesIO()
    axes = {"x": {0: "batch"}} if dynamic else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module.eval(), (x,), buf, opset_version=opset, dynamo=False, input_names=["x"], dynamic_axes=axes
        )
    return onnx.load_model_from_string(buf.getvalue())


class Encoder(nn.Module):
    """A BERT-style post-LN encoder layer with explicit attention."""

    def __init__(self, d: int = 32, heads: int = 4, ff: int = 64) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-12), nn.LayerNorm(d, eps=1e-12)
        self.ff1, self.ff2 = nn.Linear(d, ff), nn.Linear(ff, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.reshape(b, t, self.heads, -1).permute(0, 2, 1, 3) for z in self.qkv(x).chunk(3, dim=-1))
        scores = q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5
        ctx = (scores.softmax(-1) @ v).permute(0, 2, 1, 3).reshape(b, t, d)
        h = self.ln1(x + self.out(ctx))
        return self.ln2(h + self.ff2(F.gelu(self.ff1(h))))


class GPTBlock(nn.Module):
    """Pre-LN GPT block: causal scaled_dot_product_attention and tanh GELU."""

    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class MaskedGPTAttention(nn.Module):
    """GPT-2 (HF) style: a registered causal buffer sliced to the sequence, where(mask, w, finfo.min)."""

    def __init__(self, d: int = 32, heads: int = 4, ctx: int = 16) -> None:
        super().__init__()
        self.heads = heads
        self.attn, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.register_buffer("bias", torch.tril(torch.ones(ctx, ctx, dtype=torch.bool)).view(1, 1, ctx, ctx))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, -1).permute(0, 2, 1, 3) for z in self.attn(x).split(c, dim=2))
        w = torch.matmul(q, k.transpose(-1, -2)) / (v.size(-1) ** 0.5)
        mask = self.bias[:, :, :t, :t]
        w = torch.where(mask, w, torch.tensor(torch.finfo(w.dtype).min, dtype=w.dtype))
        y = torch.matmul(nn.functional.softmax(w, dim=-1), v)
        return self.proj(y.permute(0, 2, 1, 3).reshape(b, t, c))


class SwiGLU(nn.Module):
    """LLaMA RMSNorm + SwiGLU MLP with a residual."""

    def __init__(self, d: int = 32, ff: int = 64) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(d) + 0.5)
        self.w1, self.w2, self.w3 = (
            nn.Linear(d, ff, bias=False),
            nn.Linear(ff, d, bias=False),
            nn.Linear(d, ff, bias=False),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class BasicBlock(nn.Module):
    """The ResNet basic block (eval mode: torch folds BatchNorm into the convolutions)."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.c1, self.c2 = (
            nn.Conv2d(c, c, 3, padding=1, bias=False),
            nn.Conv2d(c, c, 3, padding=1, bias=False),
        )
        self.b1, self.b2 = nn.BatchNorm2d(c), nn.BatchNorm2d(c)
        for bn in (self.b1, self.b2):
            bn.running_mean.uniform_(-0.2, 0.2)
            bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.b2(self.c2(F.relu(self.b1(self.c1(x))))) + x)


def convnet() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2),
        nn.Hardswish(),
        nn.AvgPool2d(2, ceil_mode=True),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 5),
    )


MODULES = {
    "mlp": (lambda: nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 10)), (4, 16), {"linear"}),
    "convnet": (convnet, (2, 3, 16, 16), {"conv2d", "hard_swish", "max_pool2d", "linear"}),
    "encoder": (Encoder, (2, 10, 32), {"layer_norm", "gelu", "softmax", "batch_matmul"}),
    "gpt_sdpa": (GPTBlock, (2, 12, 32), {"layer_norm", "gelu", "softmax", "batch_matmul"}),
    "gpt2_masked": (MaskedGPTAttention, (2, 12, 32), {"where", "softmax", "batch_matmul"}),
    "rmsnorm_swiglu": (SwiGLU, (2, 6, 32), {"rms_norm", "silu", "linear"}),
    "resnet_block": (BasicBlock, (1, 8, 10, 10), {"conv2d", "relu"}),
    "activations": (
        lambda: nn.Sequential(nn.LeakyReLU(0.2), nn.Hardsigmoid(), nn.GELU(), nn.ELU(), nn.LogSoftmax(-1)),
        (3, 7),
        {"leaky_relu", "hard_sigmoid", "gelu", "log_softmax"},
    ),
}


def exported(name: str, opset: int) -> tuple[nn.Module, torch.Tensor, object]:
    make, shape, _ = MODULES[name]
    torch.manual_seed(0)
    module = make()
    x = torch.randn(*shape)
    return module, x, export(module, x, opset)


@pytest.mark.parametrize("opset", [14, 17])
@pytest.mark.parametrize("name", sorted(MODULES))
def test_torch_export(name, opset):
    module, x, model = exported(name, opset)
    graph = check_model(model, feeds={"x": x.numpy()}, compiled=False)  # compiled: the test below
    ops = {n.op for n in graph.nodes}
    assert MODULES[name][2] <= ops, ops
    assert not ops & {"erf", "tanh", "sqrt", "reduce_mean", "sigmoid"}, ops  # all recognized
    with torch.no_grad():
        want = module(x).numpy()
    got = run_reference(graph, [x.numpy()])[0]
    assert abs(got - want).max() <= 1e-4 * max(1.0, abs(want).max())


@pytest.mark.parametrize("name", sorted(MODULES))
def test_torch_export_compiled(name):
    """The exported module compiled for the CPU (default schedules) against onnxruntime and torch."""
    module, x, model = exported(name, 17)
    graph = check_model(model, feeds={"x": x.numpy()}, compiled=True)
    with torch.no_grad():
        want = module(x).numpy()
    got = compiled_model(graph).run([x.numpy()])[0]
    assert abs(got - want).max() <= 1e-4 * max(1.0, abs(want).max())


def test_torch_gelu_op_at_opset_20():
    x = torch.randn(3, 8)
    graph = check_model(export(nn.GELU(), x, 20), feeds={"x": x.numpy()})
    assert [n.op for n in graph.nodes] == ["gelu"]


def test_torch_dynamic_batch_needs_input_shape():
    x = torch.randn(4, 16)
    model = export(nn.Sequential(nn.Linear(16, 8), nn.ReLU()), x, 17, dynamic=True)
    with pytest.raises(Exception, match="--input-shape x=1x16"):
        load_onnx(model)
    graph = check_model(model, input_shapes={"x": (3, 16)})
    assert graph.inputs[0].shape == (3, 16)


def test_torch_mlp_has_the_zoo_workloads():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    imported = optimize(load_onnx(export(mlp, torch.randn(256, 784), 17)))
    assert imported.structural_hash() == optimize(get_model("mlp")).structural_hash()
