"""Graph passes: each is a function Graph -> Graph."""

from __future__ import annotations

from compiler.passes.cse import cse
from compiler.passes.dce import dce
from compiler.passes.decompose import decompose
from compiler.passes.flatten_pointwise_conv import flatten_pointwise_conv
from compiler.passes.fold_constants import fold_constants
from compiler.passes.fold_conv_scale import fold_conv_scale
from compiler.passes.pipeline import PassPipeline, default_pipeline, optimize

__all__ = [
    "PassPipeline",
    "cse",
    "dce",
    "decompose",
    "default_pipeline",
    "flatten_pointwise_conv",
    "fold_constants",
    "fold_conv_scale",
    "optimize",
]
