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
Only plain ``matmul`` nodes (no transpose flags, 2-D operands) are rewritten.
"""

from __future__ import annotations

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


def _plain_matmul(node: Node) -> bool:
    if node.op != "matmul":
        return False
    a, b = node.inputs
    return (
        len(a.shape) == 2
        and len(b.shape) == 2
        and not node.attrs.get("transpose_a")
        and not node.attrs.get("transpose_b")
    )


def split_k(graph: Graph, sm_count: int = 132) -> Graph:
    """``graph`` with every small-M, large-K plain matmul split along K (see the module docstring)."""

    def rule(b: GraphBuilder, node: Node, inputs: list[Value]) -> Value | None:
        if not _plain_matmul(node):
            return None
        (m, k), (_k, n) = inputs[0].shape, inputs[1].shape
        s = split_factor(m, n, k, sm_count)
        if s == 1:
            return None
        a = b.transpose(b.reshape(inputs[0], (m, s, k // s)), (1, 0, 2))
        w = b.reshape(inputs[1], (s, k // s, n))
        return b.reduce_sum(b.batch_matmul(a, w), axes=0, name=node.name)

    return rewrite(graph, rule)
