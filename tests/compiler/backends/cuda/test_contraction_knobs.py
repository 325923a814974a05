"""The CUDA contraction sketch's occupancy, padding, swizzle, warp-tile and block-order knobs: what they
print, that every combination computes the reference in the SIMT interpreter (hypothesis), the
bank-conflict count behind ``smem_pad`` / ``swizzle``, the small-grid default, and nvcc (sm_80, sm_90)
with -Xptxas -v."""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler.backends import sketch_for
from compiler.backends.cuda.codegen import generate_cuda
from compiler.backends.cuda.nvrtc import nvcc_check
from compiler.backends.cuda.sketches.contraction import transposed_store_conflicts
from compiler.builder import GraphBuilder
from compiler.errors import ScheduleError
from compiler.fusion import fuse
from compiler.loopir.stmt import Allocate, walk_stmts
from compiler.passes import optimize
from tests.compiler.backends.cuda.util import CUDA, PLAIN, check_group, lowered, need_nvcc

SMALL = {"bm": 32, "bn": 32, "bk": 8, "tm": 4, "tn": 4, "vector": 4, "double_buffer": 0}
BIG = {"bm": 128, "bn": 128, "bk": 16, "tm": 8, "tn": 8, "vector": 4, "double_buffer": 1}


def mm_group(m: int, n: int, k: int, bias: bool = True, batch: tuple[int, ...] = ()):
    import numpy as np

    b = GraphBuilder("mm")
    y = b.matmul(b.input("a", (*batch, m, k)), b.input("w", (k, n)))
    if bias:
        y = b.add(y, b.param("bias", np.linspace(-1, 1, n, dtype=np.float32)))
    groups = [g for g in fuse(optimize(b.build([y]))).groups if not g.is_view]
    return groups[0]


def shared_shapes(func) -> list[tuple[int, ...]]:
    return [
        s.buffer.shape
        for s in walk_stmts(func.body)
        if isinstance(s, Allocate) and s.buffer.scope == "shared"
    ]


@settings(max_examples=8, deadline=None, derandomize=True)
@given(
    rows=st.sampled_from([1, 2, 3, 8]),
    group_m=st.sampled_from([1, 4, 8]),
    pad=st.sampled_from([0, 1, 2, 4]),
    double_buffer=st.sampled_from([0, 1]),
    min_blocks=st.sampled_from([1, 2, 4]),
)
def test_every_knob_combination_computes_the_reference(rows, group_m, pad, double_buffer, min_blocks):
    group = mm_group(32 * rows - 3, 40, 12)
    config = {**SMALL, **PLAIN, "double_buffer": double_buffer, "group_m": group_m, "smem_pad": pad}
    config["min_blocks"] = min_blocks
    sketch = sketch_for(group, CUDA)
    try:
        sketch.check(group, config, CUDA)
    except ScheduleError as e:
        assert "group_m" in str(e) and rows % group_m
        return
    check_group(group, config)


def test_grouped_order_is_one_grid_axis():
    func = lowered(mm_group(256, 64, 8), {**SMALL, **PLAIN, "group_m": 4})
    launch = func.attrs["launch"]
    assert launch["grid"] == [8 * 2, 1, 1], launch  # 8 block rows x 2 block columns on blockIdx.x
    check_group(mm_group(256, 64, 8), {**SMALL, **PLAIN, "group_m": 4})


def test_group_m_must_divide_the_block_rows():
    group = mm_group(96, 64, 8)  # 3 block rows of 32
    with pytest.raises(ScheduleError, match="group_m 4 does not divide the 3 block rows"):
        sketch_for(group, CUDA).check(group, {**SMALL, **PLAIN, "group_m": 4}, CUDA)


def test_padding_widens_only_the_transposed_tile():
    func = lowered(mm_group(64, 64, 32), {**SMALL, **PLAIN, "smem_pad": 2})
    assert sorted(shared_shapes(func)) == [(8, 32), (8, 34)]  # B [k][n] as is, A stored [k][m + 2]


def test_min_blocks_prints_the_second_launch_bound():
    func = lowered(mm_group(64, 64, 32), {**SMALL, **PLAIN, "min_blocks": 3})
    func.name = "mm_occ"
    assert "__launch_bounds__(64, 3) mm_occ(" in generate_cuda([func], CUDA)
    plain = lowered(mm_group(64, 64, 32), {**SMALL, **PLAIN})
    plain.name = "mm_plain"
    assert "__launch_bounds__(64) mm_plain(" in generate_cuda([plain], CUDA)


def test_min_blocks_is_bounded_by_the_threads_of_an_sm():
    group = mm_group(512, 512, 64)
    with pytest.raises(ScheduleError, match="min_blocks 4 x 1024 threads exceed the 2048 threads"):
        cfg = {**BIG, **PLAIN, "tm": 4, "tn": 4, "min_blocks": 4}
        sketch_for(group, CUDA).check(group, cfg, CUDA)


