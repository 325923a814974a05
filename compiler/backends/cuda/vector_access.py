"""The CUDA target's vector-access passes on one kernel's loop IR (run by ``codegen.prepare`` before
printing): expansion of vectorized loops into straight-line code, and the rewrite that turns aligned
consecutive float32 loads/stores of straight-line code into ``float4``/``float2`` accesses, and those of
the 16-bit floats (float16, bfloat16) into 16-, 8- or 4-byte accesses of 8, 4 or 2 lanes (``uint4``/``uint2``/
``unsigned`` bits, printed by the codegen).

:func:`vectorize_accesses` looks at each run of consecutive stores. A group of loads of one global/shared
buffer whose flat indices are ``base + 0 .. base + W-1`` (same symbolic terms, constants 0..W-1 apart)
becomes one vector load when ``base`` is provably a multiple of W (``aligned``: every term's coefficient
or atom is divisible, including ``(W*c) % C`` with ``C % W == 0`` after ``lane_split`` moved the lane
offset out of a modulo). Loads are hoisted to their first use and only from buffers the run does not store;
stores are grouped when the buffer is neither read nor stored at indices of another form in the run, and
the vector store is issued at the last member. The result is plain loop IR: ``LetStmt(v, Load(buf, i,
lanes=W))``, ``ExtractLane(v, k)``, ``LetStmt(st, value)`` and ``BufferStore(buf, i, MakeVector(st...))``,
which the printer writes as ``float4``/``float2`` code.
"""

from __future__ import annotations

import math
from typing import TypeVar

from compiler import dtypes
from compiler.backends.cuda import lower as lower_cuda
from compiler.loopir import simplify as simp
from compiler.loopir.expr import (
    Binary,
    Compare,
    Const,
    Expr,
    ExtractLane,
    Load,
    Logical,
    MakeVector,
    Select,
    Var,
    children,
    const,
    free_vars,
    rebuild,
    substitute,
    vector_dtype,
    walk,
)
from compiler.loopir.stmt import (
    Buffer,
    BufferStore,
    For,
    IfThenElse,
    LetStmt,
    SeqStmt,
    Stmt,
    seq,
    stmt_exprs,
    walk_stmts,
)
from compiler.loopir.visitor import StmtExprMutator, StmtMutator, post_order, substitute_stmt, with_body

T = TypeVar("T")
# vector widths per element type, widest first: 16 bytes (float4, or uint4 = 8 halves) down to 4 or 8 bytes
WIDTHS = {"float32": (4, 2), "float16": (8, 4, 2), "bfloat16": (8, 4, 2)}
VECTOR_DTYPES = tuple(WIDTHS)
EXPAND_LIMIT = 16  # vectorized loops up to this extent are expanded into straight-line code


def expand_vector_loops(s: Stmt) -> Stmt:
    """Vectorized loops (extent <= EXPAND_LIMIT) become straight-line copies; a body guarded by a
    condition linear in the lane gets a vector path (first and last lane pass) and a scalar one."""
    return post_order(s, _expand_loop)


def _expand_loop(s: Stmt) -> Stmt | None:
    if not isinstance(s, For) or s.kind != "vectorized" or s.extent > EXPAND_LIMIT:
        return None
    body = s.body

    def copy(st: Stmt, k: int) -> Stmt:
        return substitute_stmt(st, {s.var: const(k, s.var.dtype)})

    if isinstance(body, IfThenElse) and body.else_ is None and linear_guard(body.cond, s.var):
        first, last = copy_expr(body.cond, s.var, 0), copy_expr(body.cond, s.var, s.extent - 1)
        fast = seq(*(copy(body.then, k) for k in range(s.extent)))
        slow = seq(*(copy(IfThenElse(body.cond, body.then), k) for k in range(s.extent)))
        return IfThenElse(Logical("and", first, last), fast, slow)
    return seq(*(copy(body, k) for k in range(s.extent)))


def uses_var(s: Stmt, var: Var) -> bool:
    """Whether ``var`` occurs in an expression under ``s``."""
    return any(var in free_vars(e) for x in walk_stmts(s) for e in stmt_exprs(x))


def copy_expr(e: Expr, var: Var, k: int) -> Expr:
    return substitute(e, {var: const(k, var.dtype)})


