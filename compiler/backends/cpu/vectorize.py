"""Explicit SIMD for the C target: a loop-IR pass that turns ``vectorized`` loops into vector statements
(vector loads, stores and arithmetic; the C printer writes them with GCC vector extensions).

A vectorized loop ``For(v, W)`` (W in 4, 8, 16; wider loops are first split into an unrolled loop of
W-lane chunks, :func:`split_vector_loops`) whose body is a sequence of stores becomes vector statements.
For every load and store the coefficient of ``v`` in the flat index decides the access: 1 -> a contiguous
``W``-lane load/store (``Load(..., lanes=W)``, a store of a W-lane value), 0 -> a scalar broadcast
(:class:`~compiler.loopir.expr.Broadcast`), anything else -> a gather built lane by lane
(:class:`~compiler.loopir.expr.MakeVector`); ``v`` itself is ``Ramp(0, 1, W)``. A body guarded by
``if (cond)`` with ``cond`` a conjunction of comparisons linear in ``v`` (a split tail) becomes
``if (cond at the first lane && cond at the last lane) vector code else the scalar loop``. A select whose
lane-varying condition is a constant at every lane (the lanes' positions known once the loops around are
unrolled: a convolution tile's columns) becomes a select on a constant mask, which the printer writes as a
zero-masking load when its value is a load and the other side zero.

Anything else stays a scalar ``vectorized`` loop, which the printer writes with ``#pragma GCC ivdep``
(always correct): non-contiguous or loop-invariant stores, loads in a Select branch that may be out of
bounds (both sides of a vector select are evaluated), integer division in a Select branch, dtypes other than
float32/int32, nested control flow, Evaluate statements, a load of a stored buffer at another index (a
cross-lane dependence), and accesses to a promoted buffer (``compiler.loopir.promote``) that are not
exactly one of its vector variables.
"""

from __future__ import annotations

from compiler.loopir import simplify as simp
from compiler.loopir.expr import (
    Binary,
    Broadcast,
    Call,
    Cast,
    Compare,
    Const,
    Expr,
    Load,
    Logical,
    MakeVector,
    Ramp,
    Select,
    Var,
    const,
    element_dtype,
    free_vars,
    lanes_of,
    substitute,
    vector_dtype,
    walk,
)
from compiler.loopir.promote import ScopedMutator
from compiler.loopir.simplify import Ranges, flat_index
from compiler.loopir.stmt import Buffer, BufferStore, For, IfThenElse, SeqStmt, Stmt, seq
from compiler.loopir.visitor import post_order, substitute_stmt

WIDTHS = (16, 8, 4)
VECTOR_DTYPES = ("float32", "int32")
_MATH = ("exp", "exp_le0", "log", "tanh", "erf", "sigmoid", "sqrt", "rsqrt", "abs", "neg", "recip")


class NoVector(Exception):
    """Raised while rewriting a loop that must stay scalar."""


