"""Layout ops: broadcast_to, reshape, transpose, expand_dims, squeeze, concat, slice, pad, gather."""

from __future__ import annotations

import numpy as np

from compiler.graph import TensorType
from compiler.ops.common import broadcast_shapes, norm_axes, norm_axis
from compiler.ops.registry import Attr, OpDef, OpTypeError, PatternKind, register


# ------------------------------------------------------------------ broadcast_to
def _broadcast_infer(types: list[TensorType], attrs: dict) -> TensorType:
    (t,) = types
    shape = attrs["shape"]
    if len(shape) < t.rank:
        raise OpTypeError(f"cannot broadcast {t} to the lower-rank shape {list(shape)}")
    if broadcast_shapes(t.shape, shape) != tuple(shape):
        raise OpTypeError(f"cannot broadcast {t} to shape {list(shape)}")
    return TensorType(shape, t.dtype)


register(
    OpDef(
        "broadcast_to",
        PatternKind.Broadcast,
        1,
        _broadcast_infer,
        lambda x, shape: np.ascontiguousarray(np.broadcast_to(x, shape)),
        attrs=(Attr("shape", "ints"),),
        doc="numpy broadcast_to",
    )
)


# ----------------------------------------------------------------------- reshape
def _reshape_normalize(types: list[TensorType], attrs: dict) -> dict:
    (t,) = types
    shape = list(attrs["shape"])
    if shape.count(-1) > 1:
        raise OpTypeError(f"reshape shape {shape} has more than one -1")
    if any(d < -1 for d in shape):
        raise OpTypeError(f"reshape shape {shape} has a negative dimension")
    if -1 in shape:
        known = int(np.prod([d for d in shape if d != -1], dtype=np.int64))
        if known == 0 or t.numel % known:
            raise OpTypeError(f"cannot reshape {t} ({t.numel} elements) to {shape}")
        shape[shape.index(-1)] = t.numel // known
    return {"shape": tuple(shape)}


def _reshape_infer(types: list[TensorType], attrs: dict) -> TensorType:
    (t,) = types
    out = TensorType(attrs["shape"], t.dtype)
    if out.numel != t.numel:
        raise OpTypeError(
            f"cannot reshape {t} ({t.numel} elements) to {list(attrs['shape'])} ({out.numel} elements)"
        )
    return out


register(
    OpDef(
        "reshape",
        PatternKind.Injective,
        1,
        _reshape_infer,
        lambda x, shape: x.reshape(shape),
        attrs=(Attr("shape", "ints"),),
        normalize=_reshape_normalize,
        doc="row-major reshape; one dimension may be -1",
    )
)


# --------------------------------------------------------------------- transpose
def _transpose_normalize(types: list[TensorType], attrs: dict) -> dict:
    rank = types[0].rank
    perm = attrs["perm"]
    if perm is None:
        perm = tuple(reversed(range(rank)))
    perm = tuple(norm_axis("transpose", p, rank, "perm entry") for p in perm)
    if sorted(perm) != list(range(rank)):
        raise OpTypeError(f"perm {list(attrs['perm'])} is not a permutation of {rank} axes")
    return {"perm": perm}


register(
    OpDef(
        "transpose",
        PatternKind.Injective,
        1,
        lambda types, attrs: TensorType(tuple(types[0].shape[p] for p in attrs["perm"]), types[0].dtype),
        lambda x, perm: np.ascontiguousarray(np.transpose(x, perm)),
        attrs=(Attr("perm", "ints", None),),
        normalize=_transpose_normalize,
        doc="permute axes (default: reverse them)",
    )
)


# ---------------------------------------------------------- expand_dims / squeeze
def _expand_normalize(types: list[TensorType], attrs: dict) -> dict:
    out_rank = types[0].rank + len(attrs["axes"])
    return {"axes": norm_axes("expand_dims", attrs["axes"], out_rank)}


def _expand_infer(types: list[TensorType], attrs: dict) -> TensorType:
    shape = list(types[0].shape)
    for a in attrs["axes"]:
        shape.insert(a, 1)
    return TensorType(tuple(shape), types[0].dtype)


register(
    OpDef(
        "expand_dims",
        PatternKind.Injective,
        1,
        _expand_infer,
        lambda x, axes: np.expand_dims(x, axes),
        attrs=(Attr("axes", "ints"),),
        normalize=_expand_normalize,
        doc="insert size-1 axes at the given output positions",
    )
)


def _squeeze_normalize(types: list[TensorType], attrs: dict) -> dict:
    t = types[0]
    if attrs["axes"] is None:
        return {"axes": tuple(i for i, d in enumerate(t.shape) if d == 1)}
    axes = norm_axes("squeeze", attrs["axes"], t.rank)
    for a in axes:
        if t.shape[a] != 1:
            raise OpTypeError(f"cannot squeeze axis {a} of {t}: its size is {t.shape[a]}, not 1")
    return {"axes": axes}


register(
    OpDef(
        "squeeze",
        PatternKind.Injective,
        1,
        lambda types, attrs: TensorType(
            tuple(d for i, d in enumerate(types[0].shape) if i not in attrs["axes"]), types[0].dtype
        ),
        lambda x, axes: np.squeeze(x, axis=tuple(axes)),
        attrs=(Attr("axes", "ints", None),),
        normalize=_squeeze_normalize,
        doc="remove size-1 axes (default: all of them)",
    )
)


# ------------------------------------------------------------------------ concat
def _concat_normalize(types: list[TensorType], attrs: dict) -> dict:
    return {"axis": norm_axis("concat", attrs["axis"], types[0].rank)}


