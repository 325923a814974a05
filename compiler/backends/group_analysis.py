"""Target-independent analysis of a fusion group and of its lowered blocks, shared by every backend's
sketches: what the output looks like (shape, broadcasts, pooling windows), how a reduction group's rows
and reduced axes lie, which blocks feed which, and how a contraction's loops map onto a GEMM (the
operands told apart by side of the product, the M / N / K / batch loops).

Nothing here schedules or knows a target; the sketches under ``cpu/`` and ``cuda/`` decide what to do
with the answers."""

from __future__ import annotations

import math
from dataclasses import dataclass

from compiler.errors import ScheduleError
from compiler.fusion import Group
from compiler.loopir import analysis as A
from compiler.loopir.expr import Binary, Expr, Load, Var, free_vars, walk
from compiler.loopir.schedule import Schedule
from compiler.loopir.stmt import Block, Buffer, For

POOLS = ("max_pool2d", "avg_pool2d")


# ---------------------------------------------------------------------------------------- pointwise
def out_shape(group: Group) -> tuple[int, ...]:
    """The shape of the group's first output."""
    return group.outputs[0].shape


def has_window(group: Group) -> bool:
    """Whether the group pools over a window (a reduction inside each output element)."""
    return any(n.op in POOLS for n in group.nodes)


def broadcasts(group: Group) -> bool:
    """Whether an input of the group is read with a broadcast (neither a scalar nor output-shaped)."""
    out = out_shape(group)
    return any(
        v.type.numel not in (1, math.prod(out)) or (v.shape != out and v.type.numel > 1) for v in group.inputs
    )


# ---------------------------------------------------------------------------------------- blocks
def feeds(producer: Block, consumer: Block) -> bool:
    """Whether ``consumer`` reads a buffer ``producer`` writes."""
    return any(w in A.reads(consumer) for w in A.writes(producer))


def reaches(sch: Schedule, src: Block, dst: Block) -> bool:
    """Whether ``dst`` reads, directly or through other blocks, what ``src`` writes."""
    frontier = {w.uid for w in A.writes(src)}
    for b in sch.blocks():  # program order is a topological order
        if b is src:
            continue
        if any(r.uid in frontier for r in A.reads(b)):
            if b is dst:
                return True
            frontier.update(w.uid for w in A.writes(b))
    return False


def drives_reduce(block: Block, loop: For) -> bool:
    """Whether ``loop`` drives a reduction iteration variable of ``block``."""
    return any(iv.kind == "R" and loop.var in free_vars(e) for iv, e in zip(block.iter_vars, block.bindings))


def n_spatial(block: Block) -> int:
    """The number of spatial (data-parallel) iteration variables of ``block``."""
    return sum(1 for iv in block.iter_vars if iv.kind == "S")


# ---------------------------------------------------------------------------------------- reduction
def reduce_info(group: Group) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(input shape, reduced axes) of the group's reductions."""
    anchor = group.anchor
    if anchor is None:
        raise ScheduleError(f"group {group.name} has no anchor reduction")
    return anchor.inputs[0].shape, anchor.attrs["axes"]


def row_form(group: Group) -> bool:
    """Whether the group reduces trailing axes (rows of a row-major tensor)."""
    shape, axes = reduce_info(group)
    r = len(shape)
    return bool(axes) and tuple(axes) == tuple(range(r - len(axes), r))


def row_length(group: Group) -> int:
    """The number of elements one reduction combines."""
    shape, axes = reduce_info(group)
    return math.prod(shape[a] for a in axes)


# ---------------------------------------------------------------------------------------- contraction
@dataclass
class GemmView:
    """How the contraction block's loops map onto a GEMM."""

    block: Block
    a: Buffer  # first operand (broadcast side)
    b: Buffer  # second operand (vector side)
    batch: list[For]
    m: list[For]
    n: list[For]
    k: list[For]
    b_ndim: int | None  # axis of b indexed by the innermost n loop (None if not a plain variable)
    a_mdim: int | None
    n_dims: list[int]  # positions of the N-side spatial iteration variables (= axes of the output)

    @property
    def m_extent(self) -> int:
        return self.m[-1].extent if self.m else 1

    @property
    def n_extent(self) -> int:
        return self.n[-1].extent if self.n else 1


