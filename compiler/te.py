"""Tensor expressions: placeholder, compute, reduce and index arithmetic.

    x = placeholder((64, 128), "float32", "x")
    k = reduce_axis(128, "k")
    m = compute((64,), lambda i: reduce("max", x[i, k], [k]), "row_max")

Each op in the registry has a compute (``compiler.te_ops``) so any graph (a fusion group's subgraph)
becomes a :class:`TEProgram`; :func:`lower` turns a program into a block-structured loop-IR
:class:`PrimFunc`: one loop nest and one block per compute stage, intermediates allocated in the root
block, ready for schedule primitives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from compiler.errors import ScheduleError
from compiler.loopir.expr import (
    Expr,
    IterVar,
    Load,
    Reduce,
    Var,
    as_expr,
    cast,
    combine,
    reduce_identity,
    substitute,
)
from compiler.loopir.stmt import Block, Buffer, BufferStore, For, PrimFunc, Stmt, seq


@dataclass(eq=False)
class Tensor:
    """A TE tensor: a placeholder (input) or the result of a compute stage."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    axis: tuple[IterVar, ...] = ()
    body: Expr | None = None  # None for placeholders
    buffer: Buffer = field(init=False)

    def __post_init__(self) -> None:
        self.buffer = Buffer(self.name, tuple(self.shape), self.dtype)

    @property
    def is_placeholder(self) -> bool:
        return self.body is None

    @property
    def is_reduction(self) -> bool:
        return isinstance(self.body, Reduce)

    def __getitem__(self, idx: object) -> Expr:
        items = idx if isinstance(idx, tuple) else (idx,)
        if len(items) != len(self.shape):
            raise ScheduleError(f"tensor {self.name}{list(self.shape)} indexed with {len(items)} indices")
        return Load(self.buffer, tuple(as_expr(i) for i in items))

    def __hash__(self) -> int:
        return id(self)


def placeholder(shape: Sequence[int], dtype: str, name: str) -> Tensor:
    return Tensor(name, tuple(shape), dtype)


def reduce_axis(extent: int, name: str) -> IterVar:
    return IterVar(Var(name), int(extent), "R")


def reduce(combiner: str, source: Expr, axis: Sequence[IterVar]) -> Reduce:
    return Reduce(combiner, source, tuple(axis), source.dtype)


def compute(
    shape: Sequence[int], fcompute: Callable[..., Expr], name: str, dtype: str | None = None
) -> Tensor:
    """A tensor whose element at ``idx`` is ``fcompute(*idx)`` (a Reduce at the top for reductions)."""
    axis = tuple(
        IterVar(Var(f"{name}_i{d}" if len(shape) > 1 else f"{name}_i"), int(n), "S")
        for d, n in enumerate(shape)
    )
    body = as_expr(fcompute(*(iv.var for iv in axis)))
    if dtype is not None and not isinstance(body, Reduce):
        body = cast(body, dtype)
    return Tensor(name, tuple(shape), body.dtype, axis, body)


@dataclass
class TEProgram:
    """Inputs, compute stages in dependency order and outputs of one kernel."""

    name: str
    inputs: list[Tensor]
    stages: list[Tensor]
    outputs: list[Tensor]


def lower(program: TEProgram) -> PrimFunc:
    """One loop nest + block per stage; intermediate buffers are allocated in the root block."""
    nests: list[Stmt] = []
    for t in program.stages:
        nests.append(_stage_nest(t))
    params = [t.buffer for t in program.inputs] + [t.buffer for t in program.outputs]
    outputs = {id(t) for t in program.outputs}
    allocs = [t.buffer for t in program.stages if id(t) not in outputs]
    root = Block("root", [], [], seq(*nests), alloc_buffers=allocs)
    return PrimFunc(program.name, params, root, len(program.inputs))


def _stage_nest(t: Tensor) -> Stmt:
    assert t.body is not None
    spatial = list(t.axis)
    reduce_ivs: list[IterVar] = list(t.body.axis) if isinstance(t.body, Reduce) else []
    # block iteration variables are fresh (v0, v1 spatial; r0, r1 reduce); loops get their own variables
    block_ivs = [IterVar(Var(f"v{d}"), iv.extent, "S") for d, iv in enumerate(spatial)]
    block_ivs += [IterVar(Var(f"r{d}"), iv.extent, "R") for d, iv in enumerate(reduce_ivs)]
    rename = {old.var: new.var for old, new in zip(spatial + reduce_ivs, block_ivs)}
    idx = tuple(rename[iv.var] for iv in spatial)
    if isinstance(t.body, Reduce):
        source = substitute(t.body.source, rename)
        acc = Load(t.buffer, idx)
        body: Stmt = BufferStore(t.buffer, idx, combine(t.body.combiner, acc, source))
        init: Stmt | None = BufferStore(t.buffer, idx, reduce_identity(t.body.combiner, t.dtype))
    else:
        body = BufferStore(t.buffer, idx, substitute(t.body, rename))
        init = None
    loop_vars = [Var(("i" if iv.kind == "S" else "k") + iv.var.name[1:]) for iv in block_ivs]
    block = Block(t.name, block_ivs, list(loop_vars), body, init)
    stmt: Stmt = block
    for lv, iv in reversed(list(zip(loop_vars, block_ivs))):
        stmt = For(lv, iv.extent, stmt)
    return stmt
