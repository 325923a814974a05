"""Split-K on CUDA: the groups ``plan_model`` makes for a BERT-like projection (bias + GELU epilogue) under
the rules' plan, whose split-K edge is on for a small M (``s<n>``, compiler/fusion.py), are the batch_matmul
partials and the reduce_sum carrying the epilogue; each is built by the default sketches, matches the numpy
reference in the SIMT interpreter, and the two kernels compile with nvcc for sm_80 and sm_90."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from compiler.backends.cuda.codegen import generate_cuda
from compiler.backends.cuda.nvrtc import nvcc_check
from compiler.build import plan_model
from compiler.builder import GraphBuilder
from compiler.target import Target
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
