"""Checking a candidate's results, shared by the runners of every target kind.

- :func:`task_data`: a task's random inputs (seeded by its workload key) and its numpy reference outputs;
- ``GUARD`` / ``CANARY``: the canary regions around output buffers (out-of-bounds writes), ``POISON``: the
  NaN bit patterns written into outputs before the verification run (unwritten outputs stay NaN);
- :func:`compare`: an output against the reference, with a message naming the largest error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from compiler import dtypes, reference
from compiler.canonical import canonical_json
from compiler.layouts import layout_from_json

GUARD = 4096  # bytes of canary before and after every output buffer
CANARY = 0xA5
POISON = {  # bit patterns written into outputs before the verification run
    "float32": np.array([0x7FC5A5A5], np.uint32).view(np.float32)[0],
    "float64": np.array([0x7FF8A5A5A5A5A5A5], np.uint64).view(np.float64)[0],
    "float16": np.array([0x7E5A], np.uint16).view(np.float16)[0],
    "bfloat16": np.array([0x7FA5], np.uint16).view(dtypes.to_numpy("bfloat16"))[0],
}
# max |error| <= RTOL * max(1, max|ref|): about 20 units in the last place at 1.0 for the 16-bit floats
RTOL = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 8e-2, "float64": 1e-9}
# float32 outputs of a target with TF32 math (``Target.tf32``): inputs rounded to 10 mantissa bits
# (unit roundoff 2^-11 ~ 4.9e-4 per operand), float32 accumulation; 5e-3 x max(1, max|ref|) leaves room
# for the sqrt(K) growth of the rounding error over K terms (K = 4096: ~64 x 1e-3 x |a||b| against a
# reference of ~64 |a||b|, i.e. ~1e-3 of max|ref|) and still fails a wrong fragment or a missing tile
TF32_RTOL = 5e-3


def rtol_for(dtype: str, tf32: bool = False) -> float:
    """The relative tolerance of a ``dtype`` output (float32 on a TF32 target: :data:`TF32_RTOL`)."""
    if tf32 and dtype == "float32":
        return TF32_RTOL
    return RTOL.get(dtype, 1e-4)


@dataclass
class TaskData:
    """A task's verification data: random inputs and the numpy reference outputs (group order)."""

    key: str
    inputs: list[np.ndarray]
    refs: list[np.ndarray]
    in_names: list[str]
    out_names: list[str]
    seed: int
    relaid: dict[tuple[int, str], np.ndarray] = field(default_factory=dict)  # (input, layout) -> array

    def relayout(self, pos: int, spec: dict[str, Any]) -> tuple[str, np.ndarray]:
        """Input ``pos`` in the layout ``spec`` a kernel asks for (pre-packed weights), computed once."""
        key = canonical_json(spec)
        if (pos, key) not in self.relaid:
            self.relaid[(pos, key)] = layout_from_json(spec).apply(self.inputs[pos])
        return key, self.relaid[(pos, key)]


def task_data(task: Any, seed: int = 0) -> TaskData:
    """Random inputs (seeded by the workload key and ``seed``) and the reference outputs of ``task``."""
    graph = task.group.subgraph
    task_seed = (int(task.workload_key[:12], 16) ^ seed) & 0x7FFFFFFF
    inputs = [np.ascontiguousarray(a) for a in reference.random_inputs(graph, task_seed)]
    # One BLAS/OpenMP thread for the reference: a multi-threaded BLAS keeps its threads spinning for about
    # 0.1 s after a call, and the first candidate timed right after it (the default config, always first)
    # shared the cores with them and was measured up to 50x slow, so tuning "beat" a default it never saw.
    with threadpool_limits(limits=1):
        refs = [np.ascontiguousarray(r) for r in reference.run_reference(graph, inputs)]
    names = [v.name or f"in{k}" for k, v in enumerate(graph.inputs)]
    out_names = [v.name or f"out{k}" for k, v in enumerate(task.group.outputs)]
    return TaskData(task.workload_key, inputs, refs, names, out_names, task_seed)


def compare(out: np.ndarray, ref: np.ndarray, name: str, tf32: bool = False) -> str | None:
    """None if ``out`` matches ``ref`` (floats: max|err| <= rtol * max(1, max|ref|), NaN where the reference
    is NaN; other dtypes: exactly), else a message with the largest error and where it is. ``tf32``: the
    candidate ran with TF32 math (:func:`rtol_for`)."""
    if not dtypes.is_float_numpy(ref.dtype):
        flat_out, flat_ref = out.reshape(-1), ref.reshape(-1)
        if ref.dtype == np.bool_:  # compare the bytes: a poisoned bool (0xA5) is neither true nor false
            flat_out, flat_ref = flat_out.view(np.uint8), flat_ref.view(np.uint8)
        bad = np.flatnonzero(flat_out != flat_ref)
        if bad.size:
            at = np.unravel_index(int(bad[0]), ref.shape) if ref.shape else ()
            got, want = out.reshape(-1)[bad[0]], ref.reshape(-1)[bad[0]]
            return (
                f"output '{name}': {bad.size} of {ref.size} elements differ from the reference "
                f"(first at {list(map(int, at))}: got {got!r}, expected {want!r})"
            )
        return None
    o = out.astype(np.float64).reshape(-1)
    r = ref.astype(np.float64).reshape(-1)
    nan_o, nan_r = np.isnan(o), np.isnan(r)
    if (nan_o != nan_r).any():
        k = int(np.flatnonzero(nan_o != nan_r)[0])
        count = int((nan_o != nan_r).sum())
        at = list(map(int, np.unravel_index(k, ref.shape))) if ref.shape else []
        return (
            f"output '{name}': {count} of {ref.size} elements are NaN where the reference is not, or the "
            f"reverse (unwritten outputs stay NaN); first at {at}: got {o[k]!r}, expected {r[k]!r}"
        )
    finite = np.isfinite(r)
    inf_bad = ~finite & ~nan_r & (o != r)
    if inf_bad.any():
        k = int(np.flatnonzero(inf_bad)[0])
        return f"output '{name}': got {o[k]!r} where the reference is {r[k]!r}"
    if not finite.any():
        return None
    with np.errstate(all="ignore"):
        err = np.abs(np.where(finite, o - r, 0.0))
    scale = max(1.0, float(np.abs(r[finite]).max()))
    rtol = rtol_for(ref.dtype.name, tf32)
    k = int(err.argmax())
    if not err[k] <= rtol * scale:  # also catches inf - finite
        at = list(map(int, np.unravel_index(k, ref.shape))) if ref.shape else []
        return (
            f"output '{name}': max |error| {err[k]:.3g} at {at} (got {o[k]:.6g}, expected {r[k]:.6g}) "
            f"exceeds {rtol:g} * max(1, max|ref|) = {rtol * scale:.3g}"
        )
    return None


def signature_problem(info: dict[str, Any], data: TaskData, relaid: dict[int, np.ndarray]) -> str | None:
    """None when the kernel's parameters (``info["params"]``: name, shape, dtype) take the group's buffers
    (inputs, relaid when the kernel asks for a layout, then outputs), else what differs. Kernels take flat
    buffers: what must agree is each buffer's number of elements and dtype."""
    params = info.get("params")
    if params is None:
        return None
    inputs = [relaid.get(k, a) for k, a in enumerate(data.inputs)]
    expected = [(int(a.size), a.dtype.name) for a in (*inputs, *data.refs)]
    got = [(math.prod(shape), dtype) for _, shape, dtype in params]
    if got != expected:
        return f"kernel parameters (elements, dtype) {got} do not match the group's buffers {expected}"
    return None
