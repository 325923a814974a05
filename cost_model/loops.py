"""Per-store analysis of a lowered loop IR: the loop nest around each store and the accesses it makes.

``collect_stores(func)`` walks a lowered (block-free) :class:`~compiler.loopir.stmt.PrimFunc` once and
returns one :class:`StoreInfo` per ``BufferStore``: its enclosing loops (outermost first, with kind and
thread binding), the guards around it, the arithmetic of its value and every buffer access (the store
itself and each load) as an affine map from loop variables to flat-index coefficients. Footprints
("bytes touched under loop level k") and cache lines follow the TVM/Ansor per-store recipe: per buffer
dimension, the span of the index over the loops inside level k, clipped to the dimension.

Index expressions are brought to affine form with ``compiler.loopir.simplify.to_affine`` under the loop
ranges; an atom that is not a plain variable (``(x + 4 * tx) % 16``) makes its variables *nonlinear* for
that access: they count as touching the dimension (span = the atom's bound) and as a non-unit stride.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from compiler import dtypes
from compiler.loopir.expr import (
    Binary,
    Call,
    Compare,
    Const,
    Expr,
    Load,
    Select,
    Var,
    children,
    const,
    substitute,
)
from compiler.loopir.simplify import bound, to_affine
from compiler.loopir.stmt import (
    Allocate,
    Barrier,
    Buffer,
    BufferStore,
    Evaluate,
    For,
    IfThenElse,
    Intrinsic,
    PrimFunc,
    SeqStmt,
    Stmt,
)

# relative cost of one scalar operation in "simple op" units (add/mul = 1); the math prelude's
# branch-free polynomial forms cost roughly this many instructions
CALL_COST = {
    "exp": 14.0,
    "exp_le0": 12.0,
    "log": 16.0,
    "tanh": 20.0,
    "erf": 22.0,
    "sigmoid": 18.0,
    "sqrt": 6.0,
    "rsqrt": 6.0,
    "recip": 4.0,
    "abs": 1.0,
    "neg": 1.0,
}
SPECIAL = {"exp", "exp_le0", "log", "tanh", "erf", "sigmoid"}
DIV_COST = 5.0


@dataclass(frozen=True)
class Loop:
    """One enclosing loop: variable, extent, kind (serial/parallel/vectorized/unrolled/thread), binding."""

    var: Var
    extent: int
    kind: str
    thread: str | None = None


@dataclass
class Access:
    """One buffer access of a store, as affine maps from loop variables (by uid) to coefficients: per
    dimension (``coeffs``, with the spans of nonlinear atoms in ``atom_spans``) and of the flat row-major
    index (``flat``, ``flat_atoms``). The flat form sees through the ``x // n, x % n`` pairs a fused loop
    leaves behind (``to_affine`` merges them back into ``x``)."""

    buffer: Buffer
    write: bool
    coeffs: list[dict[int, int]]
    atom_spans: list[list[tuple[frozenset[int], int]]]
    nonlinear: frozenset[int]
    flat: dict[int, int]
    flat_atoms: list[tuple[frozenset[int], int]]
    flat_nonlinear: frozenset[int]
    # uid -> flat-index difference between the variable at 1 and at 0 (every other variable at 0): the
    # stride of a variable that only appears inside a nonlinear atom (``(x + 4 * tx) % 4096``) near the
    # origin; None when the index does not fold to a constant there
    probe: dict[int, int | None] = field(default_factory=dict)

    @property
    def itemsize(self) -> int:
        return dtypes.DTYPES[self.buffer.dtype].itemsize

    def flat_coeff(self, uid: int) -> int | None:
        """Coefficient of loop variable ``uid`` in the flat (row-major) index; None if nonlinear."""
        if uid in self.flat_nonlinear:
            return None
        return self.flat.get(uid, 0)

    def stride(self, uid: int) -> int | None:
        """The flat-index stride of loop variable ``uid``: its affine coefficient, or for a variable inside
        a nonlinear atom the probed difference (see ``probe``); None when unknown."""
        if uid not in self.flat_nonlinear:
            return self.flat.get(uid, 0)
        return self.probe.get(uid)

    def depends_on(self, uid: int) -> bool:
        return uid in self.flat or uid in self.flat_nonlinear

    def spans(self, inner: dict[int, int]) -> list[int]:
        """Per-dimension number of distinct indices when the loops ``inner`` (uid -> extent) iterate."""
        out = []
        for d, size in enumerate(self.buffer.shape):
            span = 1 + sum(abs(c) * (inner[u] - 1) for u, c in self.coeffs[d].items() if u in inner)
            for uids, atom_span in self.atom_spans[d]:
                if uids & inner.keys():
                    span += atom_span - 1
            out.append(max(1, min(span, size)))
        return out

    def footprint(self, inner: dict[int, int]) -> tuple[int, int]:
        """(distinct elements, distinct 64-byte cache lines) touched while ``inner`` loops iterate: the
        smaller of the per-dimension box and the flat index range."""
        spans = self.spans(inner)
        elems = math.prod(spans) if spans else 1
        last_bytes = (spans[-1] if spans else 1) * self.itemsize
        lines = math.prod(spans[:-1]) * max(1, -(-last_bytes // 64))
        flat = 1 + sum(abs(c) * (inner[u] - 1) for u, c in self.flat.items() if u in inner)
        flat += sum(span - 1 for uids, span in self.flat_atoms if uids & inner.keys())
        flat = min(flat, max(1, self.buffer.numel))
        return min(elems, flat), min(lines, max(1, -(-flat * self.itemsize // 64)))

    def pages(self, inner: dict[int, int], page: int = 4096) -> int:
        """Distinct ``page``-byte pages touched while ``inner`` loops iterate: at most its cache lines, at
        most the pages of its flat index range (+1 for a range that straddles a page boundary)."""
        _, lines = self.footprint(inner)
        flat = 1 + sum(abs(c) * (inner[u] - 1) for u, c in self.flat.items() if u in inner)
        flat += sum(span - 1 for uids, span in self.flat_atoms if uids & inner.keys())
        flat = min(flat, max(1, self.buffer.numel))
        return max(1, min(lines, -(-flat * self.itemsize // page) + 1))


@dataclass
class StoreInfo:
    """A store in its loop nest (outermost loop first)."""

    store: BufferStore
    loops: tuple[Loop, ...]
    guards: int
    guard_vars: frozenset[int]
    accesses: list[Access]
    ops: float = 0.0  # weighted float operations per execution
    flops: int = 0  # plain float operations per execution (each call or division counts one)
    special: int = 0  # transcendental calls per execution
    divs: int = 0
    selects: int = 0
    intrinsics: int = 0  # warp reductions and other target intrinsics
    index: int = 0  # position in program order

    @property
    def trip(self) -> int:
        return math.prod(lp.extent for lp in self.loops)

    @property
    def write(self) -> Access:
        return self.accesses[0]

    @property
    def reads(self) -> list[Access]:
        return self.accesses[1:]


@dataclass
class FuncInfo:
    """Everything the features need from one lowered function."""

    stores: list[StoreInfo]
    allocs: list[tuple[Buffer, int]] = field(default_factory=list)  # (buffer, times allocated)
    barriers: int = 0  # dynamic count of barriers executed per thread block (or per call)
    loops: int = 0
    max_depth: int = 0
    parallel_entries: int = 0  # how many times a parallel loop is entered per call
    loop_iters: int = 0  # iterations of serial/parallel loops (loop overhead), outside parallel loops
    loop_iters_par: int = 0  # the same inside parallel loops
    params: list[Buffer] = field(default_factory=list)


def collect_stores(func: PrimFunc) -> FuncInfo:
    """Walk ``func`` (lowered: no blocks) and describe every store; see the module docstring."""
    info = FuncInfo([], params=list(func.params))
    _walk(func.body, [], 0, frozenset(), info)
    for k, s in enumerate(info.stores):
        s.index = k
    return info


def _walk(s: Stmt, loops: list[Loop], guards: int, guard_vars: frozenset[int], info: FuncInfo) -> None:
    if isinstance(s, SeqStmt):
        for x in s.stmts:
            _walk(x, loops, guards, guard_vars, info)
    elif isinstance(s, For):
        lp = Loop(s.var, max(1, int(s.extent)), s.kind, s.thread)
        info.loops += 1
        info.max_depth = max(info.max_depth, len(loops) + 1)
        outer = math.prod(x.extent for x in loops)
        in_par = any(x.kind == "parallel" for x in loops)
        if s.kind == "parallel" and not in_par:
            info.parallel_entries += outer
        if s.kind in ("serial", "parallel"):
            if in_par or s.kind == "parallel":
                info.loop_iters_par += outer * lp.extent
            else:
                info.loop_iters += outer * lp.extent
        _walk(s.body, [*loops, lp], guards, guard_vars, info)
    elif isinstance(s, IfThenElse):
        uids = frozenset(v.uid for v in _vars(s.cond))
        _walk(s.then, loops, guards + 1, guard_vars | uids, info)
        if s.else_ is not None:
            _walk(s.else_, loops, guards + 1, guard_vars | uids, info)
    elif isinstance(s, Allocate):
        outside = math.prod(x.extent for x in loops if x.kind != "thread")
        info.allocs.append((s.buffer, outside))
        _walk(s.body, loops, guards, guard_vars, info)
    elif isinstance(s, BufferStore):
        info.stores.append(_store_info(s, tuple(loops), guards, guard_vars))
    elif isinstance(s, Barrier):
        info.barriers += math.prod(x.extent for x in loops if x.kind != "thread")
    elif isinstance(s, Intrinsic) and s.buffers:  # (cp.async commit/wait: bookkeeping, no access)
        info.stores.append(_intrinsic_info(s, tuple(loops), guards, guard_vars))
    elif isinstance(s, Evaluate):
        pass


# float operations per lane of one warp-level mma (2 M N K / 32)
MMA_FLOPS = {"mma_m16n8k16": 2 * 16 * 8 * 16 // 32, "mma_m16n8k8_tf32": 2 * 16 * 8 * 8 // 32}
TENSOR_CORE_SPEEDUP = 8.0  # an mma's float work in "simple op" units: tensor cores vs the FP32 pipes


def _flat(buf: Buffer) -> Buffer:
    """``buf`` seen as one flat axis (intrinsics address their operands by flat offset)."""
    return Buffer(buf.name, (max(1, buf.numel),), buf.dtype, buf.scope, buf.uid)


def _intrinsic_info(
    s: Intrinsic, loops: tuple[Loop, ...], guards: int, guard_vars: frozenset[int]
) -> StoreInfo:
    """A tensor-core intrinsic as the store it amounts to: ``cp_async`` / ``ldmatrix`` copy an element of
    their source to their destination (per thread: 16 bytes / one fragment register, counted as one
    access), an ``mma`` accumulates ``A * B`` into its fragment with its float work per lane (scaled by
    the tensor cores' throughput); commit/wait are bookkeeping."""
    if s.name in MMA_FLOPS:
        d, a, b, _ = (_flat(x) for x in s.buffers)
        od, oa, ob, _ = s.offsets
        value = Binary("+", Load(d, (od,)), Binary("*", Load(a, (oa,)), Load(b, (ob,)), "float32"), "float32")
        st = _store_info(BufferStore(d, (od,), value), loops, guards, guard_vars)
        st.flops = MMA_FLOPS[s.name]
        st.ops = MMA_FLOPS[s.name] / TENSOR_CORE_SPEEDUP
        st.intrinsics += 1
        return st
    dst, src = (_flat(x) for x in s.buffers)
    st = _store_info(BufferStore(dst, (s.offsets[0],), Load(src, (s.offsets[1],))), loops, guards, guard_vars)
    st.intrinsics += 1
    return st


def _vars(e: Expr) -> list[Var]:
    out, stack = [], [e]
    while stack:
        x = stack.pop()
        if isinstance(x, Var):
            out.append(x)
        stack.extend(children(x))
    return out


def _store_info(
    s: BufferStore, loops: tuple[Loop, ...], guards: int, guard_vars: frozenset[int]
) -> StoreInfo:
    ranges = {lp.var: (0, lp.extent - 1) for lp in loops}
    info = StoreInfo(s, loops, guards, guard_vars, [_access(s.buffer, s.indices, True, ranges)])
    stack: list[Expr] = [s.value]
    while stack:
        e = stack.pop()
        if isinstance(e, Load):
            info.accesses.append(_access(e.buffer, e.indices, False, ranges))
            continue  # index arithmetic is not float work
        if isinstance(e, Binary) and dtypes.is_float(e.dtype):
            info.flops += 1
            if e.op == "/":
                info.divs += 1
                info.ops += DIV_COST
            elif e.op == "pow":
                info.special += 1
                info.ops += CALL_COST["exp"] + CALL_COST["log"]
            else:
                info.ops += 1.0
        elif isinstance(e, Call):
            if e.name.startswith("warp_") or e.name not in CALL_COST:
                info.intrinsics += 1
                info.ops += 8.0
            else:
                info.flops += 1
                info.ops += CALL_COST[e.name]
                info.special += e.name in SPECIAL
        elif isinstance(e, Select):
            info.selects += 1
            info.ops += 1.0
        elif isinstance(e, Compare) and dtypes.is_float(e.a.dtype):
            info.ops += 1.0
        stack.extend(children(e))
    return info


def _affine_parts(
    e: Expr, ranges: dict
) -> tuple[dict[int, int], list[tuple[frozenset[int], int]], frozenset[int]]:
    """(var uid -> coefficient, [(uids of a nonlinear atom, its span)], uids inside nonlinear atoms)."""
    if isinstance(e, Const):
        return {}, [], frozenset()
    c: dict[int, int] = {}
    spans: list[tuple[frozenset[int], int]] = []
    nonlinear: set[int] = set()
    for atom, k in to_affine(e, ranges).terms.values():
        if isinstance(atom, Var):
            c[atom.uid] = c.get(atom.uid, 0) + k
            continue
        uids = frozenset(v.uid for v in _vars(atom))
        nonlinear |= uids
        r = bound(atom, ranges)
        spans.append((uids, (r[1] - r[0] + 1) * abs(k) if r is not None else 1 << 20))
    return {u: k for u, k in c.items() if k}, spans, frozenset(nonlinear)


def _access(buf: Buffer, indices: tuple[Expr, ...], write: bool, ranges: dict) -> Access:
    coeffs, atom_spans, nonlinear = [], [], set()
    for idx in indices:
        c, spans, nl = _affine_parts(idx, ranges)
        coeffs.append(c)
        atom_spans.append(spans)
        nonlinear |= nl
    flat_expr: Expr | None = None
    for idx, stride in zip(indices, buf.strides):
        term = idx * stride if stride != 1 else idx
        flat_expr = term if flat_expr is None else flat_expr + term
    if flat_expr is None or len(indices) == 1:
        flat = coeffs[0] if coeffs else {}
        flat_atoms, flat_nl = (atom_spans[0] if atom_spans else []), frozenset(nonlinear)
    else:
        flat, flat_atoms, flat_nl = _affine_parts(flat_expr, ranges)
    probe: dict[int, int | None] = {}
    if flat_nl and flat_expr is not None:
        variables = {v.uid: v for v in _vars(flat_expr)}
        for uid in flat_nl:
            if uid in variables:
                probe[uid] = _probe_stride(flat_expr, variables[uid], variables.values())
    return Access(buf, write, coeffs, atom_spans, frozenset(nonlinear), flat, flat_atoms, flat_nl, probe)


def _probe_stride(e: Expr, var: Var, variables) -> int | None:
    """``e(var=1) - e(var=0)`` with every other variable at 0, or None if that does not fold."""
    values = []
    for at in (0, 1):
        mapping = {v: const(at if v is var else 0, v.dtype) for v in variables}
        a = to_affine(substitute(e, mapping), {})
        if not a.is_const():
            return None
        values.append(a.const)
    return values[1] - values[0]


def inner_loops(loops: tuple[Loop, ...], level: int) -> dict[int, int]:
    """uid -> extent of the loops at ``level`` and inside it (level 0 = the whole nest)."""
    return {lp.var.uid: lp.extent for lp in loops[level:]}
