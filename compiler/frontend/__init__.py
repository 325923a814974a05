"""Model frontends: the built-in zoo (models.py), the ONNX importer (onnx.py) and the torch.compile
converter and backend (torch_fx.py, torch.py; they import torch, so nothing here imports them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from compiler.graph import Graph


def load_model(name_or_path: str, input_shapes: dict[str, tuple[int, ...]] | None = None) -> Graph:
    """A built-in model by name, or an ONNX file by path (``*.onnx``)."""
    if name_or_path.endswith(".onnx"):
        from compiler.frontend.onnx import load_onnx

        return load_onnx(name_or_path, input_shapes=input_shapes)
    from compiler.frontend.models import get_model

    return get_model(name_or_path)
