"""Property tests: for every sketch, a config drawn at random from its space on a random small shape, for a
target drawn among the host and every x86 ISA level (AVX-512, AVX2, SSE: the spaces depend on the vector
width and register count), is either rejected up front by ``check`` or, once built, lowered and interpreted,
computes the reference."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler.backends import get_backend, sketch_for
from compiler.backends.cpu import gcc as cbuild
from compiler.backends.cpu.codegen import generate_c
from compiler.builder import GraphBuilder
from compiler.frontend.models import MODELS
from compiler.fusion import fuse
from compiler.graph import Graph, Value
from compiler.layouts import apply_input_layouts
from compiler.loopir import evaluate
from compiler.passes import optimize
from compiler.reference import run_reference
from compiler.target import Target
from tests.compiler.property_graphs import (
    EPILOGUES,
    REDUCERS,
    UNARY,
    batch_matmul_graph,
    conv_graph,
    inputs_for,
    legal_configs,
    matmul_graph,
    pointwise_graph,
    pooling_graph,
    reduction_graph,
)
from tests.targets import X86_TARGETS

CPU = Target.host()
TARGETS = (CPU, *X86_TARGETS.values())
SETTINGS = settings(
    max_examples=int(os.environ.get("KILN_PROPERTY_EXAMPLES", "30")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def check_all_groups(graph: Graph, data: st.DataObject, kind: str) -> None:
    target = data.draw(st.sampled_from(TARGETS), label="target")
    for group, sketch, config in legal_configs(graph, data, kind, target):
        sch = sketch.build(group, config, target)  # must not fail for a config that passed check
        func = get_backend(target).lower(sch.func)  # lower_func and the CPU backend's loop passes
        ins = inputs_for(group)
        outs = evaluate(func, apply_input_layouts(func.attrs, ins))
        refs = run_reference(group.subgraph, ins)
        for o, r in zip(outs, refs):
            o64, r64 = o.astype(np.float64), r.astype(np.float64)
            finite = np.isfinite(r64)
            same_special = (o64[~finite] == r64[~finite]) | (np.isnan(o64[~finite]) & np.isnan(r64[~finite]))
            assert same_special.all(), f"{sketch.name} {config}: inf/nan positions differ\n{sch.show_trace()}"
            scale = max(1.0, float(np.abs(r64[finite]).max(initial=0.0)))
            err = float(np.abs(o64[finite] - r64[finite]).max(initial=0.0))
            assert err <= 2e-5 * scale, f"{sketch.name} {config}: max err {err}\n{sch.show_trace()}"


@SETTINGS
@given(
    rows=st.integers(1, 5),
    cols=st.sampled_from([1, 3, 4, 8, 12, 16, 32]),
    ops=st.lists(st.sampled_from(UNARY), min_size=1, max_size=3),
    bias=st.booleans(),
    three_d=st.booleans(),
    data=st.data(),
)
def test_pointwise(rows, cols, ops, bias, three_d, data):
    check_all_groups(pointwise_graph(rows, cols, ops, bias, three_d), data, "pointwise")


@SETTINGS
@given(
    hw=st.integers(3, 7),
    k=st.integers(1, 3),
    s=st.integers(1, 2),
    pad=st.integers(0, 1),
    avg=st.booleans(),
    incl=st.booleans(),
    data=st.data(),
)
def test_pooling(hw, k, s, pad, avg, incl, data):
    check_all_groups(pooling_graph(hw, k, s, pad, avg, incl), data, "pointwise")


@SETTINGS
@given(
    lanes=st.sampled_from([4, 8, 16]),
    k=st.integers(1, 3),
    s=st.integers(1, 2),
    pad=st.integers(0, 1),
    avg=st.booleans(),
    incl=st.booleans(),
    data=st.data(),
)
def test_pooling_vector_rows(lanes, k, s, pad, avg, incl, data):
    """Pooling windows vectorized along the output row: every legal config with vector > 1 (the random
    draws of test_pooling rarely give a row the lanes divide) computes the reference on every target."""
    pad = min(pad, k - 1)
    hw = next(h for h in range(3, 64) if ((h + 1 + 2 * pad - k) // s + 1) % lanes == 0)
    graph = pooling_graph(hw, k, s, pad, avg, incl)
    target = data.draw(st.sampled_from([t for t in TARGETS if t.vector_lanes_f32 >= lanes]), label="target")
    (group,) = [g for g in fuse(optimize(graph)).groups if g.kind == "pointwise" and not g.is_view]
    sketch = sketch_for(group, target)
    config = {
        kn.name: data.draw(st.sampled_from(kn.values), label=kn.name) for kn in sketch.space(group, target)
    }
    config["vector"] = lanes
    sketch.check(group, config, target)
    func = get_backend(target).lower(sketch.build(group, config, target).func)
    ins = inputs_for(group)
    (out,) = evaluate(func, apply_input_layouts(func.attrs, ins))
    np.testing.assert_allclose(out, run_reference(group.subgraph, ins)[0], rtol=1e-5, atol=1e-5)


@SETTINGS
@given(
    lanes=st.sampled_from([4, 8, 16]),
    k=st.integers(2, 3),
    pad=st.integers(0, 1),
    data=st.data(),
)
def test_stride2_pooling_in_c(lanes, k, pad, data):
    """Stride-2 max pools vectorized along the output row, compiled to C for every ISA (input rows of odd
    width): each unpadded window tap is two contiguous vector loads deinterleaved (``__builtin_shuffle``),
    padded ones stay scalar windows, and both compute the reference."""
    hw = next(h for h in range(4, 80, 2) if ((h + 1 + 2 * pad - k) // 2 + 1) % lanes == 0)
    graph = pooling_graph(hw, k, 2, pad, False)
    target = data.draw(st.sampled_from([t for t in TARGETS if t.vector_lanes_f32 >= lanes]), label="target")
    (group,) = [g for g in fuse(optimize(graph)).groups if g.kind == "pointwise" and not g.is_view]
    sketch = sketch_for(group, target)
    config = {**sketch.default(group, target), "vector": lanes}
    config["parallel"] = data.draw(st.sampled_from(["outer", "none"]), label="parallel")
    func = get_backend(target).lower(sketch.build(group, config, target).func)
    src = generate_c([func], target)
    assert ("__builtin_shuffle(kiln_load_f32x" in src) == (pad == 0)
    ins = [np.ascontiguousarray(x) for x in apply_input_layouts(func.attrs, inputs_for(group))]
    (ref,) = run_reference(group.subgraph, inputs_for(group))
    out = np.full(ref.shape, np.nan, np.float32)
    cbuild.build(src).function(func.name, 2)(ins[0].ctypes.data, out.ctypes.data)
    np.testing.assert_array_equal(out, ref)


@SETTINGS
@given(
    op=st.sampled_from(REDUCERS),
    rows=st.integers(1, 4),
    cols=st.sampled_from([4, 8, 12, 16, 32, 48, 64]),
    lead=st.booleans(),
    axis0=st.booleans(),
    data=st.data(),
)
def test_reduction(op, rows, cols, lead, axis0, data):
    check_all_groups(reduction_graph(op, rows, cols, lead, axis0), data, "reduction")


@SETTINGS
@given(
    m=st.integers(1, 12),
    n=st.integers(1, 20),
    k=st.integers(1, 9),
    ta=st.booleans(),
    tb=st.booleans(),
    epilogue=st.sampled_from(EPILOGUES),
    weight=st.booleans(),
    data=st.data(),
)
def test_matmul(m, n, k, ta, tb, epilogue, weight, data):
    # a constant weight can be pre-packed at compile time (pack_b=2), a runtime input cannot
    check_all_groups(matmul_graph(m, n, k, ta, tb, epilogue, weight), data, "contraction")


@SETTINGS
@given(
    batch=st.sampled_from([(1,), (3,), (2, 2)]),
    m=st.integers(1, 8),
    n=st.integers(1, 12),
    k=st.integers(1, 6),
    tb=st.booleans(),
    bcast=st.booleans(),
    data=st.data(),
)
def test_batch_matmul(batch, m, n, k, tb, bcast, data):
    check_all_groups(batch_matmul_graph(batch, m, n, k, tb, bcast), data, "contraction")


@SETTINGS
@given(
    c=st.integers(1, 4),
    o=st.sampled_from([2, 4, 8]),
    hw=st.integers(3, 7),
    k=st.integers(1, 3),
    s=st.integers(1, 2),
    pad=st.integers(0, 1),
    dil=st.integers(1, 2),
    groups=st.sampled_from([1, 2]),
    data=st.data(),
)
def test_conv2d(c, o, hw, k, s, pad, dil, groups, data):
    check_all_groups(conv_graph(c, o, hw, k, s, pad, groups, dil), data, "contraction")


@SETTINGS
@given(m=st.integers(1, 16), k=st.integers(1, 9), data=st.data())
def test_matmul_of_a_tensor_with_its_own_transpose(m, k, data):
    """Both operands are one buffer (x @ x^T): told apart by their side of the product, each packed alone."""
    b = GraphBuilder("gram")
    x = b.input("x", (m, k))
    check_all_groups(b.build([b.matmul(x, x, transpose_b=True)]), data, "contraction")


@pytest.mark.parametrize("target", TARGETS, ids=["host", *X86_TARGETS])
@pytest.mark.parametrize("kind", ["pointwise", "reduction", "contraction"])
def test_defaults_pass_their_own_check(kind, target):
    for spec in MODELS.values():
        for group in fuse(optimize(spec.graph())).groups:
            if group.kind == kind:
                sk = sketch_for(group, target)
                sk.check(group, sk.default(group, target), target)


@pytest.mark.parametrize("isa", list(X86_TARGETS))
def test_default_matmul_tile_fills_the_isas_registers(isa):
    """The default register tile of a large matmul uses most of the target's vector registers as
    accumulators (enough to cover the FMA latency) without spilling: 8x32 on AVX-512, 6x16 on AVX2, 6x8 on
    SSE."""
    from compiler.errors import ScheduleError

    target = X86_TARGETS[isa]
    group = fuse(optimize(matmul_graph(1024, 1024, 1024, False, False, "none")), None).groups[0]
    sketch = sketch_for(group, target)
    cfg = sketch.default(group, target)
    acc = cfg["mr"] * cfg["nr"] // cfg["vector"]
    assert cfg["vector"] == target.vector_lanes_f32
    assert 4 * target.fma_units <= acc <= target.vector_registers - 4, cfg
    with pytest.raises(ScheduleError, match="vector registers"):
        sketch.check(group, {**cfg, "mr": 8, "nr": 4 * cfg["vector"]}, target)


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
def test_default_matrix_vector_tile_hides_the_fma_latency(isa):
    """With one row the tile widens along N until it holds 4 x fma_units independent accumulators."""
    from tests.targets import PINNED_TARGETS

    target = PINNED_TARGETS[isa]
    group = fuse(optimize(matmul_graph(1, 128, 784, False, False, "bias_relu", weight=True)), None).groups[0]
    cfg = sketch_for(group, target).default(group, target)
    assert cfg["mr"] == 1 and cfg["nr"] // cfg["vector"] >= 4 * target.fma_units, cfg


def test_m_blocks_are_dealt_out_evenly():
    """The busiest thread's rows plus BLOCK_ROWS per block: neither 3 blocks of 96 rows for 2 threads
    (192 rows on one) nor 22 blocks of 12 (11 blocks per thread, each streaming the B panel again)."""
    from compiler.backends.cpu.sketches.contraction import _balanced_tiles

    assert _balanced_tiles(16, 256, 6, 1, 2) == 8  # 6 blocks of 48 rows: 144 rows and 3 blocks each
    assert _balanced_tiles(16, 1024, 8, 1, 2) == 16  # 8 blocks of 128: already even
    assert _balanced_tiles(4, 64, 8, 1, 2) == 4
    assert _balanced_tiles(32, 1026, 8, 1, 2) == 16  # not 129 blocks of 8 rows (2.3x slower, 2 threads)


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
def test_m_blocks_on_two_threads_are_not_capped_to_blocks_dividing_m(isa):
    """[3000, 512] x [512, 64] on 2 threads: only 8-row blocks divide M on AVX-512, and 375 of them took 2.3x
    the time of 256-row blocks (scripts/bench_m_blocks.py, benchmarks/m_blocks.md); one thread keeps the
    dividing block."""
    import dataclasses

    from tests.targets import PINNED_TARGETS

    group = fuse(optimize(matmul_graph(3000, 64, 512, False, False, "none")), None).groups[0]
    two = dataclasses.replace(PINNED_TARGETS[isa], cores=2)
    cfg = sketch_for(group, two).default(group, two)
    assert cfg["parallel"] == "batch_m" and cfg["mr"] * cfg["mc_tiles"] >= 128, cfg
    one = dataclasses.replace(PINNED_TARGETS[isa], cores=1)
    cfg1 = sketch_for(group, one).default(group, one)
    assert 3000 % (cfg1["mr"] * cfg1["mc_tiles"]) == 0, cfg1


def sliced_qk_graph(s: int, heads: int, d: int, tb: bool) -> Graph:
    """Attention scores with Q and K sliced from one [s, 2 * heads * d] input (what the horizontal Q/K/V
    rewrite leaves): the contraction's A and B are two views of one buffer."""
    b = GraphBuilder("sliced_qk")
    qk = b.input("qk", (s, 2 * heads * d))

    def head_view(start: int) -> Value:
        part = b.slice(qk, [start], [start + heads * d], axes=[1])
        return b.transpose(b.reshape(part, (s, heads, d)), (1, 0, 2))

    q, k = head_view(0), head_view(heads * d)
    if not tb:
        k = b.transpose(k, (0, 2, 1))
    return b.build([b.multiply(b.batch_matmul(q, k, transpose_b=tb), 0.5)])