def test_tiles_larger_than_the_extent_are_refused():
    """A 128-row tile over 16 rows only adds idle threads (such unrolled conv kernels took cicc minutes)."""
    group = mm_group(16, 256, 8)
    with pytest.raises(ScheduleError, match="bm 128 exceeds the M extent 16 \\(tiles up to 32"):
        sketch_for(group, CUDA).check(group, {**BIG, **PLAIN}, CUDA)
    default = sketch_for(group, CUDA).default(group, CUDA)
    assert default["bm"] == 32


def test_transposed_store_conflicts():
    """The issue's reading of the 128x128x16 kernel: 4-way conflicts on the transposed A stores."""
    assert transposed_store_conflicts(128, 16, 4, 0, 256) == 4
    assert transposed_store_conflicts(128, 16, 4, 4, 256) == 2
    assert transposed_store_conflicts(128, 16, 4, 2, 256) == 1
    assert transposed_store_conflicts(128, 32, 4, 1, 256) == 1


def test_small_m_default_fills_the_sms():
    """BERT's 128 x 768 projection: 32 x 32 tiles (96 blocks) rather than 64 x 64 (24 blocks)."""
    group = mm_group(128, 768, 768, batch=(1,))
    cfg = sketch_for(group, CUDA).default(group, CUDA)
    assert (cfg["bm"], cfg["bn"]) == (32, 32)
    big = sketch_for(mm_group(1024, 1024, 64), CUDA).default(mm_group(1024, 1024, 64), CUDA)
    assert (big["bm"], big["bn"], big["smem_pad"]) == (128, 128, 4)


@settings(max_examples=10, deadline=None, derandomize=True)
@given(
    tile=st.sampled_from([(32, 32, 2, 2), (32, 64, 2, 4), (64, 32, 4, 2), (64, 64, 4, 4), (32, 32, 4, 4)]),
    bk=st.sampled_from([8, 16]),
    warp_rows=st.sampled_from([0, 2, 4, 8]),
    swizzle=st.sampled_from([0, 1, 2, 4]),
    pad=st.sampled_from([0, 2]),
    double_buffer=st.sampled_from([0, 1]),
    vector=st.sampled_from([1, 4]),
)
def test_every_warp_tile_and_swizzle_computes_the_reference(
    tile, bk, warp_rows, swizzle, pad, double_buffer, vector
):
    bm, bn, tm, tn = tile
    group = mm_group(bm + 5, bn - 3, 2 * bk + 4)
    config = {**PLAIN, "bm": bm, "bn": bn, "bk": bk, "tm": tm, "tn": tn, "vector": vector}
    config.update(double_buffer=double_buffer, warp_rows=warp_rows, swizzle=swizzle, smem_pad=pad)
    try:
        sketch_for(group, CUDA).check(group, config, CUDA)
    except ScheduleError as e:
        assert "warp_rows" in str(e) or "swizzle and smem_pad" in str(e), e
        return
    check_group(group, config)


def test_warp_tiling_makes_each_warp_a_2d_block_of_threads():
    group = mm_group(64, 64, 16)
    config = {**SMALL, **PLAIN, "bm": 64, "bn": 64, "warp_rows": 4}  # 16 x 16 threads
    func = check_group(group, config)
    # threadIdx.y = warp row (16 / 4), threadIdx.x = (warp column, lane row, lane column) = 2 x 4 x 8
    assert func.attrs["launch"]["block"] == [64, 4, 1]
    with pytest.raises(
        ScheduleError, match="warp_rows 2 needs the 8 x 8 threads to split into warps of 2 x 16"
    ):
        sketch_for(group, CUDA).check(group, {**SMALL, **PLAIN, "warp_rows": 2}, CUDA)


def test_swizzle_removes_the_transposed_store_conflicts_and_keeps_float4_reads():
    assert transposed_store_conflicts(128, 16, 4, 0, 256, swizzle=2) == 1  # pad 4 leaves 2-way
    assert transposed_store_conflicts(64, 32, 4, 0, 256, swizzle=1) == 1  # unpadded: 8-way
    assert transposed_store_conflicts(32, 16, 4, 0, 64, swizzle=2) == 1
    group = mm_group(128, 128, 32)
    config = {**BIG, **PLAIN, "swizzle": 2}
    func = lowered(group, config)
    func.name = "mm_swz"
    text = generate_cuda([func], CUDA)
    assert "reinterpret_cast<const float4*>(&in0_shared_db[" in text  # the A tile's register reads
    assert sorted(shared_shapes(func)) == [(2, 16, 128), (2, 16, 128)]  # no padding
    with pytest.raises(ScheduleError, match="swizzle and smem_pad are alternatives"):
        sketch_for(group, CUDA).check(group, {**config, "smem_pad": 4}, CUDA)


