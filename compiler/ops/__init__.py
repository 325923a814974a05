"""Kiln's op library. Importing this package registers every op.

Use :func:`get_op` to look one up; :func:`infer_node` and :func:`normalize_attrs` are what the graph
builder calls when it adds a node.
"""

from __future__ import annotations

from compiler.ops import activations, composite, contraction, elementwise, layout, pool, reduce  # noqa: F401
from compiler.ops.registry import (
    Attr,
    OpDef,
    OpTypeError,
    PatternKind,
    all_ops,
    get_op,
    infer_node,
    normalize_attrs,
    register,
)

__all__ = [
    "Attr",
    "OpDef",
    "OpTypeError",
    "PatternKind",
    "all_ops",
    "get_op",
    "infer_node",
    "normalize_attrs",
    "register",
]