def linear_guard(e: Expr, var: Var) -> bool:
    """A conjunction of comparisons, each linear (hence monotone) in ``var``."""
    if isinstance(e, Logical) and e.op == "and":
        return linear_guard(e.a, var) and linear_guard(e.b, var)  # type: ignore[arg-type]
    if isinstance(e, Compare) and e.op in ("<", "<=", ">", ">="):
        return all(
            var not in free_vars(x) or simp.linear_coeff(x, var) is not None for x in (e.a, e.b)
        ) and not any(isinstance(x, Load) for x in walk(e))
    return False


def _divisible(e: Expr, d: int) -> bool:
    """Whether ``e`` (an integer index expression) is provably a multiple of ``d``."""
    if d == 1:
        return True
    if isinstance(e, Const):
        return int(e.value) % d == 0
    if isinstance(e, Binary):
        if e.op in ("+", "-"):
            return _divisible(e.a, d) and _divisible(e.b, d)
        if e.op == "*":
            for x, y in ((e.a, e.b), (e.b, e.a)):
                if isinstance(x, Const) and int(x.value) != 0:
                    g = math.gcd(int(x.value), d)
                    if _divisible(y, d // g):
                        return True
            return _divisible(e.a, d) or _divisible(e.b, d)
        if e.op == "%" and isinstance(e.b, Const) and int(e.b.value) % d == 0:
            return _divisible(e.a, d)
    return False


def lane_split(e: Expr, ranges: dict, width: int = 4) -> Expr:
    """``(A + r) % D -> A % D + r`` and ``(A + r) // D -> A // D`` when A is a multiple of g = gcd(D,
    width) and 0 <= r < g: the lane offset of a vector access leaves the modulo (broadcast reads)."""
    if not dtypes.is_int(e.dtype):
        return e
    e = rebuild(e, [lane_split(c, ranges, width) for c in children(e)])
    if isinstance(e, Binary) and e.op in ("%", "//") and isinstance(e.b, Const) and int(e.b.value) > 0:
        dd = int(e.b.value)
        g = math.gcd(dd, width)
        if g > 1:
            aff = simp.to_affine(e.a, ranges)
            r = aff.const % g
            if r:
                rest = simp.Affine(dict(aff.terms), aff.const - r, aff.dtype)
                base = simp.from_affine(rest)
                if _divisible(base, g):
                    if e.op == "//":
                        return simp.simplify(Binary("//", base, e.b, e.dtype), ranges)
                    return simp.simplify(Binary("%", base, e.b, e.dtype) + const(r, e.dtype), ranges)
    return simp.simplify(e, ranges) if isinstance(e, Binary) else e


def vectorize_accesses(kernel: Stmt) -> Stmt:
    """Rewrite every straight-line run of stores of ``kernel`` (one CUDA kernel, after
    :func:`expand_vector_loops` and register promotion) so that aligned consecutive float32 loads and
    stores become vector accesses (see the module docstring). A vector load is bound by a ``LetStmt``
    (``v: float32x4 = buf[i : +4]``) placed before the first statement that reads one of its lanes, and
    those reads become ``ExtractLane(v, k)``; each member of a vector store binds its value to a scalar
    (``st``) and the last one is followed by ``buf[i : +4] = vector(st, st_1, ...)``."""
    return _AccessVectorizer(lower_cuda.thread_dims(kernel)).visit_stmt(kernel)


class _StoreGroup:
    def __init__(self, width: int, indices: tuple[Expr, ...], order: list[int]) -> None:
        self.width = width
        self.indices = indices  # of lane 0
        self.order = order  # statement index of lane 0, 1, ...
        self.last = max(order)
        self.temps: dict[int, Var] = {}


class _AccessVectorizer(StmtMutator):
    """Finds the runs as the CUDA printer walks the kernel (a sequence's maximal runs of consecutive
    stores; a store elsewhere is a run of one) and knows the loop ranges and constants in scope there, so
    index arithmetic is simplified exactly as the printer will print it."""

    def __init__(self, dims: dict[str, int]) -> None:
        self.dims = dims
        self.ranges: dict[Var, tuple[int, int]] = {}
        self.consts: dict[Var, Expr] = {}

    # ------------------------------------------------------------- scopes
    def visit_For(self, s: For) -> Stmt:
        if s.extent <= 0:
            return s
        tag = s.thread or ""
        if s.kind == "thread":  # the printer's thread loops: one of extent 1 under a wider axis is thread 0
            fixed = not tag.startswith("blockIdx") and s.extent == 1 and self.dims.get(tag, 1) > 1
        else:
            fixed = s.extent == 1  # printed once with the variable a constant
        old = self.ranges.get(s.var), self.consts.get(s.var)
        self.ranges[s.var] = (0, 0) if fixed else (0, s.extent - 1)
        if fixed:
            self.consts[s.var] = const(0, s.var.dtype)
        try:
            body = self.visit_stmt(s.body)
        finally:
            for table, prev in ((self.ranges, old[0]), (self.consts, old[1])):
                if prev is None:
                    table.pop(s.var, None)
                else:
                    table[s.var] = prev  # type: ignore[assignment]
        return with_body(s, body)

    def visit_SeqStmt(self, s: SeqStmt) -> Stmt:
        out: list[Stmt] = []
        run: list[BufferStore] = []
        for x in [*s.stmts, None]:
            if isinstance(x, BufferStore):
                run.append(x)
                continue
            if run:
                out.append(self.vectorize_run(run))
                run = []
            if isinstance(x, SeqStmt):  # a nested sequence: the printer takes its statements one by one
                out.extend(self.visit_stmt(y) for y in x.stmts)
            elif x is not None:
                out.append(self.visit_stmt(x))
        if len(out) == len(s.stmts) and all(a is b for a, b in zip(out, s.stmts)):
            return s
        return SeqStmt(out)

    def visit_BufferStore(self, s: BufferStore) -> Stmt:
        return self.vectorize_run([s])

    # --------------------------------------------------------------- runs
    def flat(self, buf: Buffer, indices: tuple[Expr, ...]) -> Expr:
        """The flat index of an access as the printer simplifies it (constants substituted)."""
        if self.consts:
            indices = tuple(substitute(i, self.consts) for i in indices)  # type: ignore[arg-type]
        return simp.flat_index(buf, indices, self.ranges)

    def split_flat(self, buf: Buffer, indices: tuple[Expr, ...]) -> tuple[tuple | None, int, Expr]:
        """(symbolic terms, constant offset, flat index) of an access, the lane offset moved out of
        modulos (``lane_split``); terms None when the index is not affine."""
        flat = lane_split(self.flat(buf, indices), self.ranges)
        try:
            aff = simp.to_affine(flat, self.ranges)
        except Exception:
            return None, 0, flat
        terms = tuple(sorted((k, c) for k, (_, c) in aff.terms.items()))
        return terms, aff.const, flat

    def vectorize_run(self, run: list[BufferStore]) -> Stmt:
        loads_at = self.vector_loads(run)
        store_of = self.vector_stores(run)
        if not loads_at and not store_of:
            return seq(*run)
        lanes: dict[tuple, Expr] = {}  # (buffer uid, key of the lane's flat index) -> ExtractLane
        events: list[Stmt | tuple[Var, Expr]] = []
        for r, st in enumerate(run):
            for var, value, entries in loads_at.get(r, []):
                events.append((var, value))
                lanes.update(entries)
            if lanes:
                st = _UseLanes(self, lanes).visit_stmt(st)  # type: ignore[assignment]
            group = store_of.get(r)
            if group is None:
                events.append(st)
                continue
            tmp = Var("st", st.value.dtype)
            events.append((tmp, st.value))
            group.temps[r] = tmp
            if r == group.last:
                vector = MakeVector(tuple(group.temps[k] for k in group.order))
                events.append(BufferStore(st.buffer, group.indices, vector))
        body: Stmt | None = None
        for ev in reversed(events):
            if isinstance(ev, tuple):
                body = LetStmt(ev[0], ev[1], body if body is not None else SeqStmt([]))
            else:
                body = ev if body is None else seq(ev, body)
        assert body is not None
        return body

    def vector_loads(self, run: list[BufferStore]) -> dict[int, list[tuple[Var, Expr, dict[tuple, Expr]]]]:
        """Statement index -> the vector loads bound before it (variable, load, the lanes they replace)."""
        stored = {st.buffer.uid for st in run}
        cands: dict[tuple, dict[int, tuple[int, Expr, Load]]] = {}  # (buf uid, terms) -> const -> first
        dtype_of: dict[int, str] = {}
        for r, st in enumerate(run):
            for ld in _unconditional_loads(st):
                buf = ld.buffer
                if buf.scope == "local" or buf.dtype not in VECTOR_DTYPES or buf.uid in stored:
                    continue
                if any(isinstance(x, Load) for i in ld.indices for x in walk(i)):
                    continue
                key, c, flat = self.split_flat(buf, ld.indices)
                if key is not None:
                    cands.setdefault((buf.uid, key), {}).setdefault(c, (r, flat, ld))
                    dtype_of[buf.uid] = buf.dtype
        out: dict[int, list[tuple[Var, Expr, dict[tuple, Expr]]]] = {}
        for (uid, _), consts in cands.items():
            for width, _, members in _windows(consts, WIDTHS[dtype_of[uid]]):
                _, flat0, ld0 = members[0]
                if not aligned(flat0, width, self.ranges):
                    continue
                var = Var("v", vector_dtype(ld0.buffer.dtype, width))
                uid = ld0.buffer.uid
                entries = {(uid, simp.key(fl)): ExtractLane(var, k) for k, (_, fl, _) in enumerate(members)}
                first = min(r for r, _, _ in members)
                out.setdefault(first, []).append((var, Load(ld0.buffer, ld0.indices, width), entries))
        return out

    def vector_stores(self, run: list[BufferStore]) -> dict[int, _StoreGroup]:
        """Statement index -> the vector store it is a member of."""
        loaded = {ld.buffer.uid for st in run for ld in _unconditional_loads(st)}
        groups: dict[tuple, dict[int, tuple[int, Expr, BufferStore]]] = {}
        seen: set[tuple] = set()
        dup: set[int] = set()
        dtype_of: dict[int, str] = {}
        for r, st in enumerate(run):
            buf = st.buffer
            if buf.scope == "local" or buf.dtype not in VECTOR_DTYPES or buf.uid in loaded:
                continue
            key, c, flat = self.split_flat(buf, st.indices)
            if key is None:
                dup.add(buf.uid)
                continue
            dtype_of[buf.uid] = buf.dtype
            ident = (buf.uid, key, c)
            if ident in seen or any(u == buf.uid and k != key for u, k, _ in seen):
                dup.add(buf.uid)  # stored twice, or at indices of another form: keep program order
            seen.add(ident)
            groups.setdefault((buf.uid, key), {})[c] = (r, flat, st)
        out: dict[int, _StoreGroup] = {}
        for (uid, _), consts in groups.items():
            if uid in dup:
                continue
            for width, _, members in _windows(consts, WIDTHS[dtype_of[uid]]):
                _, flat0, st0 = members[0]
                if not aligned(flat0, width, self.ranges):
                    continue
                g = _StoreGroup(width, st0.indices, [r for r, _, _ in members])
                for r in g.order:
                    out[r] = g
        return out


class _UseLanes(StmtExprMutator):
    """Loads of a run that a bound vector load covers become lanes of its variable."""

    def __init__(self, ctx: _AccessVectorizer, lanes: dict[tuple, Expr]) -> None:
        self.ctx = ctx
        self.lanes = lanes

    def visit_Load(self, e: Load) -> Expr:
        if e.buffer.scope != "local":
            flat = lane_split(self.ctx.flat(e.buffer, e.indices), self.ctx.ranges)
            hit = self.lanes.get((e.buffer.uid, simp.key(flat)))
            if hit is not None:
                return hit
        return self.generic_visit_expr(e)


def _windows(consts: dict[int, T], widths: tuple[int, ...]) -> list[tuple[int, int, list[T]]]:
    """Aligned runs of ``widths[0]`` (else the next width ...) consecutive constant offsets."""
    out = []
    used: set[int] = set()
    for width in widths:
        for c in sorted(consts):
            if c % width or any(c + k in used or c + k not in consts for k in range(width)):
                continue
            out.append((width, c, [consts[c + k] for k in range(width)]))
            used.update(c + k for k in range(width))
    return out


def aligned(flat: Expr, width: int, ranges: dict) -> bool:
    aff = simp.to_affine(flat, ranges)
    if aff.const % width:
        return False
    for atom, c in aff.terms.values():
        g = math.gcd(abs(c), width)
        if not _divisible(atom, width // g):
            return False
    return True


def _unconditional_loads(st: BufferStore) -> list[Load]:
    """Loads every thread executing ``st`` performs (not under a select branch or a short-circuit)."""
    out: list[Load] = []

    def visit(e: Expr) -> None:
        if isinstance(e, Select):
            visit(e.cond)
            return
        if isinstance(e, Logical):
            visit(e.a)
            return
        if isinstance(e, Load):
            out.append(e)
        for c in children(e):
            visit(c)

    visit(st.value)
    for i in st.indices:
        visit(i)
    return out