def gemm_view(sch: Schedule, block: Block) -> GemmView:
    """Classify the loops of the contraction ``block``: M (index only the first operand), N (only the
    second), batch (both), K (reduction)."""
    loads_a, loads_b = product_sides(block)
    a, b = loads_a[0].buffer, loads_b[0].buffer
    loops = sch.get_loops(block)
    by_var = dict(zip((iv.var for iv in block.iter_vars), zip(block.iter_vars, loops)))
    uses: dict[int, set[str]] = {}
    for side, side_loads in (("a", loads_a), ("b", loads_b)):
        for ld in side_loads:
            for i in ld.indices:
                for v in free_vars(i):
                    uses.setdefault(v.uid, set()).add(side)
    batch, m, n, k = [], [], [], []
    n_dims: list[int] = []
    for pos, (iv, lp) in enumerate(by_var.values()):
        if iv.kind == "R":
            k.append(lp)
            continue
        u = uses.get(iv.var.uid, set())
        (m if u == {"a"} else n if u == {"b"} else batch).append(lp)
        if u == {"b"}:
            n_dims.append(pos)
    n_var = _var_of(block, n[-1]) if n else None
    m_var = _var_of(block, m[-1]) if m else None
    # each side's axis from that side's loads only (two views of one buffer are two operands)
    b_ndim = _plain_axis(loads_b, b, n_var)
    a_mdim = _plain_axis(loads_a, a, m_var)
    return GemmView(block, a, b, batch, m, n, k, b_ndim, a_mdim, n_dims)


def product_sides(block: Block) -> tuple[list[Load], list[Load]]:
    """The loads of the two factors of the contraction's product ``acc + lhs * rhs``: operands are told
    apart by side, so ``x @ x^T`` or two slices of one tensor are two operands."""
    own = set(A.writes(block))
    for st in A.block_stores(block):
        value = st.value
        if isinstance(value, Binary) and value.op == "+":
            src = value.b if isinstance(value.a, Load) and value.a.buffer in own else value.a
            while isinstance(src, Binary) and src.op == "*" and not (_loads_of(src.a) and _loads_of(src.b)):
                src = src.a if _loads_of(src.a) else src.b  # skip constant scale factors
            if isinstance(src, Binary) and src.op == "*":
                return _loads_of(src.a), _loads_of(src.b)
    raise ScheduleError(f"contraction: block {block.name} is not a sum of products of two operands")


def _loads_of(e: Expr) -> list[Load]:
    return [x for x in walk(e) if isinstance(x, Load)]


def _var_of(block: Block, loop: For) -> Var:
    for iv, e in zip(block.iter_vars, block.bindings):
        if e is loop.var:
            return iv.var
    raise ScheduleError(f"loop {loop.var.name} is not bound to an iteration variable")


def _plain_axis(loads: list[Load], buf: Buffer, var: Var | None) -> int | None:
    """The axis of ``buf`` indexed by exactly ``var`` in every load (None when not that simple)."""
    if var is None:
        return None
    axes = set()
    for ld in loads:
        if ld.buffer is buf:
            hits = [d for d, i in enumerate(ld.indices) if i is var]
            if len(hits) != 1 or any(var in free_vars(i) for d, i in enumerate(ld.indices) if d != hits[0]):
                return None
            axes.add(hits[0])
    return axes.pop() if len(axes) == 1 else None


def is_conv(group: Group) -> bool:
    """Whether the group's contraction is a convolution."""
    return group.anchor is not None and group.anchor.op == "conv2d"


def anchor_extents(group: Group) -> tuple[int, int]:
    """(innermost M extent, innermost N extent) computed from the anchor's shapes."""
    n = group.anchor
    if n is None:
        raise ScheduleError(f"group {group.name} has no anchor contraction")
    if n.op == "conv2d":
        return n.output.shape[3], n.output.shape[1]
    return n.output.shape[-2], n.output.shape[-1]


def reduce_and_batch(group: Group) -> tuple[int, int]:
    """(reduction length K, number of independent GEMMs) of the group's contraction."""
    n = group.anchor
    if n is None:
        raise ScheduleError(f"group {group.name} has no anchor contraction")
    if n.op == "conv2d":
        _o, cg, kh, kw = n.inputs[1].shape
        return cg * kh * kw, n.output.shape[0] * n.output.shape[2]
    a = n.inputs[0].shape
    k = a[-2] if n.attrs["transpose_a"] else a[-1]
    return k, math.prod(n.output.shape[:-2])


def const_second_operand(group: Group) -> bool:
    """The second operand is a model constant read without a layout prologue (so it can be pre-packed)."""
    a = group.anchor
    return a is not None and len(a.inputs) > 1 and group.is_const_input(a.inputs[1])
