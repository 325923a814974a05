"""Softmax's exp(x - max(x)) as ``exp_le0`` (one clamp, a degree-5 polynomial): which groups get it, and
the compiled kernels against the reference on the inputs where a cheaper exp could go wrong (-inf masks,
huge negative scores, underflow to 0 and to subnormals, rows of -inf)."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.backends import get_backend
from compiler.backends.cpu.codegen import generate_c
from compiler.backends.cpu.sketches.common import nonpositive_exps
from compiler.build import compile as build_compile
from compiler.build import plan_model
from compiler.builder import GraphBuilder
from compiler.fusion import fuse
from compiler.graph import Graph
from compiler.passes import optimize
from compiler.reference import run_reference
from compiler.target import Target
from tests.targets import PINNED_TARGETS


def _graph(kind: str, shape: tuple[int, ...] = (8, 64)) -> Graph:
    b = GraphBuilder(kind)
    x = b.input("x", shape)
    if kind == "softmax":
        out = b.softmax(x, axis=-1)
    elif kind == "log_softmax":
        out = b.log_softmax(x, axis=-1)
    elif kind == "exp_sum":  # exp of x itself: arguments of any sign
        e = b.exp(x)
        out = b.divide(e, b.reduce_sum(e, axes=[-1], keepdims=True))
    elif kind == "other_max":  # x minus the max of another tensor
        y = b.input("y", shape)
        out = b.exp(b.subtract(x, b.reduce_max(y, axes=[-1], keepdims=True)))
    elif kind == "min_shift":  # x minus its min: never negative
        out = b.exp(b.subtract(x, b.reduce_min(x, axes=[-1], keepdims=True)))
    else:  # softmax beside a second exp of x itself, in one group
        e = b.exp(b.subtract(x, b.reduce_max(x, axes=[-1], keepdims=True)))
        out = b.multiply(b.divide(e, b.reduce_sum(e, axes=[-1], keepdims=True)), b.exp(x))
    return b.build([out])


def _groups(graph: Graph):
    return [g for g in fuse(optimize(graph), None).groups if any(n.op == "exp" for n in g.subgraph.nodes)]


@pytest.mark.parametrize(
    "kind, expected",
    [
        ("softmax", True),
        ("log_softmax", True),
        ("exp_sum", False),
        ("other_max", False),
        ("min_shift", False),
        ("mixed", False),
    ],
)
def test_only_exps_of_x_minus_its_own_max_are_nonpositive(kind: str, expected: bool):
    groups = _groups(_graph(kind))
    assert groups and all(nonpositive_exps(g) is expected for g in groups)


@pytest.mark.parametrize("isa", sorted(PINNED_TARGETS))
@pytest.mark.parametrize("kind", ["softmax", "exp_sum"])
def test_generated_code_uses_exp_le0_for_softmax_only(isa: str, kind: str):
    target = PINNED_TARGETS[isa]
    plan = plan_model(_graph(kind, (16, 256)), target)
    src = generate_c([k.func for k in plan.kernels], target)
    body = src[src.index("\nvoid ") :]  # the kernels, after the prelude
    if kind == "softmax":
        assert "kiln_exp_le0_f32x" in body and "kiln_exp_f32x" not in body
    else:
        assert "kiln_exp_f32x" in body and "kiln_exp_le0" not in body


def _hard_rows(rows: int, cols: int) -> np.ndarray:
    """Rows where a cheap exp could fail: masks, huge gaps, underflow to subnormals and to 0."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((rows, cols)) * 4).astype(np.float32)
    x[0, 1::2] = -np.inf  # an attention mask
    x[1] = -np.inf  # a row masked out but for one score: a one-hot output
    x[1, 5] = 3.0
    x[2, ::3] = -1e30  # a finite mask value
    x[3] = np.linspace(-120, 0, cols, dtype=np.float32)  # exps from 1 down to subnormals and 0
    x[4] = -3.4028235e38  # every score the lowest float: exp(0) each
    x[5] = np.float32(80.0) + np.linspace(0, 1, cols, dtype=np.float32)  # large positive scores
    x[6, ::4] = 88.0
    x[6, 1::4] = -88.0
    x[7] = -np.inf  # masked out entirely: nan (-inf - -inf), as in the reference
    return x


def _check(out: np.ndarray, ref: np.ndarray, masked: np.ndarray) -> None:
    same_nan = np.isnan(out) == np.isnan(ref)
    assert same_nan.all(), f"nan where the reference has none or the reverse: rows {np.nonzero(~same_nan)[0]}"
    fin = ~np.isnan(ref)
    err = np.abs(out[fin].astype(np.float64) - ref[fin].astype(np.float64))
    assert err.max(initial=0.0) <= 1e-6, err.max()
    assert (out[masked & fin] == 0).all()  # a -inf score gives exactly 0


@pytest.mark.parametrize("vector", [1, 4, 8, 16])
@pytest.mark.parametrize("keep", ["buffer", "recompute"])
def test_softmax_kernels_match_the_reference_on_hard_rows(vector: int, keep: str):
    target = Target.host()
    if vector > target.vector_lanes_f32:
        pytest.skip(f"{vector} lanes: the host ({target.isa}) has {target.vector_lanes_f32}")
    graph = _graph("softmax", (8, 256))

    def source(group, tgt):
        sketch = get_backend(tgt).sketch_for(group)
        over = {"vector": vector, "accum": 1, "unroll": 1, "keep": keep}
        return sketch.name, {**sketch.default(group, tgt), **over}, "test"

    model = build_compile(graph, target, configs=source)
    assert "kiln_exp_le0" in model.source
    x = _hard_rows(8, 256)
    with np.errstate(all="ignore"):
        ref = run_reference(graph, [x])[0]
    _check(model.run([x])[0], ref, np.isneginf(x))


def test_log_softmax_matches_the_reference():
    graph = _graph("log_softmax", (8, 256))
    model = build_compile(graph, Target.host())
    assert "kiln_exp_le0" in model.source
    x = _hard_rows(8, 256)
    x[np.isneginf(x)] = -1e30  # log_softmax of -inf is -inf - (...) : keep it finite
    ref = run_reference(graph, [x])[0]
    out = model.run([x])[0]
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-4)
