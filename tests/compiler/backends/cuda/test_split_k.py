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


def split_groups(m: int, k: int, n: int, sm_count: int):
    b = GraphBuilder("ffn_down")
    x = b.input("x", (m, k))
    y = b.matmul(x, b.param("w", RNG.standard_normal((k, n)).astype(np.float32)))
    y = b.gelu(b.add(y, b.param("bias", RNG.standard_normal((n,)).astype(np.float32))))
    graph = split_k(optimize(b.build([y])), sm_count=sm_count)
    return [g for g in fuse(graph).groups if not g.is_view]


def test_split_projection_matches_reference_in_the_interpreter():
    groups = split_groups(8, 512, 16, sm_count=4)
    kinds = {g.anchor.op if g.anchor is not None else g.kind for g in groups}
    assert "batch_matmul" in kinds and "reduce_sum" in kinds, kinds
    for g in groups:
        check_group(g, tol=1e-4)


@cache
def nvcc_resources(arch: str) -> dict:
    funcs = []
    for i, g in enumerate(split_groups(128, 3072, 768, sm_count=132)):
        func = lowered(g)
        func.name = f"splitk_{i}"
        funcs.append(func)
    return nvcc_check(generate_cuda(funcs, CUDA), arch)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_split_bert_projection_compiles_with_nvcc(arch):
    need_nvcc()
    assert nvcc_resources(arch)
