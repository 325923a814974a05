"""Graph passes: decomposition equals the composite (hypothesis), folding, CSE, DCE, pipeline."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler.builder import GraphBuilder
from compiler.errors import GraphError
from compiler.graph import Graph
from compiler.ops import get_op
from compiler.passes import PassPipeline, cse, dce, decompose, fold_constants, optimize
from compiler.reference import run_reference

shapes = st.lists(st.integers(1, 6), min_size=1, max_size=4).map(tuple)


def _compare(build, shape, seed, rtol=2e-5, atol=2e-6):
    b = GraphBuilder()
    x = b.input("x", shape)
    out = build(b, x, np.random.default_rng(seed))
    g = b.build([out])
    d = decompose(g)
    assert not any(get_op(n.op).is_composite for n in d.nodes)
    xv = np.random.default_rng(seed + 1).standard_normal(shape).astype(np.float32) * 3
    (expect,), (got,) = run_reference(g, [xv]), run_reference(d, [xv])
    np.testing.assert_allclose(got, expect, rtol=rtol, atol=atol)


def _param(b, rng, shape, lo=-1.0, hi=1.0):
    return b.param("p", rng.uniform(lo, hi, shape).astype(np.float32))


COMPOSITES = {
    "softmax": lambda b, x, r, ax: b.softmax(x, axis=ax),
    "log_softmax": lambda b, x, r, ax: b.log_softmax(x, axis=ax),
    "layer_norm": lambda b, x, r, ax: b.layer_norm(
        x, _param(b, r, x.shape[ax:]), _param(b, r, x.shape[ax:]), axis=ax
    ),
    "rms_norm": lambda b, x, r, ax: b.rms_norm(x, _param(b, r, x.shape[ax:]), axis=ax),
    "reduce_mean": lambda b, x, r, ax: b.reduce_mean(x, axes=[ax], keepdims=bool(ax % 2)),
    "gelu": lambda b, x, r, ax: b.gelu(x),
    "gelu_tanh": lambda b, x, r, ax: b.gelu(x, approximate="tanh"),
    "linear": lambda b, x, r, ax: b.linear(x, _param(b, r, (3, x.shape[-1])), _param(b, r, (3,))),
}


@pytest.mark.parametrize("name", sorted(COMPOSITES))
@settings(max_examples=25, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**16), axis_pick=st.integers(0, 3))
def test_decomposition_equals_composite(name, shape, seed, axis_pick):
    axis = axis_pick % len(shape)
    # a norm over a short axis whose values nearly agree divides by a variance near eps: ill-conditioned in
    # float32, where the composite and its decomposition round the mean and variance differently (CI found
    # layer_norm over 2 values off by 5.5e-6 on an output of 0.145); elsewhere the tight default
    loose = name in ("layer_norm", "rms_norm")
    tol = {"rtol": 1e-4, "atol": 1e-5} if loose else {}
    _compare(lambda b, x, r: COMPOSITES[name](b, x, r, axis), shape, seed, **tol)


@settings(max_examples=25, deadline=None)
@given(c=st.integers(1, 5), hw=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_batch_norm_and_global_pool_decompose(c, hw, seed):
    def bn(b, x, r):
        return b.batch_norm(
            x, _param(b, r, (c,)), _param(b, r, (c,)), _param(b, r, (c,)), _param(b, r, (c,), 0.5, 1.5)
        )

    _compare(bn, (2, c, hw, hw), seed)
    _compare(lambda b, x, r: b.global_avg_pool2d(x), (2, c, hw, hw + 1), seed)


def test_fold_constants_folds_param_math_but_not_broadcasts():
    b = GraphBuilder("f")
    x = b.input("x", (4, 3))
    w = b.param("w", np.array([1.0, 4.0, 9.0], np.float32))
    scale = b.rsqrt(b.add(w, 0.0))  # folds to a param
    big = b.broadcast_to(b.constant(2.0), (4, 3))  # must stay lazy
    g = b.build([b.multiply(b.multiply(x, scale), big)])
    f = dce(fold_constants(g))
    ops = [n.op for n in f.nodes]
    assert "rsqrt" not in ops and "broadcast_to" in ops
    folded = [p for p in f.params if p.name == "rsqrt"]
    np.testing.assert_allclose(folded[0].data, [1, 0.5, 1 / 3], rtol=1e-6)
    xv = np.ones((4, 3), np.float32)
    np.testing.assert_allclose(run_reference(f, [xv])[0], run_reference(g, [xv])[0])


def test_cse_and_dce():
    b = GraphBuilder("c")
    x = b.input("x", (5,))
    w1 = b.param("w1", np.ones(5, np.float32))
    w2 = b.param("w2", np.ones(5, np.float32))
    a1, a2 = b.add(x, w1), b.add(x, w2)
    b.exp(x)  # dead
    g = b.build([b.multiply(b.exp(a1), b.exp(a2))])
    out = dce(cse(g))
    assert [n.op for n in out.nodes] == ["add", "exp", "multiply"]
    assert len(out.params) == 1
    assert len(g.nodes) == 6  # the input graph is untouched


def test_pipeline_validates_after_each_pass_and_names_the_pass():
    def broken(graph: Graph) -> Graph:
        return Graph(graph.name, graph.inputs, graph.params, graph.nodes[1:], graph.outputs)

    b = GraphBuilder()
    x = b.input("x", (4, 8))
    g = b.build([b.softmax(x)])
    with pytest.raises(GraphError, match="pass broken produced an invalid graph"):
        PassPipeline([decompose, broken]).run(g)
    p = PassPipeline([decompose, cse])
    p.run(g)
    assert [name for name, _ in p.history] == ["decompose", "cse"]


def test_optimize_is_idempotent():
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    g = optimize(
        b.build(
            [b.layer_norm(x, b.param("g", np.ones(8, np.float32)), b.param("b", np.zeros(8, np.float32)))]
        )
    )
    assert optimize(g).structural_hash() == g.structural_hash()
