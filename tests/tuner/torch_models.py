"""Torch models for ``kiln ... --model tests.tuner.torch_models:FUNCTION`` in the CLI tests: each function
returns ``(module, example_inputs)``."""

from __future__ import annotations

import torch
from torch import nn


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
