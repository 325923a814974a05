"""CudaCompiledModel end to end on a fake CuPy whose kernels run in the SIMT interpreter: the memory
plan, views, params, inputs on the host or the "device", out=, CUDA Graph capture and replay."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.backends.cuda.codegen import kernel_names
from compiler.backends.cuda.device import current_cuda_target
from compiler.backends.cuda.lower import kernel_parts
from compiler.build import compile as kiln_compile
from compiler.build import plan_model
from compiler.builder import GraphBuilder
from compiler.loopir.stmt import PrimFunc
from compiler.reference import random_inputs, run_reference
from tests.compiler.backends.cuda import fake_cupy


@pytest.fixture
def fake_gpu(monkeypatch):
    fake_cupy.install(monkeypatch)
    monkeypatch.delenv("KILN_DISABLE_CUPY", raising=False)
    current_cuda_target.cache_clear()
    fake_cupy.KERNELS.clear()
    fake_cupy.LAUNCHES.clear()
    yield fake_cupy
    current_cuda_target.cache_clear()


def register(graph, target) -> None:
    """Make the fake device know every kernel of the model (same plan as compile())."""
    for k in plan_model(graph, target).kernels:
        for name, part in zip(kernel_names(k.func), kernel_parts(k.func.body)):
            fake_cupy.KERNELS[name] = PrimFunc(name, k.func.params, part, k.func.num_inputs)


def small_model():
    b = GraphBuilder("small")
    x = b.input("x", (6, 64))
    w = b.param("w", np.random.default_rng(0).standard_normal((64, 48)).astype(np.float32) / 8)
    h = b.relu(b.matmul(x, w))
    y = b.softmax(b.reshape(h, (12, 24)), axis=-1)
    return b.build(
        [y, b.layer_norm(h, b.param("g", np.ones(48, np.float32)), b.param("bb", np.zeros(48, np.float32)))]
    )


def test_target_from_the_device(fake_gpu):
    from compiler.target import Target

    t = Target.parse("cuda")
    assert t.key == "cuda/sm_90/Fake GPU (SIMT interpreter)" and t.cores == 4


def test_model_runs_and_matches_reference(fake_gpu):
    graph = small_model()
    model = kiln_compile(graph, "cuda")
    register(graph, model.target)
    inputs = random_inputs(graph, seed=0)
    refs = run_reference(graph, inputs)
    outs = model.run(inputs)
    for o, r in zip(outs, refs):
        np.testing.assert_allclose(o, r, rtol=2e-5, atol=2e-5)
    # launches follow the plan, with the grid/block the bindings gave
    names = [name for name, *_ in fake_gpu.LAUNCHES]
    assert names == [launch.kernel for launch in model.launches]
    assert all(grid[0] >= 1 and block[0] >= 1 for _, grid, block, _ in fake_gpu.LAUNCHES)
    # out= host arrays, and device-side inputs without staging
    out = [np.empty_like(r, dtype=np.float32) for r in refs]
    model.run(inputs, out=out)
    np.testing.assert_allclose(out[0], refs[0], rtol=2e-5, atol=2e-5)
    dev = model.run_device({"x": fake_gpu.asarray(inputs[0])})
    np.testing.assert_allclose(dev[1].get(), refs[1], rtol=2e-5, atol=2e-5)


def test_cuda_graph_captures_once_and_replays(fake_gpu):
    graph = small_model()
    model = kiln_compile(graph, "cuda")
    register(graph, model.target)
    for seed in (1, 2):
        inputs = random_inputs(graph, seed=seed)
        outs = model.run(inputs, cuda_graph=True)
        for o, r in zip(outs, run_reference(graph, inputs)):
            np.testing.assert_allclose(o, r, rtol=2e-5, atol=2e-5)
    graph_obj, _ = model._graph
    assert graph_obj.launches == 2 and len(graph_obj.calls) == len(model.launches)
    stats = model.timeit(random_inputs(graph, seed=3), repeats=2, warmup=1, cuda_graph=True)
    assert stats["repeats"] == 2 and stats["median_us"] >= 0


def test_cuda_graph_replays_over_its_own_input_buffers_without_copies(fake_gpu, monkeypatch):
    graph = small_model()
    model = kiln_compile(graph, "cuda")
    register(graph, model.target)
    inputs = random_inputs(graph, seed=4)
    staged = model.graph_inputs()
    assert list(staged) == model.input_names
    for buf, value in zip(staged.values(), inputs):
        buf.set(value)
    copies = []
    monkeypatch.setattr(type(staged["x"]), "__setitem__", lambda self, k, v: copies.append(k))
    outs = model.run_device(staged, cuda_graph=True)
    assert copies == []  # nothing staged: the graph read the buffers filled in place
    for o, r in zip(outs, run_reference(graph, inputs)):
        np.testing.assert_allclose(o.get(), r, rtol=2e-5, atol=2e-5)


def test_bad_inputs_are_clear_errors(fake_gpu):
    from compiler.errors import KilnError

    model = kiln_compile(small_model(), "cuda")
    with pytest.raises(KilnError, match=r"input 'x': expected float32\[6, 64\], got float64\[6, 64\]"):
        model.run({"x": np.zeros((6, 64))})
    with pytest.raises(KilnError, match="missing"):
        model.run({})
