"""The CUDA reduction sketch's memory-bound details: softmax computes ``exp`` once per element and
multiplies by the reciprocal of the row sum, the ``fast_math`` knob prints ``__expf``/``__logf`` and its
accuracy (SIMT interpreter with the intrinsics' error model) stays within the tuner's float32 check; the
kernels compile with nvcc for sm_80 and sm_90."""

from __future__ import annotations

import re
from functools import cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler.backends.cuda.codegen import generate_cuda
from compiler.backends.cuda.nvrtc import nvcc_check
from compiler.builder import GraphBuilder
from compiler.errors import ScheduleError
from compiler.fusion import fuse
from compiler.loopir import evaluate
from compiler.loopir.expr import Load, walk
from compiler.loopir.interp_simt_expr import fast_exp_model, fast_log_model
from compiler.loopir.stmt import BufferStore, walk_stmts
from compiler.passes import optimize
from compiler.reference import run_reference
from tests.compiler.backends.cuda.util import CUDA, check_group, lowered, need_nvcc
from tuner.measure.check import RTOL

BASE = {"threads_per_row": 32, "rows_per_block": 2, "vector": 4, "keep_row": "registers", "unroll": 1}


def row_group(op: str, rows: int = 4, cols: int = 256):
    b = GraphBuilder(op)
    x = b.input("x", (rows, cols))
    if op == "layer_norm":
        w = b.param("w", np.linspace(0.5, 1.5, cols, dtype=np.float32))
        y = b.layer_norm(x, w, b.param("bb", np.linspace(-1, 1, cols, dtype=np.float32)))
    else:
        y = b.apply(op, x, axis=-1)
    groups = [g for g in fuse(optimize(b.build([y]))).groups if not g.is_view]
    assert len(groups) == 1
    return groups[0]


def source(op: str, **knobs) -> str:
    func = lowered(row_group(op), {**BASE, "fast_math": 0, **knobs})
    func.name = f"{op}_{'_'.join(f'{k}{v}' for k, v in knobs.items()) or 'base'}"
    return generate_cuda([func], CUDA)


def reads(e, buf) -> bool:
    return any(isinstance(x, Load) and x.buffer is buf for x in walk(e))


def body(src: str) -> str:
    return src[src.index('extern "C" __global__') :]


def test_softmax_computes_exp_once_per_element():
    # 256 columns over 32 threads x float4: 8 elements per thread, so 8 expf calls (16 when inlined twice)
    text = body(source("softmax"))
    assert len(re.findall(r"\bexpf\(", text)) == 8, text
    assert not re.search(r"\] / reduce_sum", text)  # the division became a multiplication by the reciprocal
    assert re.search(r"\* \(1\.0f / reduce_sum\[0\]\)", text), text


def test_reread_rows_keep_the_inlined_exp():
    """Rows too long for registers are re-read; the exp stays inlined (nothing to keep it in)."""
    func = lowered(row_group("softmax", 2, 8192), {**BASE, "keep_row": "reread", "fast_math": 0})
    assert "v_exp" not in str(func)


def test_layer_norm_divides_by_no_per_element_value():
    """layer_norm's divisors are constants (the mean's 1/N) or already an rsqrt multiplication."""
    divisors = re.findall(r" / ([^ ;)]+)", body(source("layer_norm")))
    assert divisors and all(re.fullmatch(r"[0-9.e+-]+f", d) for d in divisors), divisors


def test_fast_math_knob_prints_the_intrinsics():
    text = body(source("softmax", fast_math=1))
    assert "__expf(" in text and not re.search(r"[^_]expf\(", text)
    assert "__logf(" in body(source("log_softmax", fast_math=1))


def close_enough(out: np.ndarray, ref: np.ndarray, rtol: float) -> float:
    scale = max(1.0, float(np.abs(ref).max()))
    return float(np.abs(out.astype(np.float64) - ref.astype(np.float64)).max()) / scale


