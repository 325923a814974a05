"""What the CPU sketches share: when running a nest in parallel (the thread pool) pays off, and when streaming
(non-temporal) stores of a kernel's outputs do."""

from __future__ import annotations

import math

from compiler.dtypes import to_numpy
from compiler.fusion import Group
from compiler.target import Target

# Below this much work (elements touched, or flops / 8 for contractions) a parallel fork/join costs more
# than it saves, and on a loaded machine a spinning thread pool can cost milliseconds: stay serial.
PARALLEL_MIN_WORK = 1 << 16

# ops whose vector code costs tens of instructions per element: a group with one is compute-bound
EXPENSIVE = {"exp", "log", "tanh", "erf", "sigmoid"}


def streams_pay(group: Group, target: Target) -> bool:
    """Whether streaming stores pay by default: the group's inputs and outputs together overflow half the
    last-level cache (the outputs' lines would otherwise be read before being written, and evict the
    inputs) and the group is memory-bound on ``target``.

    Measured on a Zen 5 host, 1 thread, 64-byte-aligned outputs: a plain add of two [4096,3072] arrays
    runs 3.23 -> 2.62 ms with streaming stores; bias_gelu [4096,3072] (an erf per element) gains nothing
    (8.27 vs 8.21 ms AVX2, 4.45 vs 4.39 ms AVX-512); softmax [4096,1024] (one exp per element) gains on
    AVX-512 (0.95-1.12 -> 0.79-0.80 ms: with 16 lanes the exp no longer hides the memory traffic, and
    each 64-byte non-temporal store writes a whole cache line) but loses on AVX2 (1.16-1.20 -> 1.23-1.30
    ms: compute-bound, and 32-byte non-temporal stores write half lines). So: groups without a
    transcendental op, and on 64-byte vectors groups whose only one is a single exp. The tuner can still
    pick either."""
    nbytes = sum(math.prod(v.shape) * to_numpy(v.dtype).itemsize for v in (*group.inputs, *group.outputs))
    heavy = [n.op for n in group.subgraph.nodes if n.op in EXPENSIVE]
    light = not heavy or (heavy == ["exp"] and target.vector_bytes >= 64)
    return light and nbytes > target.l3_bytes // 2
