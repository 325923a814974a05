"""The SIMT contraction sketch's ``stages`` knob: a cp.async ring of shared tiles on sm_80+
(``compiler.backends.cuda.pipeline.cp_async_pipeline``). Every legal config (hypothesis, M/N/K tails,
transposed operands) computes the reference in the SIMT interpreter, which executes the cp.async groups;
``check`` names the knob of an illegal combination; the copies' sizes, the one wait + barrier per K step,
a wait that lets too many groups fly is caught; the default rule; nvcc (sm_80, sm_90) of a 4096^3 GEMM."""

from __future__ import annotations

from collections import Counter
from functools import cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler.backends import sketch_for
from compiler.backends.cuda.codegen import generate_cuda
from compiler.backends.cuda.nvrtc import nvcc_check
from compiler.backends.cuda.sketches.contraction import CudaContractionSketch
from compiler.builder import GraphBuilder
from compiler.errors import ScheduleError
from compiler.loopir import evaluate
from compiler.loopir.expr import const
from compiler.loopir.interp import InterpError
from compiler.loopir.stmt import Allocate, Barrier, For, Intrinsic, seq, walk_stmts
from compiler.loopir.visitor import post_order
from compiler.reference import run_reference
from compiler.target import Target
from tests.compiler.backends.cuda.util import CUDA, PLAIN, check_group, groups_of, lowered, need_nvcc
from tests.compiler.property_graphs import inputs_for

SMALL = {**PLAIN, "bm": 32, "bn": 32, "bk": 8, "tm": 4, "tn": 4, "vector": 4, "double_buffer": 0}


def gemm(m: int, n: int, k: int, transpose_a: bool = False, transpose_b: bool = False, dtype="float32"):
    b = GraphBuilder("mm")
    a = b.input("a", (k, m) if transpose_a else (m, k), dtype)
    w = b.input("w", (n, k) if transpose_b else (k, n), dtype)
    y = b.matmul(a, w, transpose_a=transpose_a, transpose_b=transpose_b)
    bias = b.param("bias", np.linspace(-1, 1, n, dtype=np.float32).astype(dtype))
    return groups_of(b.build([b.relu(b.add(y, bias))]))[0]


def copies(func) -> Counter:
    """(intrinsic, bytes) -> count in the lowered function."""
    return Counter(
        (s.name, int(s.args[1].value) if len(s.args) > 1 else None)
        for s in walk_stmts(func.body)
        if isinstance(s, Intrinsic)
    )


@settings(max_examples=20, deadline=None, derandomize=True)
@given(
    tile=st.sampled_from([(32, 32, 4, 4), (64, 32, 4, 2), (32, 64, 2, 4)]),
    bk=st.sampled_from([8, 16]),
    stages=st.sampled_from([1, 2, 3, 4, 3]),  # mostly staged
    double_buffer=st.sampled_from([0, 0, 1]),
    vector=st.sampled_from([1, 2, 4]),
    layout=st.sampled_from(["nn", "tn", "nt"]),
    tails=st.sampled_from([(4, 4), (5, 4), (4, 8), (1, 3)]),  # (M, N) past the tiles; N+3: misaligned
    pad_swizzle=st.sampled_from([(0, 0), (2, 0), (0, 1)]),
)
def test_every_legal_staged_config_computes_the_reference(
    tile, bk, stages, double_buffer, vector, layout, tails, pad_swizzle
):
    """M, N and K are not multiples of the tiles; rows not a multiple of the vector are misaligned."""
    bm, bn, tm, tn = tile
    m, n = bm + tails[0], bn + tails[1]
    group = gemm(m, n, 2 * bk + 4, transpose_a=layout == "tn", transpose_b=layout == "nt")
    config = {**SMALL, "bm": bm, "bn": bn, "bk": bk, "tm": tm, "tn": tn, "vector": vector}
    config.update(stages=stages, double_buffer=double_buffer)
    config.update(smem_pad=pad_swizzle[0], swizzle=pad_swizzle[1])
    # the operands whose tiles keep their layout (vector copies): B unless transposed, A when transposed
    rows = ([n] if layout != "nt" else []) + ([m] if layout == "tn" else [])
    misaligned = any(r % vector for r in rows)
    try:
        sketch_for(group, CUDA).check(group, config, CUDA)
    except ScheduleError as e:
        assert "stages" in str(e) and stages > 1 and (double_buffer or misaligned), e
        return
    assert not (stages > 1 and (double_buffer or misaligned))
    func = check_group(group, config)
    found = copies(func)
    if stages > 1:
        assert found[("cp_async_wait", None)] == 1 and found[("cp_async_commit", None)] == stages
        assert found[("cp_async", 4 * vector)] or vector == 1 or not rows
    else:
        assert not found


