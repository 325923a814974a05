"""keep_row=online: the CUDA reduction sketch's single-pass softmax (running max and rescaled sum, then one
normalize pass) computes the reference in the SIMT interpreter for every legal config, including extreme
rows (large magnitudes, -inf entries, all -inf); it reads the row twice; it is refused outside float32
softmax; the default picks it for rows too long for registers and shared memory; nvcc sm_80/sm_90."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler.backends import sketch_for
from compiler.backends.cuda.codegen import generate_cuda
from compiler.backends.cuda.nvrtc import nvcc_check
from compiler.builder import GraphBuilder
from compiler.errors import ScheduleError
from compiler.fusion import fuse
from compiler.loopir import evaluate
from compiler.loopir.stmt import For, walk_stmts
from compiler.passes import optimize
from compiler.reference import run_reference
from tests.compiler.backends.cuda.util import CUDA, lowered, need_nvcc


def softmax_group(rows: int, cols: int, dtype: str = "float32"):
    b = GraphBuilder("sm")
    g = b.build([b.softmax(b.input("x", (rows, cols), dtype), axis=-1)])
    return next(g for g in fuse(optimize(g)).groups if not g.is_view)


def extreme_rows(rows: int, cols: int, kind: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    if kind == "large":
        x *= np.float32(1e4)  # exp underflows for all but the row max: the rescaling must not overflow
    elif kind == "negative":
        x -= np.float32(1e4)
    elif kind == "ninf":
        x[rng.random((rows, cols)) < 0.5] = -np.inf
        x[0, :] = -np.inf  # a whole row of -inf: the reference gives NaN, so must the kernel
        x[-1, 1:] = -np.inf  # one finite entry: exactly 1 there
    elif kind == "increasing":  # a new running max at every step: every partial sum is rescaled
        x = np.tile(np.linspace(-50, 50, cols, dtype=np.float32), (rows, 1))
    return x


def assert_matches(group, config, x: np.ndarray) -> None:
    (out,) = evaluate(lowered(group, config), [x])
    (ref,) = run_reference(group.subgraph, [x])
    o, r = out.astype(np.float64), ref.astype(np.float64)
    assert np.array_equal(np.isnan(o), np.isnan(r)), (config, o, r)
    ok = ~np.isnan(r)
    assert np.abs(o[ok] - r[ok]).max(initial=0.0) <= 1e-5, config


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    rows=st.integers(1, 3),
    cols=st.sampled_from([7, 64, 250, 300]),
    t=st.sampled_from([32, 64, 128]),
    rpb=st.sampled_from([1, 2]),
    v=st.sampled_from([1, 2, 4]),
    u=st.sampled_from([1, 4]),
    fast=st.sampled_from([0, 1]),
    kind=st.sampled_from(["normal", "large", "negative", "ninf", "increasing"]),
)
def test_every_legal_online_config_computes_the_reference(rows, cols, t, rpb, v, u, fast, kind):
    group = softmax_group(rows, cols)
    config = {
        "threads_per_row": t,
        "rows_per_block": rpb,
        "vector": v,
        "keep_row": "online",
        "unroll": u,
        "fast_math": fast,
    }
    try:
        sketch_for(group, CUDA).check(group, config, CUDA)
    except ScheduleError:
        return
    if fast and kind in ("large", "negative", "ninf"):
        return  # fast_math's accuracy is checked in test_reduction_memory_bound (bounded inputs)
    assert_matches(group, config, extreme_rows(rows, cols, kind, seed=cols + t))


def _passes_over_input(func) -> int:
    """Thread loops (outermost per pass) that load the kernel's input."""
    x = func.params[0]
    count = 0
    for s in walk_stmts(func.body):
        if (
            isinstance(s, For)
            and s.thread == "threadIdx.x"
            and any(getattr(e, "buffer", None) is x for e in _loads(s))
        ):
            count += 1
    return count


def _loads(s):
    from compiler.loopir.expr import Load, walk
    from compiler.loopir.stmt import BufferStore

    for b in walk_stmts(s):
        if isinstance(b, BufferStore):
            yield from (e for e in walk(b.value) if isinstance(e, Load))


def test_online_reads_the_row_twice_and_reread_three_times():
    group = softmax_group(2, 256)
    base = {"threads_per_row": 64, "rows_per_block": 1, "vector": 4, "unroll": 1, "fast_math": 0}
    online = _passes_over_input(lowered(group, {**base, "keep_row": "online"}))
    reread = _passes_over_input(lowered(group, {**base, "keep_row": "reread"}))
    assert (online, reread) == (2, 3)


def test_online_is_refused_outside_float32_softmax():
    b = GraphBuilder("ln")
    g = b.build(
        [
            b.layer_norm(
                b.input("x", (2, 64)),
                b.param("g", np.ones(64, np.float32)),
                b.param("bb", np.zeros(64, np.float32)),
            )
        ]
    )
    ln = next(g for g in fuse(optimize(g)).groups if not g.is_view)
    config = {
        "threads_per_row": 32,
        "rows_per_block": 1,
        "vector": 1,
        "keep_row": "online",
        "unroll": 1,
        "fast_math": 0,
    }
    for group in (ln, softmax_group(2, 64, "float16")):
        with pytest.raises(ScheduleError, match="keep_row=online is for float32 softmax rows only"):
            sketch_for(group, CUDA).check(group, config, CUDA)


def test_the_default_goes_online_for_rows_past_registers_and_shared_memory():
    sketch = sketch_for(softmax_group(2, 70000), CUDA)
    assert sketch.default(softmax_group(2, 70000), CUDA)["keep_row"] == "online"
    assert sketch.default(softmax_group(2, 4096), CUDA)["keep_row"] == "registers"


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_online_softmax_compiles_with_nvcc(arch):
    need_nvcc()
    funcs = []
    for k, (cols, v, fast) in enumerate([(4096, 4, 0), (70000, 4, 1), (250, 1, 0)]):
        group = softmax_group(2, cols)
        config = {
            "threads_per_row": 256,
            "rows_per_block": 1,
            "vector": v,
            "keep_row": "online",
            "unroll": 4,
            "fast_math": fast,
        }
        func = lowered(group, config)
        func.name = f"online_{k}"
        funcs.append(func)
    res = nvcc_check(generate_cuda(funcs, CUDA), arch)
    assert len(res) == 3 and all(r.spill_stores == 0 for r in res.values())
    for name, r in sorted(res.items()):
        print(f"{arch} {name}: {r}")
