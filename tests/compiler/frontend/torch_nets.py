"""Small torch.nn nets of the kinds issue 17 measures against onnxruntime, exported to ONNX with
``torch.onnx.export`` (the TorchScript exporter, a fixed opset): an MNIST MLP, a conv net with BatchNorm
and pooling, a ResNet basic block, a MobileNetV2 inverted residual (depthwise 3x3, ReLU6), a transformer
encoder layer, a GPT block, RMSNorm + SwiGLU and an MLP-Mixer layer.

``NETS`` maps a name to ``(description, factory(scale) -> (module, example input))``; ``scale="bench"``
gives the benchmark sizes (scripts/bench_onnx_nets.py), ``scale="test"`` small ones for the tests."""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from tests.tuner.torch_models import GPTBlock

OPSET = 17
CONV_NETS = ("conv_net", "resnet_block", "mobilenetv2_block")  # the nets with BatchNorm


def export(module: nn.Module, x: torch.Tensor, opset: int = OPSET, keep_batchnorm: bool = False) -> Any:
    """The ONNX ModelProto of ``module`` (eval mode) at ``x``'s shape. The exporter folds BatchNorm into
    the convolution before it unless ``keep_batchnorm`` (then the file has BatchNormalization nodes, and
    folding them is the importer's job, as with files from other exporters)."""
    import onnx

    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module.eval(),
            (x,),
            buf,
            opset_version=opset,
            dynamo=False,
            input_names=["x"],
            do_constant_folding=not keep_batchnorm,
        )
    return onnx.load_model_from_string(buf.getvalue())


def _randomize_bn(module: nn.Module) -> nn.Module:
    """Non-trivial running statistics and affine parameters, so folding BatchNorm is really tested."""
    g = torch.Generator().manual_seed(1)
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            c = m.num_features
            m.running_mean.copy_(torch.randn(c, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(c, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(c, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(c, generator=g) * 0.1)
    return module.eval()


class ConvNet(nn.Module):
    """Conv3x3-BN-ReLU-MaxPool twice, global average pool, a linear classifier."""

    def __init__(self, c1: int = 32, c2: int = 64, classes: int = 10) -> None:
        super().__init__()
        self.c1, self.bn1 = nn.Conv2d(3, c1, 3, padding=1, bias=False), nn.BatchNorm2d(c1)
        self.c2, self.bn2 = nn.Conv2d(c1, c2, 3, padding=1, bias=False), nn.BatchNorm2d(c2)
        self.fc = nn.Linear(c2, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.c1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.c2(x))), 2)
        return self.fc(x.mean((2, 3)))


class BasicBlock(nn.Module):
    """ResNet basic block: (Conv3x3-BN-ReLU, Conv3x3-BN) + identity, ReLU."""

    def __init__(self, c: int = 64) -> None:
        super().__init__()
        self.c1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.c2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.c1(x)))
        return F.relu(x + self.bn2(self.c2(y)))


