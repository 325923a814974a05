"""Non-temporal stores (the reduction sketch's ``store`` knob): the kernel streams its full-size output
where the address is aligned, falls back to ordinary stores where it is not, and fences every thread."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from compiler.backends import get_backend
from compiler.build import compile as build_compile
from compiler.builder import GraphBuilder
from compiler.reference import random_inputs, run_reference
from compiler.target import Target
from tests.compiler.backends.cpu.util import kernel_text


def _layernorm(rows: int, n: int):
    b = GraphBuilder("ln")
    rng = np.random.default_rng(0)
    g = b.param("g", rng.standard_normal(n).astype(np.float32))
    beta = b.param("beta", rng.standard_normal(n).astype(np.float32))
    return b.build([b.layer_norm(b.input("x", (rows, n)), g, beta, eps=1e-5)])


def _softmax(rows: int, n: int):
    b = GraphBuilder("sm")
    return b.build([b.softmax(b.input("x", (rows, n)), axis=-1)])


def _compile(graph, target=None, **over):
    def source(group, target):
        sketch = get_backend(target).sketch_for(group)
        return sketch.name, {**sketch.default(group, target), **over}, "test"

    return build_compile(graph, target or Target.host(), configs=source)


@pytest.mark.parametrize("parallel", ["rows", "none"])
def test_streamed_output_is_right_aligned_or_not(parallel: str):
    graph = _layernorm(64, 256)
    model = _compile(graph, store="stream", parallel=parallel)
    assert model.kernels[0].config["store"] == "stream"
    text = kernel_text(model.source, model.kernels[0].name)
    if Target.host().vector_lanes_f32 > 1:
        assert "kiln_stream_f32x" in text
    assert text.rstrip().endswith("kiln_sfence();\n}")
    if parallel == "rows":  # each chunk fences its stores before it counts as finished
        assert "kiln_parallel_for(" in text and text.count("kiln_sfence();") == 2
    x = random_inputs(graph, seed=1)
    ref = run_reference(graph, x)[0]
    np.testing.assert_allclose(model.run(x)[0], ref, rtol=1e-4, atol=1e-4)  # aligned: streamed
    misaligned = np.empty(ref.size + 1, np.float32)[1:].reshape(ref.shape)  # 4 bytes off: plain stores
    np.testing.assert_allclose(model.run(x, out=[misaligned])[0], ref, rtol=1e-4, atol=1e-4)


def test_default_streams_only_memory_bound_outputs_beyond_the_cache():
    from compiler.fusion import fuse
    from compiler.passes import optimize

    small = Target("cpu", "x86_64", "t", cores=2, vector_bytes=32, features=("avx2", "fma"), l3_bytes=1 << 20)
    big = Target("cpu", "x86_64", "t", cores=2, vector_bytes=32, features=("avx2", "fma"), l3_bytes=1 << 30)
    group = fuse(optimize(_layernorm(512, 512)), None).groups[0]  # 2 MiB in + out
    sketch = get_backend(small).sketch_for(group)
    assert sketch.default(group, small)["store"] == "stream"
    assert sketch.default(group, big)["store"] == "cached"
    b = GraphBuilder("sm")
    softmax = fuse(optimize(b.build([b.softmax(b.input("x", (512, 512)), axis=-1)])), None).groups[0]
    assert sketch.default(softmax, small)["store"] == "cached"  # exp-bound on 8 lanes: streaming loses
    wide = Target("cpu", "x86_64", "t", cores=2, vector_bytes=64, features=("avx512f",), l3_bytes=1 << 20)
    assert sketch.default(softmax, wide)["store"] == "stream"  # 16 lanes: memory-bound, full-line stores


@pytest.mark.parametrize("parallel", ["rows", "none"])
def test_split_caches_the_rows_that_fit_beside_the_inputs_and_streams_the_rest(parallel: str):
    """``store=split``: the first rows' stores are ordinary, the ones from row ``cached_rows`` on stream
    (a last-level cache of 64 KiB holds the 32 KiB input and 32 of the 64 output rows in its 3/4)."""
    from compiler.backends.cpu.sketches.reduction import cached_rows
    from compiler.fusion import fuse
    from compiler.passes import optimize

    graph = _softmax(64, 128)  # 32 KiB in, rows of 512 bytes
    target = replace(Target.host(), l3_bytes=64 << 10)
    model = _compile(graph, target, store="split", parallel=parallel)
    assert cached_rows(fuse(optimize(graph), None).groups[0], target) == 32
    text = kernel_text(model.source, model.kernels[0].name)
    if target.vector_lanes_f32 > 1:
        assert "kiln_stream_if_f32x" in text and f">= {32 * 128})" in text
    assert text.rstrip().endswith("kiln_sfence();\n}")
    x = random_inputs(graph, seed=3)
    ref = run_reference(graph, x)[0]
    np.testing.assert_allclose(model.run(x)[0], ref, rtol=1e-4, atol=1e-4)
    misaligned = np.empty(ref.size + 1, np.float32)[1:].reshape(ref.shape)
    np.testing.assert_allclose(model.run(x, out=[misaligned])[0], ref, rtol=1e-4, atol=1e-4)


def test_cached_rows_is_what_fits_in_three_quarters_of_the_cache():
    from compiler.backends.cpu.sketches.reduction import cached_rows
    from compiler.fusion import fuse
    from compiler.passes import optimize

    group = fuse(optimize(_softmax(512, 512)), None).groups[0]  # 1 MiB in, 1 MiB out, rows of 2 KiB
    at = lambda l3: cached_rows(group, replace(Target.host(), l3_bytes=l3))  # noqa: E731
    assert at(1 << 20) == 0  # the inputs alone overflow 3/4 of it: every row streams
    assert at(2 << 20) == (3 * (2 << 20) // 4 - (1 << 20)) // 2048 == 256
    assert at(1 << 30) == 512  # all rows through the cache


def _add(rows: int, cols: int, op: str = "add"):
    b = GraphBuilder("pw")
    x, y = b.input("x", (rows, cols)), b.input("y", (rows, cols))
    out = b.add(x, y) if op == "add" else b.gelu(b.add(x, y))
    return b.build([out])


@pytest.mark.parametrize("parallel", ["outer", "none"])
def test_pointwise_streams_its_output_aligned_or_not(parallel: str):
    """The pointwise sketch's ``store`` knob: streamed vector stores, each thread fenced, right results on an
    aligned output (streamed) and on a misaligned one (ordinary stores)."""
    graph = _add(64, 256)
    model = _compile(graph, store="stream", parallel=parallel)
    assert model.kernels[0].sketch == "pointwise" and model.kernels[0].config["store"] == "stream"
    text = kernel_text(model.source, model.kernels[0].name)
    if Target.host().vector_lanes_f32 > 1:
        assert "kiln_stream_f32x" in text
    assert text.rstrip().endswith("kiln_sfence();\n}")
    if parallel == "outer":
        assert "kiln_parallel_for(" in text and text.count("kiln_sfence();") == 2
    x = random_inputs(graph, seed=2)
    ref = run_reference(graph, x)[0]
    np.testing.assert_allclose(model.run(x)[0], ref, rtol=1e-6)
    misaligned = np.empty(ref.size + 1, np.float32)[1:].reshape(ref.shape)
    np.testing.assert_allclose(model.run(x, out=[misaligned])[0], ref, rtol=1e-6)
    cached = _compile(graph, store="cached")
    assert "kiln_stream" not in kernel_text(cached.source, cached.kernels[0].name)


def test_pointwise_default_streams_only_cheap_outputs_beyond_the_cache():
    from compiler.fusion import fuse
    from compiler.passes import optimize

    small = Target("cpu", "x86_64", "t", cores=2, vector_bytes=32, features=("avx2", "fma"), l3_bytes=1 << 20)
    big = Target("cpu", "x86_64", "t", cores=2, vector_bytes=32, features=("avx2", "fma"), l3_bytes=1 << 30)
    add = fuse(optimize(_add(512, 512)), None).groups[0]  # 3 MiB in + out
    sketch = get_backend(small).sketch_for(add)
    assert sketch.name == "pointwise"
    assert sketch.default(add, small)["store"] == "stream"
    assert sketch.default(add, big)["store"] == "cached"
    gelu = fuse(optimize(_add(512, 512, "gelu")), None).groups[0]
    assert sketch.default(gelu, small)["store"] == "cached"  # erf-bound: streaming gains nothing
    wide = Target("cpu", "x86_64", "t", cores=2, vector_bytes=64, features=("avx512f",), l3_bytes=1 << 20)
    assert sketch.default(gelu, wide)["store"] == "cached"
