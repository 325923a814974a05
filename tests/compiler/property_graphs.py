"""What the sketch property tests share, for every target: the small graphs they draw shapes for, and the
configs drawn from a sketch's space that pass its ``check`` (each target's test then builds and runs them
in its own interpreter)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
from hypothesis import strategies as st

from compiler.backends import sketch_for
from compiler.backends.sketch import Config, Sketch
from compiler.builder import GraphBuilder
from compiler.errors import ScheduleError
from compiler.fusion import Group, fuse
from compiler.graph import Graph
from compiler.passes import optimize
from compiler.target import Target

UNARY = ["exp", "tanh", "relu", "sigmoid", "erf", "neg"]
REDUCERS = ["softmax", "log_softmax", "layer_norm", "rms_norm", "reduce_sum", "reduce_mean", "reduce_max"]
EPILOGUES = ["none", "bias", "bias_relu", "residual"]


def legal_configs(
    graph: Graph, data: st.DataObject, kind: str, target: Target
) -> Iterator[tuple[Group, Sketch, Config]]:
    """For each ``kind`` group of ``graph``: a config drawn from its sketch's space, when ``check`` accepts it
    (a config rejected up front is allowed). Fails if the graph has no such group."""
    seen = 0
    for group in fuse(optimize(graph)).groups:
        if group.kind != kind or group.is_view:
            continue
        seen += 1
        sketch = sketch_for(group, target)
        config = {
            k.name: data.draw(st.sampled_from(k.values), label=k.name) for k in sketch.space(group, target)
        }
        try:
            sketch.check(group, config, target)
        except ScheduleError:
            continue
        yield group, sketch, config
    assert seen, f"no {kind} group in the test graph"


def inputs_for(group: Group, seed: int = 0) -> list[np.ndarray]:
    """Random inputs for a group's subgraph (normal floats, random booleans)."""
    rng = np.random.default_rng(seed)
    return [
        rng.standard_normal(v.shape).astype(v.dtype) if v.dtype != "bool" else rng.random(v.shape) < 0.5
        for v in group.subgraph.inputs
    ]


def pointwise_graph(rows: int, cols: int, ops: Sequence[str], bias: bool, three_d: bool) -> Graph:
    b = GraphBuilder("pw")
    x = b.input("x", (2, rows, cols) if three_d else (rows, cols))
    y = b.add(x, b.param("b", np.linspace(-1, 1, cols, dtype=np.float32))) if bias else x
    for op in ops:
        y = b.apply(op, y)
    return b.build([b.where(b.greater(y, 0.25), y, b.multiply(y, 2.0))])


def pooling_graph(hw: int, k: int, s: int, pad: int, avg: bool, include_pad: bool = False) -> Graph:
    pad = min(pad, k - 1)
    b = GraphBuilder("pool")
    x = b.input("x", (1, 2, hw, hw + 1))
    y = (
        b.avg_pool2d(x, (k, k), (s, s), (pad, pad), count_include_pad=include_pad)
        if avg
        else b.max_pool2d(x, (k, k), (s, s), (pad, pad))
    )
    return b.build([b.relu(y)])


def reduction_graph(op: str, rows: int, cols: int, lead: bool, axis0: bool) -> Graph:
    b = GraphBuilder("red")
    x = b.input("x", (2, rows, cols) if lead else (rows, cols))
    w = b.param("w", np.linspace(0.5, 1.5, cols, dtype=np.float32))
    if op == "layer_norm":
        y = b.layer_norm(x, w, b.param("bb", np.linspace(-1, 1, cols, dtype=np.float32)))
    elif op == "rms_norm":
        y = b.rms_norm(x, w)
    elif op in ("softmax", "log_softmax"):
        y = b.apply(op, x, axis=-1)
    else:  # plain reductions, over the last axis or (non-row form) over the first
        y = b.apply(op, x, axes=[0] if axis0 else [-1], keepdims=not axis0)
    return b.build([y])


def matmul_graph(m: int, n: int, k: int, ta: bool, tb: bool, epilogue: str, weight: bool = False) -> Graph:
    """``weight``: the right operand is a constant (the CPU sketch can pack it at compile time)."""
    b = GraphBuilder("mm")
    a = b.input("a", (k, m) if ta else (m, k))
    wshape = (n, k) if tb else (k, n)
    w = (
        b.param("w", np.linspace(-1, 1, n * k, dtype=np.float32).reshape(wshape))
        if weight
        else b.input("w", wshape)
    )
    y = b.matmul(a, w, transpose_a=ta, transpose_b=tb)
    if epilogue.startswith("bias"):
        y = b.add(y, b.param("bias", np.linspace(-1, 1, n, dtype=np.float32)))
    if epilogue == "bias_relu":
        y = b.relu(y)
    if epilogue == "residual":
        y = b.add(y, b.input("r", (m, n)))
    return b.build([y])


def batch_matmul_graph(batch: tuple[int, ...], m: int, n: int, k: int, tb: bool, bcast: bool) -> Graph:
    b = GraphBuilder("bmm")
    a = b.input("a", (*batch, m, k))
    wb = (1,) * len(batch) if bcast else batch
    w = b.input("w", (*wb, n, k) if tb else (*wb, k, n))
    return b.build([b.multiply(b.batch_matmul(a, w, transpose_b=tb), 0.5)])


def conv_graph(c: int, o: int, hw: int, k: int, s: int, pad: int, groups: int, dil: int = 1) -> Graph:
    """conv2d + bias + relu; ``c`` input channels per group."""
    c = c * groups
    if dil * (k - 1) + 1 > hw + 2 * pad:
        dil = 1
    b = GraphBuilder("conv")
    x = b.input("x", (1, c, hw, hw))
    w = b.param("w", np.random.default_rng(1).standard_normal((o, c // groups, k, k)).astype(np.float32))
    y = b.conv2d(x, w, strides=(s, s), padding=(pad, pad), dilation=(dil, dil), groups=groups)
    return b.build([b.relu(b.add(y, b.param("bias", np.ones((o, 1, 1), np.float32))))])