class InvertedResidual(nn.Module):
    """MobileNetV2 inverted residual: 1x1 expand-BN-ReLU6, depthwise 3x3-BN-ReLU6, 1x1 project-BN, + x."""

    def __init__(self, c: int = 32, expand: int = 6) -> None:
        super().__init__()
        h = c * expand
        self.pw, self.bn1 = nn.Conv2d(c, h, 1, bias=False), nn.BatchNorm2d(h)
        self.dw, self.bn2 = nn.Conv2d(h, h, 3, padding=1, groups=h, bias=False), nn.BatchNorm2d(h)
        self.pj, self.bn3 = nn.Conv2d(h, c, 1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu6(self.bn1(self.pw(x)))
        y = F.relu6(self.bn2(self.dw(y)))
        return x + self.bn3(self.pj(y))


class MixerLayer(nn.Module):
    """One MLP-Mixer layer: token-mixing MLP and channel-mixing MLP, each pre-LN with a residual."""

    def __init__(self, tokens: int = 49, d: int = 256, tok_h: int = 128, ch_h: int = 1024) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.t1, self.t2 = nn.Linear(tokens, tok_h), nn.Linear(tok_h, tokens)
        self.c1, self.c2 = nn.Linear(d, ch_h), nn.Linear(ch_h, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln1(x).transpose(1, 2)
        x = x + self.t2(F.gelu(self.t1(y))).transpose(1, 2)
        return x + self.c2(F.gelu(self.c1(self.ln2(x))))


class RMSNormSwiGLU(nn.Module):
    """RMSNorm (written out: the opset-17 exporter has no RMSNormalization) + SwiGLU MLP + residual."""

    def __init__(self, d: int, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.rand(d) + 0.5)
        self.w1, self.w3 = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        return x + self.w2(F.silu(self.w1(y)) * self.w3(y))


class Encoder(nn.Module):
    """A BERT-style post-LN transformer encoder layer with explicit attention and erf GELU."""

    def __init__(self, d: int, heads: int, ff: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-12), nn.LayerNorm(d, eps=1e-12)
        self.ff1, self.ff2 = nn.Linear(d, ff), nn.Linear(ff, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.reshape(b, t, self.heads, -1).permute(0, 2, 1, 3) for z in self.qkv(x).chunk(3, dim=-1))
        scores = q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5
        ctx = (scores.softmax(-1) @ v).permute(0, 2, 1, 3).reshape(b, t, d)
        h = self.ln1(x + self.out(ctx))
        return self.ln2(h + self.ff2(F.gelu(self.ff1(h))))


Factory = Callable[[str], tuple[nn.Module, torch.Tensor]]


def _net(build: Callable[[bool], nn.Module], bench_shape: tuple, test_shape: tuple) -> Factory:
    def make(scale: str) -> tuple[nn.Module, torch.Tensor]:
        torch.manual_seed(0)
        bench = scale == "bench"
        module = _randomize_bn(build(bench))
        x = torch.randn(*(bench_shape if bench else test_shape), generator=torch.Generator().manual_seed(2))
        return module, x

    return make


NETS: dict[str, tuple[str, Factory]] = {
    "mnist_mlp": (
        "x[64,784]: Linear 784-256, ReLU, Linear 256-128, ReLU, Linear 128-10",
        _net(
            lambda b: nn.Sequential(
                nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10)
            ),
            (64, 784),
            (4, 784),
        ),
    ),
    "conv_net": (
        "x[8,3,32,32]: (Conv3x3-BN-ReLU-MaxPool2) 3-32, 32-64, global average pool, Linear 64-10",
        _net(lambda b: ConvNet() if b else ConvNet(8, 16), (8, 3, 32, 32), (2, 3, 12, 12)),
    ),
    "resnet_block": (
        "x[1,64,28,28]: ResNet basic block (2x Conv3x3 64-64 + BN, ReLU, identity residual)",
        _net(lambda b: BasicBlock(64 if b else 16), (1, 64, 28, 28), (1, 16, 10, 10)),
    ),
    "mobilenetv2_block": (
        "x[1,32,28,28]: MobileNetV2 inverted residual (1x1 32-192, depthwise 3x3, 1x1 192-32, BN, ReLU6)",
        _net(lambda b: InvertedResidual(32 if b else 8), (1, 32, 28, 28), (1, 8, 10, 10)),
    ),
    "encoder_layer": (
        "x[1,128,256]: BERT-style encoder layer (4 heads, FF 1024, post-LN, erf GELU)",
        _net(lambda b: Encoder(256, 4, 1024) if b else Encoder(32, 4, 64), (1, 128, 256), (1, 8, 32)),
    ),
    "gpt_block": (
        "x[1,128,256]: pre-LN GPT block (4 heads, causal SDPA, GELU MLP 1024)",
        _net(lambda b: GPTBlock(256 if b else 32, 4), (1, 128, 256), (1, 8, 32)),
    ),
    "rmsnorm_swiglu": (
        "x[1,128,512]: RMSNorm + SwiGLU MLP 1536, residual",
        _net(lambda b: RMSNormSwiGLU(512, 1536) if b else RMSNormSwiGLU(32, 64), (1, 128, 512), (1, 8, 32)),
    ),
    "mlp_mixer": (
        "x[1,49,256]: MLP-Mixer layer (token MLP 49-128-49, channel MLP 256-1024-256, LN, GELU)",
        _net(lambda b: MixerLayer() if b else MixerLayer(6, 16, 8, 32), (1, 49, 256), (1, 6, 16)),
    ),
}