@cache
def nvcc_resources(arch: str) -> dict:
    group = mm_group(1024, 1024, 256)
    funcs = []
    for name, cfg in (
        ("gemm_plain", {**BIG, **PLAIN}),
        ("gemm_pad4_occ2", {**BIG, **PLAIN, "smem_pad": 4, "min_blocks": 2}),
        ("gemm_pad2_grouped", {**BIG, **PLAIN, "smem_pad": 2, "group_m": 8}),
        ("gemm_small_occ4", {**SMALL, **PLAIN, "smem_pad": 1, "min_blocks": 4}),
        ("gemm_warp4_swz2", {**BIG, **PLAIN, "warp_rows": 4, "swizzle": 2}),
        ("gemm_warp8_swz2_occ2", {**BIG, **PLAIN, "warp_rows": 8, "swizzle": 2, "min_blocks": 2}),
        ("gemm_small_warp4_swz1", {**SMALL, **PLAIN, "bm": 64, "bn": 64, "warp_rows": 4, "swizzle": 1}),
    ):
        func = lowered(group, cfg)
        func.name = name
        funcs.append(func)
    return nvcc_check(generate_cuda(funcs, CUDA), arch)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_contraction_kernels_compile_with_nvcc(arch):
    need_nvcc()
    res = nvcc_resources(arch)
    assert set(res) == {
        "gemm_plain",
        "gemm_pad4_occ2",
        "gemm_pad2_grouped",
        "gemm_small_occ4",
        "gemm_warp4_swz2",
        "gemm_warp8_swz2_occ2",
        "gemm_small_warp4_swz1",
    }
    # __launch_bounds__(256, 2): ptxas keeps 2 x 256 threads within the 65536 registers of an SM
    assert res["gemm_pad4_occ2"].registers <= 128
    for name, r in res.items():
        print(
            f"{arch} {name}: {r.registers} registers, {r.shared_bytes} B shared, {r.spill_stores} B spilled"
        )


def test_default_prefers_tiles_that_divide_the_output():
    """On the H200 a partial tile at the edge made the whole kernel 3-10x slower (docs/cuda.md): the default
    takes the largest whole tile. 1472 x 1344 (random_workload 8000): 64 x 64, keeping the large GEMMs'
    3-stage ring (measured 43.8 us against 439.3 us for the old 128 x 128); 1088 x 1152: 64 x 128; a
    small grid (480 x 960) takes the whole 32 x 64 over the partial 64 x 32 that fills the SMs first."""
    sketch = sketch_for(mm_group(1472, 1344, 256), CUDA)
    cfg = sketch.default(mm_group(1472, 1344, 256), CUDA)
    assert (cfg["bm"], cfg["bn"], cfg["tm"], cfg["tn"], cfg["stages"]) == (64, 64, 4, 4, 3)
    cfg = sketch.default(mm_group(1088, 1152, 576), CUDA)
    assert (cfg["bm"], cfg["bn"], cfg["tm"], cfg["tn"]) == (64, 128, 4, 8)
    cfg = sketch.default(mm_group(480, 960, 256, batch=(1,)), CUDA)
    assert (cfg["bm"], cfg["bn"]) == (32, 64)
    cfg = sketch.default(mm_group(4096, 4096, 4096), CUDA)
    assert (cfg["bm"], cfg["bn"], cfg["tm"], cfg["tn"]) == (128, 128, 8, 8)
    cfg = sketch.default(mm_group(1000, 1000, 256), CUDA)  # no whole tile: as before
    assert (cfg["bm"], cfg["bn"]) == (128, 128)


@pytest.mark.parametrize("stages", [1, 3])
def test_partial_tiles_compute_in_registers_without_row_guards(stages):
    """Partial edge tiles (M 45 and N 40 over 32-wide tiles, K 36 over 16) compute the reference, and the
    register tile is computed without the rows' and columns' guards: the FMA loop of every block reads
    each shared operand once per k step (the guards had put a branch and a reload per row into it, 3-10x
    slower on the H200). The K tail's guard stays in the loop, the stores to global memory stay guarded,
    and a tile wider than its whole extent (N 28 under a 32-wide tile: the shared tile is compacted to 28
    columns) keeps its guards (the lowered reads are checked against the compacted tiles; when one could
    leave them the function is lowered with every guard)."""
    config = {**PLAIN, "bm": 32, "bn": 32, "bk": 16, "tm": 4, "tn": 4, "vector": 4, "double_buffer": 0}
    config["stages"] = stages
    for n, dropped in ((40, True), (28, False)):
        func = check_group(mm_group(45, n, 36), config)
        func.name = f"mm_edge{stages}_{n}"
        text = generate_cuda([func], CUDA)
        loop = text.split("for (int32_t k0_1 = 0;")[1].split("\n    }\n")[0]
        assert "< 36)" in loop  # the K tail
        assert ("< 45)" not in loop) == dropped
        assert (f"< {n})" not in loop) == dropped
        assert "< 45)" in text.split("for (int32_t k0_0")[-1]  # the output rows' stores
