"""64-bit index arithmetic on the C target: kernels whose indices can pass 2^31 - 1 declare their loop
variables ``int64_t`` (decided once per kernel, ``compiler.loopir.index_width``); kernels whose indices
fit keep ``int32_t``. Huge tensors are only generated and compiled, never allocated; a kernel whose index
overflows only in an intermediate product is run."""

from __future__ import annotations

import re

import numpy as np
import pytest

from compiler.backends import sketch_for
from compiler.backends.cpu import gcc as cbuild
from compiler.backends.cpu.codegen import generate_c, prepare
from compiler.build import plan_model
from compiler.builder import GraphBuilder
from compiler.frontend.models import MODELS
from compiler.fusion import fuse
from compiler.loopir import lower_func
from compiler.loopir.expr import Load, Var, cast, const
from compiler.loopir.index_width import index_dtype, index_overflow
from compiler.loopir.stmt import Buffer, BufferStore, For, PrimFunc, seq
from compiler.passes import optimize
from compiler.target import Target
from tests.compiler.backends.cpu.util import kernel_text, run

HOST = Target.host()
BIG = (3, 1 << 30)  # 3 * 2^30 elements: flat offsets up to 3.2e9


def cpu_func(graph) -> PrimFunc:
    group = next(g for g in fuse(optimize(graph)).groups if not g.is_view)
    sketch = sketch_for(group, HOST)
    return lower_func(sketch.build(group, sketch.default(group, HOST), HOST).func)


def loop_types(text: str) -> set[str]:
    return set(re.findall(r"for \((\w+) \w+ = \w+;", text))


def test_relu_over_more_than_2_31_elements_uses_int64_loops_and_compiles():
    b = GraphBuilder("big_relu")
    func = cpu_func(b.build([b.relu(b.input("x", BIG))]))
    assert index_dtype(func) == "int64"
    assert "in0" in index_overflow(func) and "3221225472 elements" in index_overflow(func)
    src = generate_c([func], HOST)
    text = kernel_text(src, func.name)
    assert loop_types(text) == {"int64_t"}, text
    assert "int32_t" not in text
    cbuild.build(src)  # gcc accepts it (not run: 12 GiB per buffer)


def test_broadcast_add_over_more_than_2_31_elements_uses_int64_loops():
    b = GraphBuilder("big_add")
    func = cpu_func(b.build([b.add(b.input("x", BIG), b.input("y", (1 << 30,)))]))
    text = kernel_text(generate_c([func], HOST), func.name)
    assert loop_types(text) == {"int64_t"}, text
    assert "1073741824 * " in text  # the row offset, computed in 64 bits from an int64_t loop variable


def test_gather_from_a_table_of_more_than_2_31_elements_scales_ids_in_64_bits():
    b = GraphBuilder("big_gather")
    func = cpu_func(b.build([b.gather(b.input("table", (1 << 22, 1024)), b.input("ids", (8, 16), "int64"))]))
    src = generate_c([func], HOST)
    text = kernel_text(src, func.name)
    assert loop_types(text) == {"int64_t"}, text
    assert "(int64_t)in1[" in text and "int32_t" not in text  # id * 1024 must not wrap at 2^31
    cbuild.build(src)


def test_small_kernel_stays_32_bit():
    b = GraphBuilder("small_relu")
    func = cpu_func(b.build([b.relu(b.add(b.input("x", (64, 1000)), b.input("y", (1000,))))]))
    assert index_overflow(func) is None and index_dtype(func) == "int32"
    assert "index_dtype" not in prepare(func, HOST).attrs
    text = kernel_text(generate_c([func], HOST), func.name)
    assert loop_types(text) == {"int32_t"}, text
    assert "int64_t" not in text


def _intermediate_kernel(vectorized: bool) -> PrimFunc:
    """out[i] = x[(i * 3000000) // 3000001] (+ the index itself as a float): the offset stays below 1024,
    the product reaches 3.07e9, past int32."""
    x = Buffer("x", (1024,), "float32")
    out = Buffer("out", (1024,), "float32")
    i, j = Var("i"), Var("j")
    flat = i * 16 + j
    idx = (flat * 3000000) // 3000001
    body = BufferStore(out, (flat,), Load(x, (idx,)) + cast(idx, "float32"))
    inner = For(j, 16, body, kind="vectorized" if vectorized else "serial")
    return PrimFunc("mid_overflow" + ("_vec" if vectorized else ""), [x, out], For(i, 64, inner), 1)