def _concat_infer(types: list[TensorType], attrs: dict) -> TensorType:
    axis = attrs["axis"]
    first = types[0]
    for i, t in enumerate(types[1:], 1):
        if t.dtype != first.dtype or t.rank != first.rank:
            raise OpTypeError(f"concat input {i} is {t} but input 0 is {first}")
        for d in range(first.rank):
            if d != axis and t.shape[d] != first.shape[d]:
                raise OpTypeError(
                    f"concat input {i} is {t}: dimension {d} differs from input 0 ({first}) "
                    f"outside the concat axis {axis}"
                )
    shape = list(first.shape)
    shape[axis] = sum(t.shape[axis] for t in types)
    return TensorType(tuple(shape), first.dtype)


register(
    OpDef(
        "concat",
        PatternKind.Injective,
        (1, None),
        _concat_infer,
        lambda *xs, axis: np.concatenate(xs, axis=axis),
        attrs=(Attr("axis", "int", 0),),
        normalize=_concat_normalize,
        doc="join tensors along an axis",
    )
)


# ------------------------------------------------------------------------- slice
def slice_params(shape: tuple[int, ...], starts, ends, axes=None, steps=None):
    """Turn python/ONNX-style slice arguments into full-rank (starts, sizes, steps)."""
    rank = len(shape)
    axes = list(range(len(starts))) if axes is None else list(axes)
    steps = [1] * len(starts) if steps is None else list(steps)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise OpTypeError("slice starts, ends, axes and steps must have the same length")
    out_starts, out_sizes, out_steps = [0] * rank, list(shape), [1] * rank
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = norm_axis("slice", a, rank, "axes entry")
        if st == 0:
            raise OpTypeError(f"slice step on axis {a} is 0")
        rng = range(shape[a])[slice(s, e, st)]
        out_starts[a] = rng.start if len(rng) else 0
        out_sizes[a] = len(rng)
        out_steps[a] = st
    return {"starts": tuple(out_starts), "sizes": tuple(out_sizes), "steps": tuple(out_steps)}


def _slice_infer(types: list[TensorType], attrs: dict) -> TensorType:
    t = types[0]
    starts, sizes, steps = attrs["starts"], attrs["sizes"], attrs["steps"]
    if not len(starts) == len(sizes) == len(steps) == t.rank:
        raise OpTypeError(f"slice needs full-rank starts/sizes/steps for {t}")
    for a, (s, n, st) in enumerate(zip(starts, sizes, steps)):
        last = s + (n - 1) * st
        if n < 0 or st == 0 or (n > 0 and not (0 <= s < t.shape[a] and 0 <= last < t.shape[a])):
            raise OpTypeError(f"slice on axis {a} (start {s}, size {n}, step {st}) leaves {t}")
    return TensorType(tuple(sizes), t.dtype)


def _slice_ref(x: np.ndarray, starts, sizes, steps) -> np.ndarray:
    index = []
    for s, n, st in zip(starts, sizes, steps):
        stop = s + n * st
        index.append(slice(s, stop if stop >= 0 else None, st))
    return np.ascontiguousarray(x[tuple(index)])


register(
    OpDef(
        "slice",
        PatternKind.Injective,
        1,
        _slice_infer,
        _slice_ref,
        attrs=(Attr("starts", "ints"), Attr("sizes", "ints"), Attr("steps", "ints")),
        doc="strided slice: out[i] = x[start + i*step] per axis (build with GraphBuilder.slice)",
    )
)


# --------------------------------------------------------------------------- pad
def _pad_normalize(types: list[TensorType], attrs: dict) -> dict:
    rank = types[0].rank
    pads = attrs["pads"]
    if len(pads) != 2 * rank:
        raise OpTypeError(f"pad needs {2 * rank} pads (all befores, then all afters), got {list(pads)}")
    if any(p < 0 for p in pads):
        raise OpTypeError(f"negative pads {list(pads)} are not supported; use slice")
    return {"pads": pads, "value": attrs["value"]}


def _pad_infer(types: list[TensorType], attrs: dict) -> TensorType:
    t = types[0]
    pads = attrs["pads"]
    return TensorType(tuple(d + pads[i] + pads[i + t.rank] for i, d in enumerate(t.shape)), t.dtype)


def _pad_ref(x: np.ndarray, pads, value) -> np.ndarray:
    rank = x.ndim
    return np.pad(x, [(pads[i], pads[i + rank]) for i in range(rank)], constant_values=value)


register(
    OpDef(
        "pad",
        PatternKind.Injective,
        1,
        _pad_infer,
        _pad_ref,
        attrs=(Attr("pads", "ints"), Attr("value", "float", 0.0)),
        normalize=_pad_normalize,
        doc="constant padding; pads = [before_0..before_n-1, after_0..after_n-1]",
    )
)


# ------------------------------------------------------------------------ gather
def _gather_normalize(types: list[TensorType], attrs: dict) -> dict:
    return {"axis": norm_axis("gather", attrs["axis"], types[0].rank)}


def _gather_infer(types: list[TensorType], attrs: dict) -> TensorType:
    data, idx = types
    if idx.dtype not in ("int32", "int64"):
        raise OpTypeError(f"gather indices must be int32 or int64, got {idx}")
    a = attrs["axis"]
    return TensorType(data.shape[:a] + idx.shape + data.shape[a + 1 :], data.dtype)


def _gather_ref(data: np.ndarray, idx: np.ndarray, axis: int) -> np.ndarray:
    n = data.shape[axis]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise IndexError(f"gather index out of range for axis {axis} of size {n}")
    return np.take(data, np.where(idx < 0, idx + n, idx), axis=axis)


register(
    OpDef(
        "gather",
        PatternKind.Injective,
        2,
        _gather_infer,
        _gather_ref,
        attrs=(Attr("axis", "int", 0),),
        normalize=_gather_normalize,
        doc="take entries of data along axis at integer indices (negative indices count from the end)",
    )
)
