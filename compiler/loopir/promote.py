"""Register promotion of local buffers: a loop-IR pass that the backends run on lowered functions just
before printing them.

A ``local`` buffer whose every access has a compile-time-constant flat index is marked
``Allocate.annotations["promote"] = width``: the printer declares it as plain variables (``float acc_0,
acc_1, ...``, width 1) or, when explicit vector loops access it, as vector variables of ``width`` lanes
(``kiln_f32x16 acc_0, acc_1``; a scalar access is a lane, ``acc_1[3]``). This is what keeps a GEMM
micro-kernel's accumulator tile in registers. An index is constant when it depends only on loop variables
that can be expanded (``unrolled`` loops up to 64 iterations, ``serial`` ones up to 16, vectorized loops
that will not become vector code) and, in vector code, on the vector lane with coefficient 1 at an offset
that is a multiple of the vector width. :func:`promote_locals` decides and fully expands the loops whose
variable appears in such an index (their bodies are copied with the variable a constant), so every access
of a promoted buffer in the result has a constant index.

Whether a vectorized loop becomes vector code is the target's question (``vectorizable``; the C target's
vectorizer). After vectorization, :func:`expand_fallback_loops` expands the vectorized loops that stayed
scalar and touch a promoted buffer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from compiler.errors import CompileError
from compiler.loopir import simplify as simp
from compiler.loopir.expr import Const, Expr, Load, Var, const, free_vars, substitute
from compiler.loopir.simplify import Ranges, flat_index
from compiler.loopir.stmt import Allocate, Buffer, BufferStore, For, Intrinsic, Stmt, seq, walk_stmts
from compiler.loopir.visitor import StmtExprVisitor, StmtMutator, StmtVisitor, substitute_stmt, with_body

PROMOTE = "promote"  # Allocate annotation: lanes per register variable of a promoted buffer
# Allocate annotation of a local buffer indexed like a register tile (every index constant once its loops
# are expanded) that is too large to promote: it stays an array (a target may print its loops differently)
MEMORY_TILE = "memory_tile"
MAX_ELEMS = 1024  # larger buffers stay arrays
MAX_EXPANSION = 4096  # most copies of one statement that expansion may create
FALLBACK_EXPAND_LIMIT = 64  # a scalar vectorized loop touching a promoted buffer is expanded up to this
_SCALAR_TYPES = ("float32", "float64", "int32", "int64", "float16", "bfloat16", "int8", "uint8", "bool")

# (vectorized loop, ranges of the enclosing loops and its own, promoted buffers -> width) -> whether the
# target will print the loop as vector code
Vectorizable = Callable[[For, Ranges, dict[Buffer, int]], bool]


def promote_locals(
    body: Stmt, vectorizable: Vectorizable | None = None, max_scalars: int = MAX_ELEMS
) -> Stmt:
    """``body`` with its promotable local buffers annotated and the loops indexing them expanded; a buffer
    of scalar variables (width 1) is promoted only up to ``max_scalars`` elements (a target with few
    registers keeps larger scalar tiles as arrays)."""
    return _Promote(vectorizable, max_scalars).visit_stmt(body)


class ScopedMutator(StmtMutator):
    """A mutator that knows the ranges of the enclosing loops (``ranges``) and the promoted buffers in
    scope (``promoted``: buffer -> lanes per variable); passes that run after promotion build on it."""

    def __init__(self) -> None:
        self.ranges: dict[Var, tuple[int, int]] = {}
        self.promoted: dict[Buffer, int] = {}

    def visit_For(self, s: For) -> Stmt:
        old = self.ranges.get(s.var)
        self.ranges[s.var] = (0, max(s.extent - 1, 0))
        try:
            return self.generic_visit_stmt(s)
        finally:
            if old is None:
                del self.ranges[s.var]
            else:
                self.ranges[s.var] = old

    def visit_Allocate(self, s: Allocate) -> Stmt:
        width = s.annotations.get(PROMOTE)
        if width is None:
            return self.generic_visit_stmt(s)
        self.promoted[s.buffer] = width
        try:
            return self.generic_visit_stmt(s)
        finally:
            del self.promoted[s.buffer]


class _Promote(ScopedMutator):
    def __init__(self, vectorizable: Vectorizable | None, max_scalars: int = MAX_ELEMS) -> None:
        super().__init__()
        self.vectorizable = vectorizable
        self.max_scalars = max_scalars

    def visit_Allocate(self, s: Allocate) -> Stmt:
        if any(isinstance(x, Intrinsic) and s.buffer in x.buffers for x in walk_stmts(s.body)):
            return super().visit_Allocate(s)  # an intrinsic's fragment: addressed by offset, stays an array
        decision = analyze(s, self.ranges, self.promoted, self.vectorizable, self.max_scalars)
        if decision is None:
            big = s.buffer.numel > min(MAX_ELEMS, self.max_scalars)
            if big and analyze(s, self.ranges, self.promoted, self.vectorizable, sized=False) is not None:
                s = Allocate(s.buffer, s.body, {**s.annotations, MEMORY_TILE: True})
            return super().visit_Allocate(s)
        width, expand = decision
        marked = Allocate(s.buffer, expand_loops(s.body, expand), {**s.annotations, PROMOTE: width})
        return super().visit_Allocate(marked)


def expand_loops(s: Stmt, loop_vars: set[Var]) -> Stmt:
    """``s`` with every loop over one of ``loop_vars`` replaced by copies of its body, one per iteration
    with the variable a constant (full unrolling)."""
    return _Expand(loop_vars).visit_stmt(s) if loop_vars else s


class _Expand(StmtMutator):
    def __init__(self, loop_vars: set[Var]) -> None:
        self.loop_vars = loop_vars

    def visit_For(self, s: For) -> Stmt:
        body = self.visit_stmt(s.body)
        if s.var not in self.loop_vars:
            return with_body(s, body)
        return seq(*(substitute_stmt(body, {s.var: const(k, s.var.dtype)}) for k in range(s.extent)))


def expand_fallback_loops(body: Stmt) -> Stmt:
    """Vectorized loops left scalar (not turned into vector code) that touch a promoted buffer, expanded
    (up to ``FALLBACK_EXPAND_LIMIT`` iterations) so that their accesses have constant indices."""
    return _ExpandFallback().visit_stmt(body)


class _ExpandFallback(ScopedMutator):
    def visit_For(self, s: For) -> Stmt:
        if (
            s.kind == "vectorized"
            and s.extent <= FALLBACK_EXPAND_LIMIT
            and any(mentions(s.body, b) for b in self.promoted)
        ):
            return self.visit_stmt(expand_loops(s, {s.var}))
        return super().visit_For(s)


# ------------------------------------------------------------------ analysis
class _Reject(Exception):
    pass


@dataclass
class _Analysis:
    buf: Buffer
    ranges: dict[Var, tuple[int, int]]
    loops: dict[Var, For] = field(default_factory=dict)
    vector_ok: dict[Var, bool] = field(default_factory=dict)
    stack: list[For] = field(default_factory=list)
    expand: set[Var] = field(default_factory=set)
    widths: set[int] = field(default_factory=set)
    sized: bool = True  # the size limits apply (MAX_EXPANSION)


def analyze(
    alloc: Allocate,
    ranges: Ranges,
    promoted: dict[Buffer, int] | None = None,
    vectorizable: Vectorizable | None = None,
    max_scalars: int = MAX_ELEMS,
    sized: bool = True,
) -> tuple[int, set[Var]] | None:
    """Whether ``alloc``'s buffer can live in registers: (lanes per variable, loops to expand), or None.
    ``ranges`` are those of the loops enclosing ``alloc``, ``promoted`` the enclosing promoted buffers;
    scalar variables (width 1) for at most ``max_scalars`` elements. ``sized=False``: whether it could
    but for its size (MAX_ELEMS, ``max_scalars``, MAX_EXPANSION)."""
    buf = alloc.buffer
    if buf.scope != "local" or (sized and buf.numel > MAX_ELEMS) or buf.dtype not in _SCALAR_TYPES:
        return None
    st = _Analysis(buf, dict(ranges), sized=sized)
    try:
        _Visit(st, dict(promoted or {}), vectorizable).visit_stmt(alloc.body)
    except (_Reject, CompileError):
        return None
    widths = st.widths
    if len(widths) > 1:
        return None
    width = next(iter(widths), 1)
    if sized and width == 1 and buf.numel > max_scalars:
        return None
    if width > 1 and (buf.dtype not in ("float32", "int32") or buf.numel % width):
        return None
    return width, st.expand


class _Visit(StmtVisitor):
    """Checks every access of the candidate buffer under the loops that enclose it."""

    def __init__(self, st: _Analysis, promoted: dict[Buffer, int], vectorizable: Vectorizable | None) -> None:
        self.st, self.promoted, self.vectorizable = st, promoted, vectorizable

    def visit_expr(self, e: Expr) -> None:
        _Loads(self.st).visit_expr(e)

    def visit_For(self, s: For) -> None:
        st = self.st
        if s.kind in ("parallel", "thread") and mentions(s.body, st.buf):
            raise _Reject
        old = st.ranges.get(s.var)
        st.ranges[s.var] = (0, max(s.extent - 1, 0))
        st.loops[s.var] = s
        if s.kind == "vectorized":
            ok = self.vectorizable is not None and self.vectorizable(s, st.ranges, self.promoted)
            st.vector_ok[s.var] = ok
        st.stack.append(s)
        try:
            self.visit_stmt(s.body)
        finally:
            st.stack.pop()
            if old is None:
                del st.ranges[s.var]
            else:
                st.ranges[s.var] = old

    def visit_BufferStore(self, s: BufferStore) -> None:
        self.generic_visit_stmt(s)
        if s.buffer is self.st.buf:
            _check_access(s.indices, self.st)


class _Loads(StmtExprVisitor):
    def __init__(self, st: _Analysis) -> None:
        self.st = st

    def visit_Load(self, e: Load) -> None:
        self.generic_visit_expr(e)
        if e.buffer is self.st.buf:
            _check_access(e.indices, self.st)


def _check_access(indices: tuple[Expr, ...], st: _Analysis) -> None:
    flat = flat_index(st.buf, indices, st.ranges)
    inner_vec = next((f for f in reversed(st.stack) if f.kind == "vectorized"), None)
    copies = 1
    for var in free_vars(flat):
        loop = st.loops.get(var)
        if loop is None:
            raise _Reject  # depends on a variable outside the allocation
        if loop is inner_vec and st.vector_ok.get(var) and simp.linear_coeff(flat, var, st.ranges) == 1:
            base = simp.to_affine(substitute(flat, {var: const(0)}), st.ranges)
            w = loop.extent
            if base.const % w or any(
                not isinstance(a, Var) or c % w or st.loops.get(a) is None for a, c in base.terms.values()
            ):
                raise _Reject
            st.widths.add(w)
            continue
        limit = 64 if loop.kind in ("unrolled", "vectorized") else 16 if loop.kind == "serial" else 0
        if loop.extent > limit:
            raise _Reject
        st.expand.add(var)
    for f in st.stack:
        if f.var in st.expand:
            copies *= f.extent
    if copies > MAX_EXPANSION and st.sized:
        raise _Reject


# ------------------------------------------------------------------ queries
class _Found(Exception):
    pass


class _Mentions(StmtExprVisitor):
    def __init__(self, buf: Buffer) -> None:
        self.buf = buf

    def visit_BufferStore(self, s: BufferStore) -> None:
        if s.buffer is self.buf:
            raise _Found
        self.generic_visit_stmt(s)

    def visit_Load(self, e: Load) -> None:
        if e.buffer is self.buf:
            raise _Found
        self.generic_visit_expr(e)


def mentions(s: Stmt, buf: Buffer) -> bool:
    """Whether any statement under ``s`` loads or stores ``buf``."""
    try:
        _Mentions(buf).visit_stmt(s)
    except _Found:
        return True
    return False


def promoted_slot(buf: Buffer, width: int, flat: Expr) -> tuple[int, int]:
    """(variable number, lane) of the element at the constant flat index ``flat`` of a buffer promoted
    with ``width`` lanes per variable (lane 0 when ``width`` is 1); a CompileError otherwise."""
    if not isinstance(flat, Const):
        raise CompileError(f"internal: promoted buffer {buf.name} accessed with a non-constant index {flat}")
    k = int(flat.value)
    if not 0 <= k < buf.numel:
        raise CompileError(f"access to {buf.name} at flat index {k} is out of bounds (size {buf.numel})")
    return k // width, k % width