def _expected(xv: np.ndarray) -> np.ndarray:
    idx = (np.arange(1024, dtype=np.int64) * 3000000) // 3000001
    return xv[idx] + idx.astype(np.float32)


def test_intermediate_product_overflow_runs_in_64_bits():
    xv = np.random.default_rng(0).standard_normal(1024).astype(np.float32)
    for vectorized in (False, True):
        func = _intermediate_kernel(vectorized)
        reason = index_overflow(func)
        assert reason is not None and "3069000000" in reason, reason
        text = kernel_text(generate_c([func], HOST), func.name)
        assert loop_types(text) == {"int64_t"}, text
        assert "kiln_iota" not in text  # int32 index vectors are not used in a 64-bit kernel
        (got,) = run(func, xv)
        np.testing.assert_array_equal(got, _expected(xv))


def test_same_kernel_without_the_overflow_stays_32_bit():
    x = Buffer("x", (1024,), "float32")
    out = Buffer("out", (1024,), "float32")
    i = Var("i")
    body = BufferStore(out, (i,), Load(x, ((i * 3) // 4,)))
    func = PrimFunc("no_overflow", [x, out], For(i, 1024, body), 1)
    assert index_overflow(func) is None
    (got,) = run(func, np.arange(1024, dtype=np.float32))
    np.testing.assert_array_equal(got, ((np.arange(1024) * 3) // 4).astype(np.float32))


def test_reasons_name_the_kernel_and_what_is_too_large():
    x = Buffer("x", (4,), "float32")
    i = Var("i")
    one = BufferStore(x, (const(0),), const(1.0, "float32"))
    long_loop = PrimFunc("k_loop", [x], For(i, 1 << 31, one), 0)
    assert index_overflow(long_loop) == "kernel 'k_loop': loop 'i' has 2147483648 iterations (over 2^31 - 1)"
    big = Buffer("huge", (1 << 31,), "float32")
    fill = PrimFunc("k_buf", [big], For(i, 4, BufferStore(big, (i,), const(1.0, "float32"))), 0)
    assert index_overflow(fill) == "kernel 'k_buf': buffer 'huge' has 2147483648 elements (over 2^31 - 1)"


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_no_zoo_kernel_needs_64_bit_indices(target):
    """The built-in models' default kernels stay 32-bit on both targets (their generated text is unchanged
    by the index-width decision)."""
    for model in MODELS:
        for k in plan_model(model, target).kernels:
            assert index_overflow(k.func) is None, f"{model}: {index_overflow(k.func)}"
            if target == "cpu":
                assert "index_dtype" not in prepare(k.func, HOST).attrs


def test_vector_code_is_checked_through_its_scalar_parts():
    """A prepared kernel holding int32 vectors (a float->int32 cast, a ramp cast to float) is analysed
    without error and stays 32-bit."""
    x = Buffer("x", (1024,), "float32")
    out, pos = Buffer("out", (1024,), "int32"), Buffer("pos", (1024,), "float32")
    i, j = Var("i"), Var("j")
    f = i * 16 + j
    body = seq(
        BufferStore(out, (f,), cast(Load(x, (f,)), "int32")), BufferStore(pos, (f,), cast(f, "float32"))
    )
    func = PrimFunc("iota", [x, out, pos], For(i, 64, For(j, 16, body, kind="vectorized")), 1)
    prepared = prepare(func, HOST)
    assert "kiln_iota" in kernel_text(generate_c([func], HOST), "iota")
    assert index_overflow(prepared) is None and "index_dtype" not in prepared.attrs
    xv = np.arange(1024, dtype=np.float32) * 0.5
    got, got_pos = run(func, xv)
    np.testing.assert_array_equal(got, xv.astype(np.int32))
    np.testing.assert_array_equal(got_pos, np.arange(1024, dtype=np.float32))