@SETTINGS
@given(
    s=st.integers(1, 12),
    heads=st.integers(1, 3),
    d=st.sampled_from([1, 3, 4, 8]),
    tb=st.booleans(),
    data=st.data(),
)
def test_contraction_of_two_views_of_one_buffer(s, heads, d, tb, data):
    """A and B are slices of one buffer: every legal config, packed B / packed A included (each pack
    redirects only its own side's loads), computes the reference."""
    check_all_groups(sliced_qk_graph(s, heads, d, tb), data, "contraction")


@pytest.mark.parametrize("pack_a", [0, 1])
def test_views_of_one_buffer_pack_each_side_separately(pack_a):
    """With pack_b (and pack_a) on, each operand view of the one buffer is copied into its own panel: the
    product reads the packed panels, the copies read the buffer, and the result is the reference."""
    graph = sliced_qk_graph(12, 2, 8, True)
    group = next(g for g in fuse(optimize(graph)).groups if g.kind == "contraction")
    sketch = sketch_for(group, CPU)
    config = {**sketch.default(group, CPU), "pack_b": 1, "pack_a": pack_a}
    sch = sketch.build(group, config, CPU)
    trace = sch.show_trace()
    assert trace.count("only=<selected loads>") == 1 + pack_a, trace
    func = get_backend(CPU).lower(sch.func)
    ins = inputs_for(group)
    (out,) = evaluate(func, apply_input_layouts(func.attrs, ins))
    (ref,) = run_reference(group.subgraph, ins)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
