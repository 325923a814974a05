"""Loop IR statements: loops, blocks with iteration bindings, stores, allocations, barriers.

Statements are mutable: schedule primitives edit a function in place. A :class:`Block` is one
computation stage (TVM TensorIR's block + block-realize in one node): iteration variables with
extents and kinds (spatial 'S' / reduce 'R'), their bindings to surrounding loop variables, an optional
predicate, an optional reduction ``init`` and a body that stores into its output buffer. Lowering
(``compiler.loopir.lower``) removes blocks and leaves plain loops, stores and allocations for codegen.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from compiler import dtypes
from compiler.loopir.expr import Expr, IterVar, Var

SCOPES = ("global", "shared", "local")
FOR_KINDS = ("serial", "parallel", "vectorized", "unrolled", "thread")

_buf_ids = itertools.count()


@dataclass(eq=False)
class Buffer:
    """A multi-dimensional array with a memory scope (global, shared or local)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    scope: str = "global"
    uid: int = field(default_factory=lambda: next(_buf_ids))

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * dtypes.DTYPES[self.dtype].itemsize

    @property
    def strides(self) -> tuple[int, ...]:
        out, acc = [], 1
        for d in reversed(self.shape):
            out.append(acc)
            acc *= d
        return tuple(reversed(out))

    def __repr__(self) -> str:
        return f"{self.name}<{self.scope}>{list(self.shape)}"

    __hash__ = object.__hash__


class Stmt:
    __slots__ = ()

    def __repr__(self) -> str:
        from compiler.loopir.printer import stmt_str

        return stmt_str(self)


@dataclass(eq=False, repr=False)
class For(Stmt):
    var: Var
    extent: int
    body: Stmt
    kind: str = "serial"
    thread: str | None = None  # blockIdx.x / threadIdx.x ... when kind == "thread"
    annotations: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False, repr=False)
class Block(Stmt):
    name: str
    iter_vars: list[IterVar]
    bindings: list[Expr]
    body: Stmt
    init: Stmt | None = None
    predicate: Expr | None = None
    alloc_buffers: list[Buffer] = field(default_factory=list)
    annotations: dict[str, Any] = field(default_factory=dict)

    @property
    def is_reduction(self) -> bool:
        return any(iv.kind == "R" for iv in self.iter_vars)


@dataclass(eq=False, repr=False)
class BufferStore(Stmt):
    """``buffer[indices] = value``; a vector ``value`` of W lanes stores W consecutive elements (row-major)
    starting at the element ``indices`` names."""

    buffer: Buffer
    indices: tuple[Expr, ...]
    value: Expr


@dataclass(eq=False, repr=False)
class SeqStmt(Stmt):
    stmts: list[Stmt]


@dataclass(eq=False, repr=False)
class IfThenElse(Stmt):
    cond: Expr
    then: Stmt
    else_: Stmt | None = None


@dataclass(eq=False, repr=False)
class Allocate(Stmt):
    """``buffer`` exists while ``body`` runs. Annotations are decisions of passes for code generation,
    e.g. ``{"promote": width}`` (``compiler.loopir.promote``): held in registers, ``width`` lanes per
    variable."""

    buffer: Buffer
    body: Stmt
    annotations: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False, repr=False)
class LetStmt(Stmt):
    """``var`` (a scalar or vector variable) holds ``value`` while ``body`` runs. Made only by code
    generation's passes (the CUDA vector-access pass binds vector loads and store operands); lowered IR
    and the interpreters never see one."""

    var: Var
    value: Expr
    body: Stmt


@dataclass(eq=False, repr=False)
class Evaluate(Stmt):
    """An intrinsic evaluated for its effect."""

    expr: Expr


@dataclass(eq=False, repr=False)
class Intrinsic(Stmt):
    """A target operation on buffer elements, with semantics defined by name (the tensor-core sketch's
    warp-level operations; ``compiler.loopir.interp_simt_tc`` runs them, the CUDA printer prints them
    as inline PTX). ``buffers[i]`` is addressed from the flat element ``offsets[i]`` (per thread);
    ``args`` are scalar operands (e.g. a cp.async predicate). Warp-collective ones (``ldmatrix``,
    ``mma``) are executed by all 32 lanes of a warp together; their ``local`` buffers are fragments:
    each lane's registers, laid out as the PTX ISA says for the operation."""

    name: str
    buffers: tuple[Buffer, ...]
    offsets: tuple[Expr, ...]
    args: tuple[Expr, ...] = ()


@dataclass(eq=False, repr=False)
class Barrier(Stmt):
    """All threads of a block wait here (``__syncthreads()``); a no-op on the CPU."""

    scope: str = "shared"


