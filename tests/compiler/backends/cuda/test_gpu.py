"""On a GPU (``pytest -m gpu``): every built-in model compiled for cuda matches the numpy reference,
with and without CUDA Graph replay; skipped with the reason when CuPy or a GPU is missing."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.backends.cuda.device import why_unavailable
from compiler.frontend.models import MODELS

pytestmark = pytest.mark.gpu

REASON = why_unavailable()


@pytest.fixture(scope="module", autouse=True)
def _need_gpu():
    if REASON is not None:
        pytest.skip(f"no GPU for the cuda tests: {REASON}")


def _inputs(graph, seed=0):
    rng = np.random.default_rng(seed)
    return {v.name: rng.standard_normal(v.shape).astype(v.dtype) for v in graph.inputs}


@pytest.mark.parametrize("name", list(MODELS))
def test_model_matches_reference(name):
    from compiler.build import compile as kiln_compile
    from compiler.reference import run_reference

    graph = MODELS[name].graph()
    model = kiln_compile(graph, "cuda")
    inputs = _inputs(graph)
    refs = run_reference(graph, inputs)
    for graph_mode in (False, True):
        outs = model.run(inputs, cuda_graph=graph_mode)
        for o, r in zip(outs, refs):
            scale = max(1.0, float(np.abs(r).max()))
            err = float(np.abs(o.astype(np.float64) - r).max())
            assert err <= 2e-4 * scale, f"{name} (cuda_graph={graph_mode}): max err {err:.3g}"
    stats = model.timeit(inputs, repeats=5, warmup=2)
    assert stats["median_us"] > 0


def test_device_inputs_and_outputs():
    import cupy as cp

    from compiler.build import compile as kiln_compile

    graph = MODELS["softmax"].graph()
    model = kiln_compile(graph, "cuda")
    x = np.random.default_rng(1).standard_normal((64, 128)).astype(np.float32)
    (y,) = model.run_device({"x": cp.asarray(x)})
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(cp.asnumpy(y), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
