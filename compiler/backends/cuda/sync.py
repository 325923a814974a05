"""Barrier insertion for GPU kernels (TVM's ThreadSync): ``__syncthreads()`` between statements that
communicate through shared memory.

Each statement is summarised by the shared buffers it reads and writes before its first barrier and after
its last one. Walking a statement sequence, a barrier goes before a statement whose first accesses
conflict with what is pending since the last barrier (a read after a write, or a write after a read), and
at the end of a serial loop's body when the next iteration's first accesses conflict with the last ones.
Barriers are only placed in *convergent* code, which every thread of the block reaches: the kernel body,
blockIdx loops, serial loops, thread loops spanning their whole axis, and ``if``s on uniform conditions
(block and serial-loop variables, no loads). Statements inside partial thread loops or thread-dependent
``if``s are summarised as a whole. Loops marked ``kiln_synced`` (double buffering) bring their own
barriers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from compiler.loopir.expr import Expr, Load, Var, free_vars, walk
from compiler.loopir.stmt import (
    Allocate,
    Barrier,
    BufferStore,
    For,
    IfThenElse,
    SeqStmt,
    Stmt,
    seq,
    stmt_exprs,
)
from compiler.loopir.visitor import StmtMutator, with_body


def is_thread_axis(tag: str | None) -> bool:
    """Whether a loop's binding tag is one of ``threadIdx.x/y/z``."""
    return bool(tag) and tag.startswith("threadIdx")  # type: ignore[union-attr]


def insert_barriers(part: Stmt, dims: dict[str, int]) -> Stmt:
    """``part`` (one kernel) with the barriers its shared-memory traffic needs."""
    return _Sync(dims).visit_stmt(part)


@dataclass(frozen=True)
class _Acc:
    """Shared buffers read and written (by uid)."""

    reads: frozenset[int] = frozenset()
    writes: frozenset[int] = frozenset()

    def __or__(self, o: _Acc) -> _Acc:
        return _Acc(self.reads | o.reads, self.writes | o.writes)

    def conflicts(self, later: _Acc) -> bool:
        """A read after a write or a write after a read (two writes of one element by different threads
        would be a race no barrier fixes; the copies Kiln generates write disjoint elements)."""
        return bool(self.writes & later.reads or self.reads & later.writes)


EMPTY = _Acc()


@dataclass
class _Summary:
    first: _Acc = field(default_factory=_Acc)  # accesses before the first barrier
    last: _Acc = field(default_factory=_Acc)  # accesses after the last barrier
    barrier: bool = False


def _shared_loads(exprs: Iterable[Expr]) -> frozenset[int]:
    return frozenset(
        ld.buffer.uid for e in exprs for ld in walk(e) if isinstance(ld, Load) and ld.buffer.scope == "shared"
    )


def _summary(s: Stmt) -> _Summary:
    if isinstance(s, Barrier):
        return _Summary(EMPTY, EMPTY, True)
    if isinstance(s, SeqStmt):
        out = _Summary()
        for x in s.stmts:
            sx = _summary(x)
            if not out.barrier:
                out.first = out.first | sx.first
            out.last = sx.last if sx.barrier else out.last | sx.first
            out.barrier = out.barrier or sx.barrier
        return out
    if isinstance(s, (For, Allocate)):
        return _summary(s.body)
    if isinstance(s, IfThenElse):
        a = _summary(s.then)
        b = _summary(s.else_) if s.else_ is not None else _Summary()
        cond = _Acc(_shared_loads([s.cond]))
        first = a.first | b.first | cond
        last = cond | (a.last if a.barrier else a.first) | (b.last if b.barrier else b.first)
        return _Summary(first, last, a.barrier or b.barrier)
    acc = _Acc(_shared_loads(stmt_exprs(s)))
    if isinstance(s, BufferStore) and s.buffer.scope == "shared":
        acc = acc | _Acc(writes=frozenset({s.buffer.uid}))
    return _Summary(acc, acc, False)


def _uniform_cond(e: Expr, uniform: frozenset[Var]) -> bool:
    return not any(isinstance(x, Load) for x in walk(e)) and free_vars(e) <= uniform


class _Sync(StmtMutator):
    """Insert barriers where all threads of the block reach them. ``uniform`` holds the variables with one
    value per block (blockIdx and serial loop variables)."""

    def __init__(self, dims: dict[str, int]) -> None:
        self.dims = dims
        self.uniform: frozenset[Var] = frozenset()

    def visit_SeqStmt(self, s: SeqStmt) -> Stmt:
        stmts, _ = self.sync_seq(s.stmts, EMPTY)
        return SeqStmt(stmts)

    def visit_IfThenElse(self, s: IfThenElse) -> Stmt:
        if not _uniform_cond(s.cond, self.uniform):
            return s  # threads diverge: summarised as a whole by the enclosing sequence
        return self.generic_visit_stmt(s)

    def visit_For(self, s: For) -> Stmt:
        if s.annotations.get("kiln_synced"):
            return s  # barriers placed by the pipeline transform
        if s.kind == "thread":
            if is_thread_axis(s.thread) and s.extent != self.dims.get(s.thread or "", s.extent):
                return s  # a partial thread loop: threads diverge inside
            inner = self.uniform if is_thread_axis(s.thread) else self.uniform | {s.var}
        else:
            inner = self.uniform | {s.var}
        outer, self.uniform = self.uniform, inner
        try:
            new, pending = self.sync_seq(s.body.stmts if isinstance(s.body, SeqStmt) else [s.body], EMPTY)
        finally:
            self.uniform = outer
        carried = s.kind != "thread" and s.extent > 1  # thread loops run side by side, not in turn
        if carried and pending.conflicts(_summary(SeqStmt(new)).first):
            new.append(Barrier())  # the next iteration overwrites or reads what this one left
        return with_body(s, seq(*new) if len(new) != 1 else new[0])

    def sync_seq(self, stmts: list[Stmt], pending: _Acc) -> tuple[list[Stmt], _Acc]:
        out: list[Stmt] = []
        for x in stmts:
            x = self.visit_stmt(x)
            sm = _summary(x)
            if pending.conflicts(sm.first):
                out.append(Barrier())
                pending = EMPTY
            out.append(x)
            pending = sm.last if sm.barrier else pending | sm.first
        return out, pending