def test_copy_sizes_and_one_wait_and_barrier_per_k_step():
    """A plain GEMM: B [k][n] in 16-byte (vector 4) or 8-byte (vector 2) copies, the transposed A tile in
    4-byte ones; the K loop waits once (wait_group S-2) and synchronises once; S shared stages."""
    group = gemm(64, 64, 64)
    for vector, size in ((4, 16), (2, 8)):
        func = lowered(group, {**SMALL, "stages": 3, "vector": vector})
        found = copies(func)
        # per tile (3 copies of the code: 2 in the prologue, 1 in the loop): A 32x8 floats / 64 threads =
        # 4 one-float copies; B 8x32 / 64 threads = 4 floats, 4/vector copies
        assert found[("cp_async", 4)] == 3 * 4 and found[("cp_async", size)] == 3 * 4 // vector, found
        (loop,) = [
            s for s in walk_stmts(func.body) if isinstance(s, For) and s.annotations.get("kiln_synced")
        ]
        waits = [s for s in walk_stmts(loop.body) if isinstance(s, Intrinsic) and s.name == "cp_async_wait"]
        assert [int(w.args[0].value) for w in waits] == [1]
        assert sum(isinstance(s, Barrier) for s in walk_stmts(loop.body)) == 1
        assert func.attrs["launch"]["shared_bytes"] == 3 * (32 * 8 + 8 * 32) * 4
    text = generate_cuda([lowered(group, {**SMALL, "stages": 2})], CUDA)
    assert "cp.async.cg.shared.global [%0], [%1], 16, %2;" in text
    assert "cp.async.ca.shared.global [%0], [%1], 4, %2;" in text
    assert "cp.async.wait_group 0;" in text


def test_a_wait_that_leaves_the_current_tile_in_flight_is_caught():
    """wait_group(S-1) instead of S-2: the interpreter lands the tile too late, and the result is wrong."""
    group = gemm(64, 64, 40)
    config = {**SMALL, "stages": 3}
    check_group(group, config)
    func = lowered(group, config)

    def late(s):
        if isinstance(s, Intrinsic) and s.name == "cp_async_wait":
            return Intrinsic(s.name, (), (), (const(2),))
        return None

    func.body = post_order(func.body, late)
    ins = inputs_for(group)
    out = evaluate(func, ins)[0]
    assert not np.allclose(out, run_reference(group.subgraph, ins)[0], atol=1e-3)


def test_the_interpreter_refuses_misaligned_vector_copies_and_a_missing_barrier():
    group = gemm(64, 64, 40)
    ins = inputs_for(group)
    for vector, size in ((4, 16), (2, 8)):
        func = lowered(group, {**SMALL, "stages": 2, "vector": vector})

        def shifted(s, size=size):  # one float off the copy's alignment
            if isinstance(s, Intrinsic) and s.name == "cp_async" and int(s.args[1].value) == size:
                return Intrinsic(s.name, s.buffers, (s.offsets[0] + 1, s.offsets[1]), s.args)
            return None

        func.body = post_order(func.body, shifted)
        with pytest.raises(InterpError, match=f"addresses are not {size}-byte aligned"):
            evaluate(func, ins)
    func = lowered(group, {**SMALL, "stages": 3})
    func.body = post_order(func.body, lambda s: seq() if isinstance(s, Barrier) else None)
    with pytest.raises(InterpError, match="data race"):
        evaluate(func, ins)


def test_check_names_the_stages_knob():
    sketch = CudaContractionSketch()
    misaligned = gemm(64, 30, 32)  # B rows of 30 floats: no 16- or 8-byte aligned copies
    with pytest.raises(ScheduleError, match=r"stages 3 needs 16-byte aligned cp\.async copies: the rows of"):
        sketch.check(misaligned, {**SMALL, "stages": 3}, CUDA)
    sketch.check(misaligned, {**SMALL, "stages": 3, "vector": 1}, CUDA)  # 4-byte copies are fine
    with pytest.raises(ScheduleError, match=r"stages 2 .* and double_buffer 1 .* are alternatives"):
        sketch.check(misaligned, {**SMALL, "stages": 2, "double_buffer": 1, "vector": 1}, CUDA)
    sm75 = Target.cuda("sm_75", "Tesla T4", 40)
    assert next(k for k in sketch.space(misaligned, sm75) if k.name == "stages").values == (1,)
    with pytest.raises(ScheduleError, match="knob 'stages' = 2 is not one of \\[1\\]"):
        sketch.check(misaligned, {**SMALL, "stages": 2, "vector": 1}, sm75)
    half = gemm(64, 64, 32, dtype="float16")
    with pytest.raises(ScheduleError, match=r"stages 2 copies float32 tiles .* is float16"):
        sketch.check(half, {**SMALL, "stages": 2}, CUDA)
    big = gemm(512, 512, 64)
    with pytest.raises(ScheduleError, match="exceed the device limit \\(stages 4\\)"):
        sketch.check(big, {**SMALL, "bm": 256, "bn": 256, "bk": 64, "tm": 8, "tn": 8, "stages": 4}, CUDA)


