"""Split-K on CUDA: the groups ``plan_model`` makes for a BERT-like projection (bias + GELU epilogue) under
the rules' plan, whose split-K edge is on for a small M (``s<n>``, compiler/fusion.py), are the batch_matmul
partials and the reduce_sum carrying the epilogue; each is built by the default sketches, matches the numpy
reference in the SIMT interpreter, and the two kernels compile with nvcc for sm_80 and sm_90; a split model
runs end to end on the fake GPU (CuPy stand-in running kernels in the interpreter)."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from compiler.backends.cuda.codegen import generate_cuda
from compiler.backends.cuda.nvrtc import nvcc_check
from compiler.build import compile as kiln_compile
from compiler.build import plan_model
from compiler.builder import GraphBuilder
from compiler.reference import random_inputs, run_reference
from compiler.target import Target
from tests.compiler.backends.cuda.test_cuda_executor import fake_gpu, register  # noqa: F401 (fixture)
from tests.compiler.backends.cuda.util import CUDA, check_group, need_nvcc

RNG = np.random.default_rng(0)


def projection(m: int, k: int, n: int, linear: bool = False):
    """x @ w + bias, GELU; ``linear``: BERT's layout, x [1, M, K] by w [N, K] with transpose_b."""
    b = GraphBuilder("ffn_down")
    x = b.input("x", (1, m, k) if linear else (m, k))
    w = b.param("w", RNG.standard_normal((n, k) if linear else (k, n)).astype(np.float32))
    y = b.matmul(x, w, transpose_b=linear)
    return b.build([b.gelu(b.add(y, b.param("bias", RNG.standard_normal((n,)).astype(np.float32))))])


@pytest.mark.parametrize("linear", [False, True])
def test_split_projection_matches_reference_in_the_interpreter(linear):
    plan = plan_model(projection(8, 512, 16, linear), Target.cuda(sms=4))
    groups = [g for g in plan.fused.groups if not g.is_view]
    ops = [[n.op for n in g.nodes] for g in groups]
    assert len(groups) == 2 and "batch_matmul" in ops[0], ops  # partials, then the sum with the epilogue
    assert "reduce_sum" in ops[1] and "erf" in ops[1] and "add" in ops[1], ops
    for g in groups:
        check_group(g, tol=1e-4)


@cache
def nvcc_resources(arch: str) -> dict:
    plan = plan_model(projection(128, 3072, 768, linear=True), CUDA)  # BERT's FFN-down, S = 12
    assert [k.group.kind for k in plan.kernels] == ["contraction", "reduction"]
    return nvcc_check(generate_cuda([k.func for k in plan.kernels], CUDA), arch)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_split_bert_projection_compiles_with_nvcc(arch):
    need_nvcc()
    res = nvcc_resources(arch)
    assert len(res) == 2
    for name, r in res.items():
        print(f"{arch} {name}: {r}")
        assert r.spill_stores == 0, name


@pytest.mark.usefixtures("fake_gpu")
def test_a_split_model_runs_end_to_end_on_the_fake_gpu():
    """compile(..., "cuda") on a 4-SM device splits a 6x16x1024 GEMM (one tile) into 4 partials; the
    CudaCompiledModel (memory plan with the [4, 6, 16] partials, launches) runs it in the SIMT interpreter
    and matches the reference; with the edge off it is one kernel."""
    b = GraphBuilder("small_m")
    x = b.input("x", (6, 1024))
    w = b.param("w", RNG.standard_normal((1024, 16)).astype(np.float32) / 32)
    graph = b.build([b.relu(b.matmul(x, w))])
    model = kiln_compile(graph, "cuda")
    assert model.target.sm_count == 4
    assert [launch.kernel for launch in model.launches] == ["g0_batch_matmul", "g1_reduce_sum"]
    register(graph, model.target)
    inputs = random_inputs(graph, seed=0)
    (out,), (ref,) = model.run(inputs), run_reference(graph, inputs)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    assert len(kiln_compile(graph, "cuda", plan={"s0": False}).launches) == 1
