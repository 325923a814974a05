"""split_k: a small-M, large-K matmul becomes S partial GEMMs (batch_matmul) summed by a reduce_sum that
its epilogue (bias, GELU, residual) reads; the rewritten graph computes the original; other shapes are
left alone."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.builder import GraphBuilder
from compiler.passes.split_k import split_factor, split_k
from compiler.reference import run_reference

RNG = np.random.default_rng(0)


def projection(m: int, k: int, n: int, epilogue: str, linear: bool = False):
    """x @ w (+ epilogue); ``linear``: x [1, M, K] by w [N, K] with transpose_b (torch's layout)."""
    b = GraphBuilder("proj")
    x = b.input("x", (1, m, k) if linear else (m, k))
    r = b.input("r", (1, m, n) if linear else (m, n))
    w = b.param("w", RNG.standard_normal((n, k) if linear else (k, n)).astype(np.float32))
    y = b.matmul(x, w, transpose_b=linear)
    if epilogue in ("bias_gelu", "residual"):
        y = b.add(y, b.param("bias", RNG.standard_normal((n,)).astype(np.float32)))
    if epilogue == "bias_gelu":
        y = b.gelu(y)
    if epilogue == "residual":
        y = b.add(y, r)
    lead = (1,) if linear else ()
    inputs = [
        RNG.standard_normal((*lead, m, k)).astype(np.float32),
        RNG.standard_normal((*lead, m, n)).astype(np.float32),
    ]
    return b.build([y]), inputs


def test_split_factor_rule():
    s = split_factor(128, 768, 3072, 132)
    assert s > 1 and 3072 % s == 0 and 6 * s <= 132 and 3072 // s >= 256
    assert split_factor(4096, 4096, 4096, 132) == 1  # many tiles: left alone
    assert split_factor(128, 768, 256, 132) == 1  # K too short to split
    assert split_factor(128, 768, 3079, 132) == 1  # prime K: no divisor


@pytest.mark.parametrize("linear", [False, True])
@pytest.mark.parametrize("epilogue", ["none", "bias_gelu", "residual"])
@pytest.mark.parametrize(("m", "k", "n", "sms"), [(8, 1024, 16, 8), (5, 1536, 12, 16), (16, 768, 8, 4)])
def test_rewritten_graph_computes_the_original(m, k, n, sms, epilogue, linear):
    graph, inputs = projection(m, k, n, epilogue, linear)
    rewritten = split_k(graph, sm_count=sms)
    ops = [node.op for node in rewritten.nodes]
    assert "matmul" not in ops and "batch_matmul" in ops and "reduce_sum" in ops
    (bmm,) = [node for node in rewritten.nodes if node.op == "batch_matmul"]
    s = bmm.output.shape[0]
    assert s == split_factor(m, n, k, sms) and s > 1 and bmm.output.shape == (s, m, n)
    assert rewritten.outputs[0].shape == graph.outputs[0].shape
    (want,), (got,) = run_reference(graph, inputs), run_reference(rewritten, inputs)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize(("m", "k", "n"), [(2048, 3072, 768), (8, 1031, 16), (8, 128, 16)])
def test_large_m_prime_or_short_k_left_alone(m, k, n):
    graph, _ = projection(m, k, n, "none")
    assert [node.op for node in split_k(graph, sm_count=8).nodes] == [node.op for node in graph.nodes]