@settings(max_examples=6, deadline=None, derandomize=True)
@given(
    op=st.sampled_from(["softmax", "log_softmax"]),
    spread=st.sampled_from([1.0, 10.0, 60.0]),
    seed=st.integers(0, 2**16),
)
def test_fast_math_schedules_stay_within_the_float32_check(op, spread, seed):
    """With the intrinsics' error model, a fast-math softmax computes the numpy reference within the
    tuner's float32 tolerance (tuner.measure.check.RTOL), even for logits spread over +-60."""
    group = row_group(op, 4, 128)
    x = (np.random.default_rng(seed).standard_normal((4, 128)) * spread).astype(np.float32)
    ref = run_reference(group.subgraph, [x])[0]
    fast = evaluate(lowered(group, {**BASE, "fast_math": 1}), [x])[0]
    assert close_enough(fast, ref, RTOL["float32"]) <= RTOL["float32"]


@settings(max_examples=30, deadline=None, derandomize=True)
@given(x=st.floats(-80.0, 80.0, width=32))
def test_fast_exp_model_error_bound(x):
    """__expf's error: log2(e) and the product x*log2(e) rounded to float32 (each up to |x|*2^-24
    relative in the result) plus the final rounding; ex2.approx's own 2 ulp come on top on hardware."""
    got = float(fast_exp_model(np.float32(x)))
    want = float(np.exp(np.float64(x)))
    bound = (2 * abs(x) + 1) * 2.0**-24 * want
    assert abs(got - want) <= bound + np.finfo(np.float32).tiny


@pytest.mark.parametrize("x", [1e-30, 0.5, 1.0, 2.0, 1e30])
def test_fast_log_model_is_close_to_log(x):
    assert float(fast_log_model(np.float32(x))) == pytest.approx(np.log(np.float32(x)), rel=1e-6, abs=1e-6)


def test_shared_rows_read_global_memory_once():
    """keep_row=shared: only the staging copy (unrolled by 4) loads the input from global memory; the
    reductions and the epilogue read the shared copy."""
    group = row_group("softmax", 3, 1024)
    config = {**BASE, "keep_row": "shared", "fast_math": 0, "threads_per_row": 64}
    func = check_group(group, config)
    x = func.params[0]
    global_reads = [s for s in walk_stmts(func.body) if isinstance(s, BufferStore) and reads(s.value, x)]
    assert global_reads and all(s.buffer.scope == "shared" for s in global_reads)


def test_long_rows_default_to_more_threads_then_shared_memory():
    from compiler.backends import sketch_for

    def default(n: int) -> dict:
        g = row_group("softmax", 2, n)
        return sketch_for(g, CUDA).default(g, CUDA)

    assert default(16384)["threads_per_row"] == 512 and default(16384)["keep_row"] == "registers"
    assert default(65536)["threads_per_row"] == 1024 and default(65536)["keep_row"] == "registers"
    # 1024 threads x 64 floats is the register limit; 128K floats = 512 KiB do not fit shared memory either:
    # the single-pass (online) softmax, which reads the row twice
    assert default(131072)["keep_row"] == "online"
    with pytest.raises(ScheduleError, match="keep_row=shared needs"):
        g = row_group("softmax", 2, 131072)
        sketch_for(g, CUDA).check(g, {**default(131072), "keep_row": "shared"}, CUDA)


@cache
def nvcc_resources(arch: str) -> dict:
    funcs = []
    for op, knobs in (
        ("softmax", {}),
        ("softmax", {"fast_math": 1}),
        ("log_softmax", {"fast_math": 1}),
        ("layer_norm", {}),
        ("softmax", {"keep_row": "shared"}),
    ):
        func = lowered(row_group(op), {**BASE, "fast_math": 0, **knobs})
        func.name = f"{op}_fast{knobs.get('fast_math', 0)}" + ("_shared" if "keep_row" in knobs else "")
        funcs.append(func)
    return nvcc_check(generate_cuda(funcs, CUDA), arch)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_memory_bound_kernels_compile_with_nvcc(arch):
    need_nvcc()
    res = nvcc_resources(arch)
    assert set(res) == {
        "softmax_fast0",
        "softmax_fast1",
        "log_softmax_fast1",
        "layer_norm_fast0",
        "softmax_fast0_shared",
    }
    for name, r in res.items():
        assert r.spill_stores == 0, f"{name} ({arch}) spills"
