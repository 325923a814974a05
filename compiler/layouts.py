"""Named data layouts a kernel may ask for on a constant input (weights), applied once at compile time.

``TilePack(axis, tile)``: ``x[..., i, ...] -> x'[i // tile, ..., i % tile]`` with the axis padded with
zeros to a multiple of ``tile`` (the packed B panel layout of a GEMM micro-kernel). The loop-IR index
map and the numpy transform are defined side by side so they cannot disagree."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler.errors import KilnError


@dataclass(frozen=True)
class TilePack:
    axis: int
    tile: int
    pad_to: int = 1  # pad the axis to a multiple of this (a multiple of tile: the loops' coverage)

    def _padded(self, n: int) -> int:
        step = max(self.tile, self.pad_to)
        return -(-n // step) * step

    def shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        others = [d for k, d in enumerate(shape) if k != self.axis]
        return (self._padded(shape[self.axis]) // self.tile, *others, self.tile)

    def index(self, idx: Sequence[Any]) -> list[Any]:
        others = [i for k, i in enumerate(idx) if k != self.axis]
        return [idx[self.axis] // self.tile, *others, idx[self.axis] % self.tile]

    def apply(self, x: np.ndarray) -> np.ndarray:
        n = x.shape[self.axis]
        padded = self._padded(n)
        widths = [(0, padded - n if k == self.axis else 0) for k in range(x.ndim)]
        y = np.pad(x, widths)
        y = y.reshape(*x.shape[: self.axis], padded // self.tile, self.tile, *x.shape[self.axis + 1 :])
        y = np.moveaxis(y, self.axis, 0)
        return np.ascontiguousarray(np.moveaxis(y, self.axis + 1, -1))

    def to_json(self) -> dict[str, Any]:
        return {"kind": "tile_pack", "axis": self.axis, "tile": self.tile, "pad_to": self.pad_to}


def layout_from_json(data: dict[str, Any]) -> TilePack:
    if data.get("kind") == "tile_pack":
        return TilePack(int(data["axis"]), int(data["tile"]), int(data.get("pad_to", 1)))
    raise KilnError(f"unknown input layout {data!r}")


def apply_input_layouts(func_attrs: dict[str, Any], arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The kernel's input arrays with the layouts its function asks for (others unchanged)."""
    layouts = func_attrs.get("input_layouts") or {}
    return [
        layout_from_json(layouts[str(i)]).apply(a) if str(i) in layouts else a for i, a in enumerate(arrays)
    ]
