"""Split the K loop of small-M, large-K matmuls into S partial GEMMs summed by a reduction (split-K).

A matmul ``A[M, K] @ B[K, N]`` whose output gives too few block tiles for the GPU's SMs (BERT's FFN-down
projection: M=128, N=768, K=3072 gives 24 tiles of 128x128 on 132 SMs) is rewritten as::

    P = batch_matmul(transpose(reshape(A, [M, S, K/S]), [1, 0, 2]), reshape(B, [S, K/S, N]))  # [S, M, N]
    C = reduce_sum(P, axes=0)                                                                 # [M, N]

The batch_matmul gives S times more output tiles; the sum over S is an ordinary reduction group, and the
original epilogue (bias, GELU, a residual add) reads ``C`` as before, so it fuses after the reduction.
Deterministic: no atomics, no workspace beyond the [S, M, N] partials, which the memory plan allocates
like any intermediate. This needs no runtime change.

Where the split is chosen: on CUDA each matmul that :func:`split_factor` would split (S > 1) is a fusion-plan
edge (:func:`compiler.fusion.split_k_edges`, rule ``split_k``, id ``s<n>``), on in the rules' plan for a
float32 GEMM without TF32 (:func:`split_by_default`); the plan search may flip it, and
``compiler.plan_rewrite`` rewrites the graph with :func:`emit_split` as the plan says. CPU targets have no
such edges. :func:`split_k` applies the size rule to a whole graph on its own (any dtype).
Rewritten: ``matmul`` of A [..., M, K] by B [K, N] or, with ``transpose_b``, B [N, K] (torch's linear
layout; B is then viewed [N, S, K/S] and transposed to [S, N, K/S]); A with ``transpose_a`` is left alone.
"""

from __future__ import annotations

import math

from compiler.builder import GraphBuilder
from compiler.graph import Graph, Node, Value
from compiler.passes.rewrite import rewrite
from compiler.target import Target

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


def split_by_default(node: Node, target: Target) -> bool:
    """Whether the rules split ``node`` (a matmul :func:`node_split_factor` splits) on ``target``: only a
    float32 GEMM without TF32. A float16/bfloat16 (or TF32) GEMM runs on tensor cores whole, while its
    split partials (a batch_matmul reading a transposed view of A) fall back to the SIMT sketch and are
    rounded to 16 bits before the sum: the plan search may still try the split."""
    return node.inputs[0].dtype == "float32" and not target.tf32


def gemm_shape(a: Value, w: Value, transpose_b: bool) -> tuple[int, int, int]:
    """(M, N, K) of ``matmul(a, w)``: A's leading dimensions folded into M."""
    k = a.shape[-1]
    return math.prod(a.shape[:-1]), (w.shape[0] if transpose_b else w.shape[1]), k


def node_split_factor(node: Node, sm_count: int) -> int:
    """S for ``node`` on ``sm_count`` SMs: :func:`split_factor` of its shape when it is a matmul this pass
    rewrites, else 1."""
    if not _splittable(node):
        return 1
    m, n, k = gemm_shape(*node.inputs, bool(node.attrs.get("transpose_b")))
    return split_factor(m, n, k, sm_count)


def emit_split(
    b: GraphBuilder, a: Value, w: Value, transpose_b: bool, s: int, name: str | None = None
) -> Value:
    """Add ``matmul(a, w, transpose_b)`` split into ``s`` partial GEMMs and their sum to ``b``; returns the
    sum (the matmul's shape). ``s`` must divide K."""
    m, n, k = gemm_shape(a, w, transpose_b)
    out_shape = (*a.shape[:-1], n)
    a3 = b.transpose(b.reshape(a, (m, s, k // s)), (1, 0, 2))
    if transpose_b:
        w3 = b.transpose(b.reshape(w, (n, s, k // s)), (1, 0, 2))  # [S, N, K/S]
    else:
        w3 = b.reshape(w, (s, k // s, n))
    partials = b.batch_matmul(a3, w3, transpose_b=transpose_b)  # [S, M, N]
    if len(out_shape) != 2:  # [S, ..., M, N] (a view), so the sum gives the output's shape
        partials = b.reshape(partials, (s, *out_shape))
    return b.reduce_sum(partials, axes=0, name=name)


def split_k(graph: Graph, sm_count: int = 132) -> Graph:
    """``graph`` with every small-M, large-K matmul split along K (see the module docstring)."""

    def rule(b: GraphBuilder, node: Node, inputs: list[Value]) -> Value | None:
        s = node_split_factor(node, sm_count)
        if s == 1:
            return None
        return emit_split(b, inputs[0], inputs[1], bool(node.attrs.get("transpose_b")), s, node.name)

    return rewrite(graph, rule)