# ------------------------------------------------------------------ splitting
def split_vector_loops(s: Stmt, max_lanes: int) -> Stmt:
    """Rewrite vectorized loops wider than ``max_lanes`` into unrolled chunks of a supported width."""

    def split(x: Stmt) -> Stmt | None:
        if not (isinstance(x, For) and x.kind == "vectorized"):
            return None
        width = next((w for w in WIDTHS if w <= max_lanes and x.extent % w == 0), None)
        if width is None or width == x.extent:
            return None
        outer, inner = Var(f"{x.var.name}_o"), Var(f"{x.var.name}_i")
        body = substitute_stmt(x.body, {x.var: outer * width + inner})
        return For(outer, x.extent // width, For(inner, width, body, "vectorized"), "unrolled")

    return post_order(s, split)


# --------------------------------------------------------------------- pass
def vectorize_loops(body: Stmt) -> Stmt:
    """``body`` with every vectorized loop that can be replaced by vector code (see the module docstring);
    promoted buffers are known from their allocations' annotations."""
    return _Vectorize().visit_stmt(body)


class _Vectorize(ScopedMutator):
    def visit_For(self, s: For) -> Stmt:
        if s.kind == "vectorized":
            out = vectorize_loop(s, self.ranges, self.promoted)
            if out is not None:
                return out
        return super().visit_For(s)


def vectorizable(loop: For, ranges: Ranges, promoted: dict[Buffer, int]) -> bool:
    """Whether :func:`vectorize_loop` turns ``loop`` into vector code (the promotion pass asks)."""
    return vectorize_loop(loop, ranges, promoted) is not None


def vectorize_loop(s: For, ranges: Ranges, promoted: dict[Buffer, int]) -> Stmt | None:
    """The vector statements replacing the vectorized loop ``s`` (under loops of ``ranges``, with
    ``promoted`` buffers -> lanes per variable), a guarded vector/scalar pair, or None (stays scalar)."""
    body = s.body
    guard = None
    if isinstance(body, IfThenElse):
        guard = _guard(s, body, ranges)
        if guard is None:
            return None
        body = body.then
    if s.extent not in WIDTHS:
        return None
    stores = body.stmts if isinstance(body, SeqStmt) else [body]
    if not all(isinstance(x, BufferStore) for x in stores):
        return None
    inner = {**ranges, s.var: (0, s.extent - 1)}
    try:
        vector = seq(*_VectorBody(s.var, s.extent, inner, promoted).emit(stores))  # type: ignore[arg-type]
    except NoVector:
        return None
    return vector if guard is None else IfThenElse(guard, vector, s)


def _guard(s: For, body: IfThenElse, ranges: Ranges) -> Expr | None:
    """``cond`` at the first and last lane when it holds for all lanes iff it holds at both ends."""
    if body.else_ is not None or not _interval_cond(body.cond):
        return None
    v = s.var
    first, last = (
        simp.simplify(substitute(body.cond, {v: const(k, v.dtype)}), ranges) for k in (0, s.extent - 1)
    )
    return Logical("and", first, last)


def _interval_cond(e: Expr) -> bool:
    if isinstance(e, Logical) and e.op == "and":
        return e.b is not None and _interval_cond(e.a) and _interval_cond(e.b)
    if isinstance(e, Compare) and e.op in ("<", "<=", ">", ">="):
        return not any(isinstance(x, Load) for x in walk(e))
    return False


def is_mask(e: Expr) -> bool:
    """A vector of lane conditions (``boolxW``)."""
    return lanes_of(e.dtype) > 1 and element_dtype(e.dtype) == "bool"


class _VectorBody:
    """Rewrites the stores of one vectorized loop body (variable ``v``, ``w`` lanes) into vector code."""

    def __init__(self, v: Var, w: int, ranges: Ranges, promoted: dict[Buffer, int]) -> None:
        self.v, self.w, self.ranges, self.promoted = v, w, ranges, promoted

    def vdt(self, dtype: str) -> str:
        if dtype not in VECTOR_DTYPES:
            raise NoVector(f"no vectors of {dtype}")
        return vector_dtype(dtype, self.w)

    def varying(self, e: Expr) -> bool:
        return self.v in free_vars(e)

    def flat(self, buf: Buffer, indices: tuple[Expr, ...]) -> Expr:
        return flat_index(buf, indices, self.ranges)

    def at(self, indices: tuple[Expr, ...], k: int) -> tuple[Expr, ...]:
        return tuple(substitute(i, {self.v: const(k, self.v.dtype)}) for i in indices)

    def emit(self, stores: list[BufferStore]) -> list[BufferStore]:
        stored: dict[Buffer, set[tuple]] = {}
        for st in stores:
            stored.setdefault(st.buffer, set()).add(simp.key(self.flat(st.buffer, st.indices)))
        for st in stores:
            for e in walk(st.value):
                if (
                    isinstance(e, Load)
                    and e.buffer in stored
                    and simp.key(self.flat(e.buffer, e.indices)) not in stored[e.buffer]
                ):
                    raise NoVector("cross-lane dependence")
        return [self.store(st) for st in stores]

    def contiguous(self, buf: Buffer, indices: tuple[Expr, ...]) -> tuple[Expr, ...] | None:
        """The indices of lane 0 when lanes are consecutive elements (None otherwise); a promoted buffer
        must be accessed at exactly one of its vector variables."""
        flat = self.flat(buf, indices)
        if simp.linear_coeff(flat, self.v, self.ranges) != 1:
            return None
        width = self.promoted.get(buf)
        if width is not None:
            base = simp.simplify(substitute(flat, {self.v: const(0)}), self.ranges)
            slots = -(-buf.numel // width)
            if width != self.w or not isinstance(base, Const) or int(base.value) % self.w:
                raise NoVector("promoted buffer slot mismatch")
            if not 0 <= int(base.value) // self.w < slots:
                raise NoVector("promoted buffer slot mismatch")
        return self.at(indices, 0)

    def store(self, st: BufferStore) -> BufferStore:
        self.vdt(st.buffer.dtype)
        base = self.contiguous(st.buffer, st.indices)
        if base is None:
            raise NoVector("store is not contiguous")
        return BufferStore(st.buffer, base, self.vec(st.value, st.buffer.dtype))

    def vec(self, e: Expr, dtype: str) -> Expr:
        """``e`` as a vector of ``dtype`` (scalars are broadcast)."""
        out = self.x(e)
        if is_mask(out):
            raise NoVector("mask where a value is needed")
        if lanes_of(out.dtype) == 1:
            self.vdt(dtype)
            return Broadcast(out, self.w)
        return out

    def mask(self, e: Expr) -> Expr:
        out = self.x(e)
        if is_mask(out):
            return out
        if lanes_of(out.dtype) == 1:
            return Broadcast(out, self.w)
        raise NoVector("value where a mask is needed")

    def lanes(self, e: Expr) -> Expr:
        """An operand of lane-wise arithmetic or a comparison: scalars are broadcast."""
        return e if lanes_of(e.dtype) > 1 else Broadcast(e, self.w)

    def x(self, e: Expr) -> Expr:
        """``e`` rewritten for all lanes: unchanged (scalar) when it does not depend on the lane."""
        if not self.varying(e):
            return e
        if isinstance(e, Var):
            return Ramp(const(0, e.dtype), const(1, e.dtype), self.w)
        if isinstance(e, Load):
            return self.load(e)
        if isinstance(e, Binary):
            return self.binary(e)
        if isinstance(e, Compare):
            if e.a.dtype not in VECTOR_DTYPES:
                raise NoVector("compare dtype")
            a, b = self.x(e.a), self.x(e.b)
            if is_mask(a) or is_mask(b):
                raise NoVector("compare of masks")
            return Compare(e.op, self.lanes(a), self.lanes(b), vector_dtype("bool", self.w))
        if isinstance(e, Logical):
            mask_dtype = vector_dtype("bool", self.w)
            if e.op == "not":
                return Logical("not", self.mask(e.a), None, mask_dtype)
            assert e.b is not None
            return Logical(e.op, self.mask(e.a), self.mask(e.b), mask_dtype)
        if isinstance(e, Select):
            return self.select(e)
        if isinstance(e, Cast):
            return self.cast(e)
        if isinstance(e, Call):
            return self.call(e)
        raise NoVector(type(e).__name__)

    def load(self, e: Load) -> Expr:
        self.vdt(e.buffer.dtype)
        base = self.contiguous(e.buffer, e.indices)
        if base is not None:
            return Load(e.buffer, base, self.w)
        return MakeVector(tuple(Load(e.buffer, self.at(e.indices, k)) for k in range(self.w)))

    def nonneg(self, e: Expr) -> bool:
        r = simp.bound(e, self.ranges)
        return r is not None and r[0] >= 0

    def binary(self, e: Binary) -> Expr:
        vt = self.vdt(e.dtype)
        a, b = self.x(e.a), self.x(e.b)
        if is_mask(a) or is_mask(b):
            raise NoVector("arithmetic on masks")
        if e.op in ("+", "-", "*", "/"):
            return Binary(e.op, self.lanes(a), self.lanes(b), vt)
        if e.op in ("//", "%") and e.dtype == "int32" and self.nonneg(e.a) and self.nonneg(e.b):
            return Binary(e.op, self.lanes(a), self.lanes(b), vt)
        if e.op in ("min", "max") or (e.op == "pow" and e.dtype == "float32"):
            return Binary(e.op, self.vec(e.a, e.dtype), self.vec(e.b, e.dtype), vt)
        raise NoVector(f"vector {e.op} on {e.dtype}")

    def select(self, e: Select) -> Expr:
        vt = self.vdt(e.dtype)
        for branch in (e.t, e.f):
            for x in walk(branch):
                if isinstance(x, Load) and not self._in_bounds(x):
                    raise NoVector("a load in a select branch may be out of bounds")
                int_div = (
                    isinstance(x, Binary) and x.op in ("/", "//", "%") and not x.dtype.startswith("float")
                )
                if int_div and not (isinstance(x.b, Const) and x.b.value != 0):  # type: ignore[union-attr]
                    raise NoVector("integer division in a select branch")
        t, f = self.vec(e.t, e.dtype), self.vec(e.f, e.dtype)
        lanes = self.constant_lanes(e.cond)
        if lanes is not None:  # a constant lane mask (e.g. a tile's columns at known lanes)
            if all(lanes):
                return t
            if not any(lanes):
                return f
            return Select(MakeVector(tuple(const(b, "bool") for b in lanes)), t, f, vt)
        if lanes_of(self.x(e.cond).dtype) == 1:
            return Select(e.cond, t, f, vt)
        return Select(self.mask(e.cond), t, f, vt)

    def constant_lanes(self, cond: Expr) -> list[bool] | None:
        """The value of a lane-varying ``cond`` at each lane when every one simplifies to a constant (the
        lane's position is known: the loops around are unrolled), else None."""
        if not self.varying(cond):
            return None
        out = []
        for k in range(self.w):
            c = simp.simplify(substitute(cond, {self.v: const(k, self.v.dtype)}), self.ranges)
            if not isinstance(c, Const):
                return None
            out.append(bool(c.value))
        return out

    def _in_bounds(self, x: Load) -> bool:
        r = simp.bound(self.flat(x.buffer, x.indices), self.ranges)
        return r is not None and r[0] >= 0 and r[1] < x.buffer.numel

    def cast(self, e: Cast) -> Expr:
        src = e.value.dtype
        if src == "bool":
            m = self.mask(e.value)
            if e.dtype not in VECTOR_DTYPES:
                raise NoVector("cast of a mask")
            return Cast(m, vector_dtype(e.dtype, self.w))
        if e.dtype == "bool":
            return Cast(self.vec(e.value, src), vector_dtype("bool", self.w))
        self.vdt(src)
        return Cast(self.vec(e.value, src), self.vdt(e.dtype))

    def call(self, e: Call) -> Expr:
        vt = self.vdt(e.dtype)
        args = (self.vec(e.args[0], e.dtype),) if e.args else ()
        allowed = _MATH if e.dtype == "float32" else ("abs", "neg")
        if e.name not in allowed:
            raise NoVector(f"vector {e.name}")
        return Call(e.name, args, vt)
