"""Split the K loop of small-M, large-K matmuls into S partial GEMMs summed by a reduction (split-K).

A matmul ``A[M, K] @ B[K, N]`` whose output gives too few block tiles for the GPU's SMs (BERT's FFN-down
projection: M=128, N=768, K=3072 gives 24 tiles of 128x128 on 132 SMs) is rewritten as::

    P = batch_matmul(transpose(reshape(A, [M, S, K/S]), [1, 0, 2]), reshape(B, [S, K/S, N]))  # [S, M, N]
    C = reduce_sum(P, axes=0)                                                                 # [M, N]

The batch_matmul gives S times more output tiles; the sum over S is an ordinary reduction group, and the
original epilogue (bias, GELU, a residual add) reads ``C`` as before, so it fuses after the reduction.
Deterministic: no atomics, no workspace beyond the [S, M, N] partials, which the memory plan allocates
like any intermediate. This needs no runtime change.

Where the split is chosen: a rule (:func:`split_factor`), not a searched plan edge. The pass is not in the
default pipeline (CPU targets are unaffected); a CUDA build applies it with the device's SM count.
Rewritten: ``matmul`` of A [..., M, K] by B [K, N] or, with ``transpose_b``, B [N, K] (torch's linear
layout; B is then viewed [N, S, K/S] and transposed to [S, N, K/S]); A with ``transpose_a`` is left alone.
"""

from __future__ import annotations

import math

from compiler.builder import GraphBuilder
from compiler.graph import Graph, Node, Value
from compiler.passes.rewrite import rewrite

BLOCK_TILE = 128  # the CUDA contraction sketch's default block tile (bm = bn)
MIN_K_PER_SPLIT = 256  # each partial GEMM keeps at least this many K steps


def split_factor(m: int, n: int, k: int, sm_count: int) -> int:
    """S for a [M, K] x [K, N] matmul on ``sm_count`` SMs; 1 means leave it alone.

    Split when the output tiles at the default block tile fill at most half the SMs; S is the largest
    divisor of K that keeps tiles * S <= sm_count and K/S >= MIN_K_PER_SPLIT."""
    tiles = -(-m // BLOCK_TILE) * -(-n // BLOCK_TILE)
    if 2 * tiles > sm_count:
        return 1
    best = 1
    for s in range(2, k // MIN_K_PER_SPLIT + 1):
        if k % s == 0 and tiles * s <= sm_count:
            best = s
    return best


def _splittable(node: Node) -> bool:
    """A matmul of A [..., M, K] (leading dimensions folded into M) by B [K, N], or by B [N, K] with
    ``transpose_b`` (torch's linear layout); A not transposed."""
    if node.op != "matmul":
        return False
    a, b = node.inputs
    return len(a.shape) >= 2 and len(b.shape) == 2 and not node.attrs.get("transpose_a")


def split_k(graph: Graph, sm_count: int = 132) -> Graph:
    """``graph`` with every small-M, large-K matmul split along K (see the module docstring)."""

    def rule(b: GraphBuilder, node: Node, inputs: list[Value]) -> Value | None:
        if not _splittable(node):
            return None
        k = inputs[0].shape[-1]
        m = math.prod(inputs[0].shape[:-1])
        tb = bool(node.attrs.get("transpose_b"))
        n = inputs[1].shape[0] if tb else inputs[1].shape[1]
        s = split_factor(m, n, k, sm_count)
        if s == 1:
            return None
        a = b.transpose(b.reshape(inputs[0], (m, s, k // s)), (1, 0, 2))
        if tb:
            w = b.transpose(b.reshape(inputs[1], (n, s, k // s)), (1, 0, 2))  # [S, N, K/S]
        else:
            w = b.reshape(inputs[1], (s, k // s, n))
        partials = b.batch_matmul(a, w, transpose_b=tb)  # [S, M, N]
        if len(node.output.shape) != 2:  # [S, ..., M, N] (a view), so the sum gives the output's shape
            partials = b.reshape(partials, (s, *node.output.shape))
        return b.reduce_sum(partials, axes=0, name=node.name)

    return rewrite(graph, rule)
