"""fold_conv_scale: a per-output-channel constant scale after a conv2d moves into its weights (BatchNorm
folding), and nothing else is touched."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.builder import GraphBuilder
from compiler.passes import decompose, fold_constants, fold_conv_scale, optimize
from compiler.reference import run_reference

RNG = np.random.default_rng(0)


def conv_bn(groups: int = 1, extra_use: bool = False, scale_shape: tuple[int, ...] | None = None):
    b = GraphBuilder("conv_bn")
    x = b.input("x", (2, 4, 6, 6))
    w = b.param("w", RNG.standard_normal((8, 4 // groups, 3, 3)).astype(np.float32))
    y = b.conv2d(x, w, padding=(1, 1), groups=groups)
    if scale_shape is None:
        gamma, beta, mean = (b.param(n, RNG.standard_normal(8).astype(np.float32)) for n in "gbm")
        var = b.param("v", RNG.random(8).astype(np.float32) + 0.5)
        out = b.relu(b.batch_norm(y, gamma, beta, mean, var, axis=1, eps=1e-5))
    else:
        out = b.multiply(y, b.param("s", RNG.standard_normal(scale_shape).astype(np.float32)))
    outs = [out, b.relu(y)] if extra_use else [out]
    return b.build(outs), [RNG.standard_normal((2, 4, 6, 6)).astype(np.float32)]


def ops(graph) -> list[str]:
    return [n.op for n in graph.nodes]


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_batch_norm_scale_moves_into_the_weights(groups):
    graph, inputs = conv_bn(groups)
    opt = optimize(graph)
    assert "multiply" not in ops(opt)
    np.testing.assert_allclose(run_reference(opt, inputs)[0], run_reference(graph, inputs)[0], atol=1e-4)


def test_a_conv_output_used_elsewhere_is_not_folded():
    graph, inputs = conv_bn(extra_use=True)
    opt = optimize(graph)
    assert "multiply" in ops(opt)
    for got, want in zip(run_reference(opt, inputs), run_reference(graph, inputs)):
        np.testing.assert_allclose(got, want, atol=1e-4)


@pytest.mark.parametrize("shape", [(8, 1, 1), (1, 8, 1, 1), ()])
def test_per_channel_and_scalar_scales_fold(shape):
    graph, inputs = conv_bn(scale_shape=shape)
    folded = fold_conv_scale(fold_constants(decompose(graph)))
    assert ops(optimize(graph)).count("multiply") == 0
    np.testing.assert_allclose(run_reference(folded, inputs)[0], run_reference(graph, inputs)[0], atol=1e-4)


@pytest.mark.parametrize("shape", [(8, 6, 1), (1, 1, 6, 6)])
def test_a_scale_that_varies_over_pixels_stays(shape):
    graph, inputs = conv_bn(scale_shape=shape)
    opt = optimize(graph)
    assert "multiply" in ops(opt)
    np.testing.assert_allclose(run_reference(opt, inputs)[0], run_reference(graph, inputs)[0], atol=1e-4)
