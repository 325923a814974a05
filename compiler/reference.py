"""Run any graph with numpy through the op registry: the ground truth for every test and trial."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from compiler import dtypes
from compiler.errors import KilnError
from compiler.graph import Graph, Value
from compiler.ops import get_op


def bind_inputs(graph: Graph, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Check given inputs against the graph's input types; return them in graph order."""
    if isinstance(inputs, Mapping):
        names = [v.name for v in graph.inputs]
        missing = [n for n in names if n not in inputs]
        extra = sorted(set(inputs) - set(names))
        if missing or extra:
            raise KilnError(
                f"graph {graph.name} expects inputs {names}; missing {missing or 'none'}, "
                f"unexpected {extra or 'none'}"
            )
        arrays = [inputs[n] for n in names]  # type: ignore[index]
    else:
        arrays = list(inputs)
        if len(arrays) != len(graph.inputs):
            raise KilnError(f"graph {graph.name} takes {len(graph.inputs)} inputs, got {len(arrays)}")
    out = []
    for v, a in zip(graph.inputs, arrays):
        a = np.asarray(a)
        if tuple(a.shape) != v.shape:
            raise KilnError(f"input '{v.name}' must have shape {list(v.shape)}, got {list(a.shape)}")
        if a.dtype != dtypes.to_numpy(v.dtype):
            raise KilnError(f"input '{v.name}' must be {v.dtype}, got {a.dtype}")
        out.append(a)
    return out


def run_reference(graph: Graph, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray]) -> list[np.ndarray]:
    env: dict[Value, np.ndarray] = dict(zip(graph.inputs, bind_inputs(graph, inputs)))
    for p in graph.params:
        env[p] = p.data  # type: ignore[assignment]
    for node in graph.nodes:
        result = get_op(node.op).reference(*(env[v] for v in node.inputs), **node.attrs)
        out = node.output
        env[out] = np.asarray(result).astype(dtypes.to_numpy(out.dtype), copy=False).reshape(out.shape)
    return [env[v] for v in graph.outputs]


def random_inputs(graph: Graph, seed: int = 0) -> list[np.ndarray]:
    """Deterministic random inputs: standard normal floats, small non-negative ints, random bools."""
    rng = np.random.default_rng(seed)
    out = []
    for v in graph.inputs:
        if dtypes.is_float(v.dtype):
            out.append(rng.standard_normal(v.shape).astype(dtypes.to_numpy(v.dtype)))
        elif v.dtype == "bool":
            out.append(rng.random(v.shape) < 0.5)
        else:
            out.append(rng.integers(0, 8, v.shape).astype(dtypes.to_numpy(v.dtype)))
    return out
