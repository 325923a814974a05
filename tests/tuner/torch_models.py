"""Torch models shared by the torch tests and scripts/bench_torch.py: the GPT block and RMSNorm + SwiGLU
modules, and functions for ``kiln ... --model tests.tuner.torch_models:FUNCTION`` in the CLI tests (each
returns ``(module, example_inputs)``)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class GPTBlock(nn.Module):
    """A pre-LN GPT block: causal scaled-dot-product attention and a GELU MLP."""

    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class SwiGLU(nn.Module):
    """RMSNorm followed by a SwiGLU feed-forward, with the residual."""

    def __init__(self, d: int = 32, hidden: int = 64) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(d, eps=1e-6)
        self.w1, self.w3 = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(x)
        return x + self.w2(F.silu(self.w1(y)) * self.w3(y))


def mlp() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)), (torch.randn(4, 16),)


def with_cumsum() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Its cumsum runs in eager, so it makes two Kiln graphs: the CLI refuses it."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(torch.cumsum(self.a(x), dim=-1))

    return Net(), (torch.randn(2, 8),)


def not_a_model() -> int:
    return 3