def test_conv2d_stages_no_tile():
    b = GraphBuilder("conv")
    y = b.conv2d(b.input("x", (1, 8, 10, 10)), b.input("w", (16, 8, 3, 3)), padding=(1, 1))
    group = groups_of(b.build([y]))[0]
    sketch = sketch_for(group, CUDA)
    config = {**sketch.default(group, CUDA), "stages": 2, "double_buffer": 0}
    with pytest.raises(ScheduleError, match="stages 2 needs shared-memory tiles"):
        sketch.check(group, config, CUDA)


def test_default_is_a_three_stage_ring_on_sm80_and_the_double_buffer_below():
    group = gemm(1024, 1024, 256)
    sketch = sketch_for(group, CUDA)
    for arch in ("sm_80", "sm_90"):
        cfg = sketch.default(group, Target.cuda(arch))
        assert (cfg["stages"], cfg["double_buffer"]) == (3, 0), cfg
    old = sketch.default(group, Target.cuda("sm_75", "Tesla T4", 40))
    assert (old["stages"], old["double_buffer"]) == (1, 1)
    small = sketch.default(gemm(128, 768, 768), CUDA)  # small GEMMs keep their single-buffered tiles
    assert (small["stages"], small["double_buffer"]) == (1, 0)
    misaligned = sketch.default(gemm(1024, 1022, 256), CUDA)  # rows of 1022 floats: no 16-byte copies
    assert (misaligned["stages"], misaligned["double_buffer"]) == (1, 1)


@cache
def nvcc_resources(arch: str) -> dict:
    group = gemm(4096, 4096, 4096)
    sketch = sketch_for(group, CUDA)
    default = sketch.default(group, CUDA)
    funcs = []
    for name, cfg in (
        ("gemm4096_default", default),
        ("gemm4096_s4_swz2", {**default, "stages": 4, "smem_pad": 0, "swizzle": 2}),
    ):
        sketch.check(group, cfg, CUDA)
        func = lowered(group, cfg)
        func.name = name
        funcs.append(func)
    return nvcc_check(generate_cuda(funcs, CUDA), arch), {f.name: f.attrs["launch"] for f in funcs}


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_staged_gemm_compiles_with_nvcc_without_spills(arch):
    need_nvcc()
    res, launches = nvcc_resources(arch)
    assert set(res) == {"gemm4096_default", "gemm4096_s4_swz2"}
    for name, r in res.items():
        assert r.spill_stores == 0 and r.spill_loads == 0, (name, r)
        assert r.registers * 256 <= 65536, (name, r)
        print(
            f"{arch} {name}: {r.registers} registers, {launches[name]['shared_bytes']} B shared "
            f"(static {r.shared_bytes}), {r.spill_stores} B spilled"
        )


def self_product(m: int, k: int, transpose_b: bool):
    """x @ x^T (or x[:, :k] @ x for a square slice): both operands are views of one buffer."""
    b = GraphBuilder("self")
    x = b.input("x", (m, k))
    return groups_of(b.build([b.matmul(x, x, transpose_b=transpose_b)]))[0]


@settings(max_examples=12, deadline=None, derandomize=True)
@given(
    stages=st.sampled_from([1, 2, 3]),
    double_buffer=st.sampled_from([0, 1]),
    vector=st.sampled_from([1, 4]),
    transpose_b=st.booleans(),
    m=st.sampled_from([32, 37]),
)
def test_operands_that_are_one_buffer_are_each_staged_and_compute_the_reference(
    stages, double_buffer, vector, transpose_b, m
):
    """Both operands read one buffer: each side gets its own shared tile (only its loads read it), so the
    product is staged like any GEMM instead of reading global memory, and every legal config is exact."""
    group = self_product(m, m if not transpose_b else 24, transpose_b)
    config = {**SMALL, "vector": vector, "stages": stages, "double_buffer": double_buffer}
    try:
        sketch_for(group, CUDA).check(group, config, CUDA)
    except ScheduleError as e:
        assert "stages" in str(e) or "vector" in str(e)
        return
    func = check_group(group, config)
    allocs = [s for s in walk_stmts(func.body) if isinstance(s, Allocate)]
    shared = [s.buffer for s in allocs if s.buffer.scope == "shared"]
    assert len(shared) >= 2, func  # one tile per side (a ring of them when staged)
