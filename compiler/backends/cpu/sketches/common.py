"""What the CPU sketches share: when running a nest in parallel (OpenMP) pays off, and when streaming
(non-temporal) stores of a kernel's outputs do."""

from __future__ import annotations

import math

from compiler.dtypes import to_numpy
from compiler.fusion import Group

# Below this much work (elements touched, or flops / 8 for contractions) an OpenMP fork/join costs more
# than it saves, and on a loaded machine a spinning thread pool can cost milliseconds: stay serial.
PARALLEL_MIN_WORK = 1 << 16

# ops whose vector code costs tens of instructions per element: a group with one is compute-bound
EXPENSIVE = {"exp", "log", "tanh", "erf", "sigmoid"}


def streams_pay(group: Group, l3_bytes: int) -> bool:
    """Whether streaming stores pay by default: the group's inputs and outputs together overflow half the
    last-level cache (the outputs' lines would otherwise be read before being written, and evict the
    inputs) and the group is memory-bound. With a transcendental per element (softmax's exp, GELU's erf)
    the kernel is compute-bound: measured on a Zen 5 host, streaming then gains nothing (bias_gelu
    [4096,3072] 1 thread: 8.27 vs 8.21 ms AVX2, 4.45 vs 4.39 ms AVX-512), while a plain add of two
    [4096,3072] arrays runs 3.23 -> 2.62 ms (the tuner can still pick either)."""
    nbytes = sum(math.prod(v.shape) * to_numpy(v.dtype).itemsize for v in (*group.inputs, *group.outputs))
    cheap = not any(n.op in EXPENSIVE for n in group.subgraph.nodes)
    return cheap and nbytes > l3_bytes // 2