@dataclass(eq=False)
class PrimFunc:
    """A kernel: parameter buffers (inputs first, then outputs) and a body."""

    name: str
    params: list[Buffer]
    body: Stmt
    num_inputs: int
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def inputs(self) -> list[Buffer]:
        return self.params[: self.num_inputs]

    @property
    def outputs(self) -> list[Buffer]:
        return self.params[self.num_inputs :]

    def __repr__(self) -> str:
        from compiler.loopir.printer import func_str

        return func_str(self)


# ------------------------------------------------------------------ traversal
# The one place that knows each statement's children (statements and expressions); the generic
# visitors and mutators of ``compiler.loopir.visitor`` are built on these three functions.
_STMT_CHILDREN: dict[type, Callable[[Any], list[Stmt]]] = {
    For: lambda s: [s.body],
    Allocate: lambda s: [s.body],
    LetStmt: lambda s: [s.body],
    Block: lambda s: [s.body] if s.init is None else [s.init, s.body],
    SeqStmt: lambda s: list(s.stmts),
    IfThenElse: lambda s: [s.then] if s.else_ is None else [s.then, s.else_],
}


def _no_stmts(s: Stmt) -> list[Stmt]:
    return []


def stmt_children(s: Stmt) -> list[Stmt]:
    """The statements directly under ``s``, in execution order (a Block's init before its body)."""
    return _STMT_CHILDREN.get(type(s), _no_stmts)(s)


def stmt_exprs(s: Stmt) -> list[Expr]:
    """The expressions ``s`` itself holds (not those of the statements under it)."""
    if isinstance(s, BufferStore):
        return [*s.indices, s.value]
    if isinstance(s, IfThenElse):
        return [s.cond]
    if isinstance(s, Evaluate):
        return [s.expr]
    if isinstance(s, LetStmt):
        return [s.value]
    if isinstance(s, Intrinsic):
        return [*s.offsets, *s.args]
    if isinstance(s, Block):
        return list(s.bindings) if s.predicate is None else [*s.bindings, s.predicate]
    return []


def rebuild_stmt(s: Stmt, kids: list[Stmt], exprs: list[Expr]) -> Stmt:
    """``s`` with its children (as :func:`stmt_children` lists them) replaced by ``kids`` and its
    expressions (as :func:`stmt_exprs` lists them) by ``exprs``; ``s`` itself when nothing changed.
    A rebuilt sequence is flattened (:func:`seq`, empty sequences dropped)."""
    if all(a is b for a, b in zip(stmt_children(s), kids)) and all(
        a is b for a, b in zip(stmt_exprs(s), exprs)
    ):
        return s
    if isinstance(s, For):
        return For(s.var, s.extent, kids[0], s.kind, s.thread, dict(s.annotations))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, kids[0], dict(s.annotations))
    if isinstance(s, SeqStmt):
        return seq(*kids) if kids else SeqStmt([])
    if isinstance(s, IfThenElse):
        return IfThenElse(exprs[0], kids[0], kids[1] if s.else_ is not None else None)
    if isinstance(s, BufferStore):
        return BufferStore(s.buffer, tuple(exprs[:-1]), exprs[-1])
    if isinstance(s, Evaluate):
        return Evaluate(exprs[0])
    if isinstance(s, LetStmt):
        return LetStmt(s.var, exprs[0], kids[0])
    if isinstance(s, Intrinsic):
        n = len(s.offsets)
        return Intrinsic(s.name, s.buffers, tuple(exprs[:n]), tuple(exprs[n:]))
    if isinstance(s, Block):
        n = len(s.bindings)
        return Block(
            s.name,
            list(s.iter_vars),
            list(exprs[:n]),
            kids[-1],
            kids[0] if s.init is not None else None,
            exprs[n] if s.predicate is not None else None,
            list(s.alloc_buffers),
            dict(s.annotations),
        )
    raise TypeError(f"rebuild_stmt: unknown statement {type(s).__name__}")


def walk_stmts(s: Stmt) -> Iterator[Stmt]:
    """Every statement under ``s`` (pre-order, including ``s``)."""
    stack = [s]
    get = _STMT_CHILDREN.get
    while stack:
        x = stack.pop()
        yield x
        kids = get(type(x))
        if kids is not None:
            stack.extend(reversed(kids(x)))


def seq(*stmts: Stmt | None) -> Stmt:
    flat: list[Stmt] = []
    for s in stmts:
        if s is None:
            continue
        if isinstance(s, SeqStmt):
            flat.extend(s.stmts)
        else:
            flat.append(s)
    return flat[0] if len(flat) == 1 else SeqStmt(flat)
