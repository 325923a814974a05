"""A split-K projection (passes/split_k) on CUDA: every group of the rewritten BERT-like projection
(bias + GELU epilogue) is built by the existing sketches, matches the numpy reference in the SIMT
interpreter, and compiles with nvcc for sm_80 and sm_90."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from compiler.backends.cuda.codegen import generate_cuda
from compiler.backends.cuda.nvrtc import nvcc_check
from compiler.builder import GraphBuilder
from compiler.fusion import fuse
from compiler.passes import optimize
from compiler.passes.split_k import split_k
from tests.compiler.backends.cuda.util import CUDA, check_group, lowered, need_nvcc

RNG = np.random.default_rng(0)


def split_groups(m: int, k: int, n: int, sm_count: int, linear: bool = False):
    """x @ w + bias, GELU; ``linear``: BERT's layout, x [1, M, K] by w [N, K] with transpose_b."""
    b = GraphBuilder("ffn_down")
    x = b.input("x", (1, m, k) if linear else (m, k))
    w = b.param("w", RNG.standard_normal((n, k) if linear else (k, n)).astype(np.float32))
    y = b.matmul(x, w, transpose_b=linear)
    y = b.gelu(b.add(y, b.param("bias", RNG.standard_normal((n,)).astype(np.float32))))
    graph = split_k(optimize(b.build([y])), sm_count=sm_count)
    return [g for g in fuse(graph).groups if not g.is_view]


@pytest.mark.parametrize("linear", [False, True])
def test_split_projection_matches_reference_in_the_interpreter(linear):
    groups = split_groups(8, 512, 16, sm_count=4, linear=linear)
    ops = [[n.op for n in g.nodes] for g in groups]
    assert len(groups) == 2 and "batch_matmul" in ops[0], ops  # partials, then the sum with the epilogue
    assert "reduce_sum" in ops[1] and "erf" in ops[1] and "add" in ops[1], ops
    for g in groups:
        check_group(g, tol=1e-4)


@cache
def nvcc_resources(arch: str) -> dict:
    funcs = []
    for i, g in enumerate(split_groups(128, 3072, 768, sm_count=132, linear=True)):
        func = lowered(g)
        func.name = f"splitk_{i}"
        funcs.append(func)
    return nvcc_check(generate_cuda(funcs, CUDA), arch)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_split_bert_projection_compiles_with_nvcc(arch):
    need_nvcc()
    assert nvcc_resources(arch)
