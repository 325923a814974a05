"""Shape and dtype helpers shared by op definitions."""

from __future__ import annotations

from collections.abc import Sequence

from compiler import dtypes
from compiler.graph import TensorType
from compiler.ops.registry import OpTypeError


def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]:
    """numpy broadcasting of shapes; OpTypeError names the dimension that does not match."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for axis in range(rank):
        dims = {s[len(s) - rank + axis] for s in shapes if len(s) - rank + axis >= 0}
        dims.discard(1)
        if len(dims) > 1:
            shown = " and ".join(str(list(s)) for s in shapes)
            raise OpTypeError(
                f"cannot broadcast shapes {shown}: output dimension {axis} would be one of {sorted(dims)}"
            )
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def same_dtype(op: str, types: Sequence[TensorType]) -> str:
    kinds = {t.dtype for t in types}
    if len(kinds) != 1:
        raise OpTypeError(
            f"{op} needs inputs of one dtype, got {', '.join(str(t) for t in types)}; insert a cast"
        )
    return kinds.pop()


def require_float(op: str, t: TensorType) -> None:
    if not dtypes.is_float(t.dtype):
        raise OpTypeError(f"{op} needs a floating-point input, got {t}")


def norm_axis(op: str, axis: int, rank: int, name: str = "axis") -> int:
    if not -rank <= axis < max(rank, 1):
        raise OpTypeError(f"{name} {axis} is out of range for a rank-{rank} input of {op}")
    return axis % rank if rank else 0


def norm_axes(op: str, axes: Sequence[int] | None, rank: int) -> tuple[int, ...]:
    if axes is None:
        return tuple(range(rank))
    out = sorted({norm_axis(op, a, rank, "axes entry") for a in axes})
    if len(out) != len(axes):
        raise OpTypeError(f"axes {list(axes)} of {op} repeat an axis")
    return tuple(out)
