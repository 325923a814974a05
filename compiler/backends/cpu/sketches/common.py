"""What the CPU sketches share: when running a nest in parallel (the thread pool) pays off, when streaming
(non-temporal) stores of a kernel's outputs do, and when a group's exps can use the cheaper ``exp_le0``."""

from __future__ import annotations

import math

from compiler.dtypes import to_numpy
from compiler.fusion import Group
from compiler.graph import Value
from compiler.loopir import analysis as A
from compiler.loopir.expr import Call, Expr, transform
from compiler.loopir.schedule import Schedule
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


def nonpositive_exps(group: Group) -> bool:
    """Whether the group has exps and each one takes ``x - max(x)``: a ``subtract`` of ``x`` and a
    ``reduce_max`` of that same ``x`` with ``keepdims`` (broadcast back or not), softmax's shift. No such
    argument is positive (every element is compared with the maximum over a set that holds it)."""
    exps = [n for n in group.subgraph.nodes if n.op == "exp"]
    return bool(exps) and all(_minus_own_max(n.inputs[0]) for n in exps)


def _minus_own_max(v: Value) -> bool:
    sub = v.producer
    if sub is None or sub.op != "subtract":
        return False
    x, m = sub.inputs
    while m.producer is not None and m.producer.op == "broadcast_to":
        m = m.producer.inputs[0]
    red = m.producer
    if red is None or red.op != "reduce_max":
        return False
    return red.inputs[0] is x and bool(red.attrs.get("keepdims"))


def use_exp_le0(sch: Schedule) -> None:
    """Every ``exp`` of the scheduled function becomes ``exp_le0`` (for groups :func:`nonpositive_exps`
    accepts): one clamp and a degree-5 polynomial instead of two clamps and degree 6 (kiln_math)."""

    def swap(e: Expr) -> Expr | None:
        if isinstance(e, Call) and e.name == "exp":
            return Call("exp_le0", e.args, e.dtype)
        return None

    for b in sch.blocks():
        for st in A.block_stores(b):
            st.value = transform(st.value, swap)
