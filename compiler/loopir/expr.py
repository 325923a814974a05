"""Expressions shared by tensor expressions (``compiler.te``) and the loop IR.

Expressions are immutable and compared by identity; :func:`structural_equal` compares structure.
Python operators build expressions (``i * 16 + j``); comparisons use methods (``a.lt(b)``) so that
``==`` keeps its identity meaning. Index arithmetic uses floor division/modulo (``//``, ``%``).

Vector expressions (made by the vectorization pass just before code generation, never by schedules) carry
their lane count in the dtype: ``"float32x16"`` is 16 lanes of float32 (:func:`vector_dtype`,
:func:`lanes_of`, :func:`element_dtype`); a mask is ``"boolx16"``. :class:`Ramp` is ``base + k * stride``
in lane ``k``, :class:`Broadcast` one scalar in every lane, :class:`MakeVector` lanes given one by one
(a gather), and a ``Load`` with ``lanes > 1`` reads that many consecutive elements (row-major) from the
element its indices name. Binary, Compare, Logical, Select, Cast and Call apply lane by lane; a Select may
have a scalar condition. :class:`ExtractLane` is one lane of a vector (e.g. of a vector variable bound by a
``LetStmt``, as the CUDA vector-access pass makes them).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from compiler import dtypes

if TYPE_CHECKING:
    from compiler.loopir.stmt import Buffer

INDEX = "int32"  # dtype of loop variables and index arithmetic

_ids = itertools.count()


class Expr:
    """Base class of expressions. Every expression has a ``dtype``."""

    __slots__ = ()
    dtype: str

    # arithmetic ------------------------------------------------------------
    def __add__(self, o: Any) -> Expr:
        return binary("+", self, o)

    def __radd__(self, o: Any) -> Expr:
        return binary("+", o, self)

    def __sub__(self, o: Any) -> Expr:
        return binary("-", self, o)

    def __rsub__(self, o: Any) -> Expr:
        return binary("-", o, self)

    def __mul__(self, o: Any) -> Expr:
        return binary("*", self, o)

    def __rmul__(self, o: Any) -> Expr:
        return binary("*", o, self)

    def __truediv__(self, o: Any) -> Expr:
        return binary("/", self, o)

    def __rtruediv__(self, o: Any) -> Expr:
        return binary("/", o, self)

    def __floordiv__(self, o: Any) -> Expr:
        return binary("//", self, o)

    def __mod__(self, o: Any) -> Expr:
        return binary("%", self, o)

    def __neg__(self) -> Expr:
        return call("neg", self)

    # comparisons (methods, so == stays identity) ---------------------------
    def eq(self, o: Any) -> Expr:
        return compare("==", self, o)

    def ne(self, o: Any) -> Expr:
        return compare("!=", self, o)

    def lt(self, o: Any) -> Expr:
        return compare("<", self, o)

    def le(self, o: Any) -> Expr:
        return compare("<=", self, o)

    def gt(self, o: Any) -> Expr:
        return compare(">", self, o)

    def ge(self, o: Any) -> Expr:
        return compare(">=", self, o)

    def __repr__(self) -> str:
        from compiler.loopir.printer import expr_str

        return expr_str(self)

    __hash__ = object.__hash__


@dataclass(frozen=True, eq=False, repr=False)
class Var(Expr):
    """A scalar variable: a loop variable, a block iteration variable or a TE axis."""

    name: str
    dtype: str = INDEX
    uid: int = field(default_factory=lambda: next(_ids))


@dataclass(frozen=True, eq=False, repr=False)
class Const(Expr):
    value: int | float | bool
    dtype: str = INDEX


@dataclass(frozen=True, eq=False, repr=False)
class Binary(Expr):
    """Arithmetic: + - * / (float division; truncating for ints) // % (floor) min max pow."""

    op: str
    a: Expr
    b: Expr
    dtype: str


@dataclass(frozen=True, eq=False, repr=False)
class Compare(Expr):
    op: str  # == != < <= > >=
    a: Expr
    b: Expr
    dtype: str = "bool"


@dataclass(frozen=True, eq=False, repr=False)
class Logical(Expr):
    op: str  # and | or | not (b is None for not)
    a: Expr
    b: Expr | None = None
    dtype: str = "bool"


@dataclass(frozen=True, eq=False, repr=False)
class Select(Expr):
    cond: Expr
    t: Expr
    f: Expr
    dtype: str


@dataclass(frozen=True, eq=False, repr=False)
class Cast(Expr):
    value: Expr
    dtype: str


@dataclass(frozen=True, eq=False, repr=False)
class Call(Expr):
    """A math intrinsic with defined semantics (exp, log, sqrt, rsqrt, tanh, erf, sigmoid, abs, neg,
    recip; exp_le0: exp of an argument that is never positive, as softmax's x - max(x), which a target may
    compute more cheaply) or a target intrinsic (warp_reduce_sum/max/min with args (value, width))."""

    name: str
    args: tuple[Expr, ...]
    dtype: str


@dataclass(frozen=True, eq=False, repr=False)
class Load(Expr):
    """One element of ``buffer`` or, with ``lanes > 1``, that many consecutive elements (in row-major
    order) starting at the element ``indices`` names: a vector of ``lanes`` lanes."""

    buffer: Buffer
    indices: tuple[Expr, ...]
    lanes: int = 1

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return vector_dtype(self.buffer.dtype, self.lanes)


@dataclass(frozen=True, eq=False, repr=False)
class Ramp(Expr):
    """The index vector ``base + k * stride`` for lanes ``k = 0 .. lanes-1`` (scalar base and stride)."""

    base: Expr
    stride: Expr
    lanes: int

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return vector_dtype(self.base.dtype, self.lanes)


@dataclass(frozen=True, eq=False, repr=False)
class Broadcast(Expr):
    """The scalar ``value`` in each of ``lanes`` lanes."""

    value: Expr
    lanes: int

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return vector_dtype(self.value.dtype, self.lanes)


@dataclass(frozen=True, eq=False, repr=False)
class MakeVector(Expr):
    """A vector whose lane ``k`` is the scalar ``elems[k]`` (e.g. a gather of loads at unrelated indices)."""

    elems: tuple[Expr, ...]

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return vector_dtype(self.elems[0].dtype, len(self.elems))


@dataclass(frozen=True, eq=False, repr=False)
class ExtractLane(Expr):
    """Lane ``lane`` of the vector ``value`` (a scalar of the vector's element dtype)."""

    value: Expr
    lane: int

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return element_dtype(self.value.dtype)


@dataclass(frozen=True, eq=False, repr=False)
class IterVar:
    """An iteration variable with extent [0, extent) and a kind: 'S' (spatial) or 'R' (reduce)."""

    var: Var
    extent: int
    kind: str = "S"

    def __repr__(self) -> str:
        return f"{self.var.name}:{self.kind}{self.extent}"


@dataclass(frozen=True, eq=False, repr=False)
class Reduce(Expr):
    """A reduction (only inside tensor-expression computes): combine ``source`` over ``axis``."""

    combiner: str  # sum | max | min
    source: Expr
    axis: tuple[IterVar, ...]
    dtype: str


MATH_CALLS = {"exp", "exp_le0", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "abs", "neg", "recip"}
COMBINERS = ("sum", "max", "min")


# --------------------------------------------------------------------- helpers
def vector_dtype(dtype: str, lanes: int) -> str:
    """The dtype of ``lanes`` lanes of the scalar ``dtype`` (``dtype`` itself for one lane)."""
    return dtype if lanes == 1 else f"{dtype}x{lanes}"


def lanes_of(dtype: str) -> int:
    """How many lanes a (vector) dtype has: 16 for ``float32x16``, 1 for a scalar dtype."""
    head, sep, tail = dtype.rpartition("x")
    return int(tail) if sep and tail.isdigit() and head in dtypes.DTYPES else 1


def element_dtype(dtype: str) -> str:
    """The scalar dtype of one lane: ``float32`` for ``float32x16``."""
    return dtype.rpartition("x")[0] if lanes_of(dtype) > 1 else dtype


def const(value: int | float | bool, dtype: str | None = None) -> Const:
    if dtype is None:
        dtype = "bool" if isinstance(value, bool) else INDEX if isinstance(value, int) else "float32"
    if dtype == "bool":
        value = bool(value)
    elif dtypes.is_int(dtype):
        value = int(value)
    else:
        value = float(value)
    return Const(value, dtype)


def as_expr(v: Any, like: Expr | None = None) -> Expr:
    if isinstance(v, Expr):
        return v
    if isinstance(v, bool):
        return const(v, "bool")
    if isinstance(v, int):
        if like is not None and like.dtype != "bool":
            return const(v, like.dtype)
        return const(v, INDEX)
    if isinstance(v, float):
        return const(v, like.dtype if like is not None and dtypes.is_float(like.dtype) else "float32")
    raise TypeError(f"cannot make an expression from {v!r}")


def _pair(a: Any, b: Any) -> tuple[Expr, Expr]:
    if isinstance(a, Expr):
        return a, as_expr(b, a)
    b = as_expr(b)
    return as_expr(a, b), b


def binary(op: str, a: Any, b: Any) -> Expr:
    a, b = _pair(a, b)
    if a.dtype != b.dtype:
        raise TypeError(f"operands of {op} have dtypes {a.dtype} and {b.dtype}")
    return Binary(op, a, b, a.dtype)


def compare(op: str, a: Any, b: Any) -> Expr:
    a, b = _pair(a, b)
    return Compare(op, a, b)


def minimum(a: Any, b: Any) -> Expr:
    return binary("min", a, b)


def maximum(a: Any, b: Any) -> Expr:
    return binary("max", a, b)


def call(name: str, *args: Any, dtype: str | None = None) -> Expr:
    exprs = tuple(as_expr(a) for a in args)
    return Call(name, exprs, dtype or exprs[0].dtype)


def select(cond: Expr, t: Any, f: Any) -> Expr:
    t, f = _pair(t, f)
    return Select(cond, t, f, t.dtype)


def cast(value: Expr, dtype: str) -> Expr:
    return value if value.dtype == dtype else Cast(value, dtype)


def logical_and(*terms: Expr) -> Expr:
    out: Expr | None = None
    for t in terms:
        out = t if out is None else Logical("and", out, t)
    return out if out is not None else const(True)


def conjuncts(e: Expr) -> list[Expr]:
    """The terms of a conjunction (``a && b && ...``): what :func:`logical_and` joined."""
    if isinstance(e, Logical) and e.op == "and":
        return conjuncts(e.a) + conjuncts(e.b)  # type: ignore[arg-type]
    return [e]


def reduce_identity(combiner: str, dtype: str) -> Const:
    """The value a reduction starts from: 0 for sum, the lowest/highest value for max/min."""
    if combiner == "sum":
        return const(0, dtype)
    if dtypes.is_float(dtype):
        return const(float("-inf") if combiner == "max" else float("inf"), dtype)
    info = np.iinfo(dtypes.to_numpy(dtype))
    return const(int(info.min) if combiner == "max" else int(info.max), dtype)


def combine(combiner: str, acc: Expr, value: Expr) -> Expr:
    return {
        "sum": lambda: acc + value,
        "max": lambda: maximum(acc, value),
        "min": lambda: minimum(acc, value),
    }[combiner]()


# ------------------------------------------------------------------- visiting
_CHILDREN: dict[type, Callable[[Any], Sequence[Expr]]] = {
    Binary: lambda e: (e.a, e.b),
    Compare: lambda e: (e.a, e.b),
    Logical: lambda e: (e.a,) if e.b is None else (e.a, e.b),
    Select: lambda e: (e.cond, e.t, e.f),
    Cast: lambda e: (e.value,),
    Call: lambda e: e.args,
    Load: lambda e: e.indices,
    Reduce: lambda e: (e.source,),
    Ramp: lambda e: (e.base, e.stride),
    Broadcast: lambda e: (e.value,),
    MakeVector: lambda e: e.elems,
    ExtractLane: lambda e: (e.value,),
}


def _no_children(e: Expr) -> Sequence[Expr]:
    return ()


def children(e: Expr) -> Sequence[Expr]:
    """The direct sub-expressions of ``e`` (a table by node type: this runs for every node of every
    traversal)."""
    return _CHILDREN.get(type(e), _no_children)(e)


def walk(e: Expr) -> Any:
    """Yield every sub-expression of ``e`` (pre-order)."""
    stack = [e]
    get = _CHILDREN.get
    while stack:
        x = stack.pop()
        yield x
        kids = get(type(x))
        if kids is not None:
            stack.extend(reversed(kids(x)))


_REBUILD: dict[type, Callable[[Any, Sequence[Expr]], Expr]] = {
    Binary: lambda e, k: Binary(e.op, k[0], k[1], e.dtype),
    Compare: lambda e, k: Compare(e.op, k[0], k[1], e.dtype),
    Logical: lambda e, k: Logical(e.op, k[0], k[1] if e.b is not None else None, e.dtype),
    Select: lambda e, k: Select(k[0], k[1], k[2], e.dtype),
    Cast: lambda e, k: Cast(k[0], e.dtype),
    Call: lambda e, k: Call(e.name, tuple(k), e.dtype),
    Load: lambda e, k: Load(e.buffer, tuple(k), e.lanes),
    Reduce: lambda e, k: Reduce(e.combiner, k[0], e.axis, e.dtype),
    Ramp: lambda e, k: Ramp(k[0], k[1], e.lanes),
    Broadcast: lambda e, k: Broadcast(k[0], e.lanes),
    MakeVector: lambda e, k: MakeVector(tuple(k)),
    ExtractLane: lambda e, k: ExtractLane(k[0], e.lane),
}


def rebuild(e: Expr, kids: Sequence[Expr]) -> Expr:
    """``e`` with its children replaced by ``kids`` (the same object if nothing changed)."""
    make = _REBUILD.get(type(e))
    if make is None or all(a is b for a, b in zip(children(e), kids)):
        return e
    return make(e, kids)


_VISIT_METHODS: dict[tuple[type, type], Callable[..., Any] | None] = {}


def _visit_method(visitor: type, node: type) -> Callable[..., Any] | None:
    """The ``visit_<Type>`` function a visitor class defines for a node type, or None (looked up once per
    pair: the visitors' dispatch runs for every node)."""
    key = (visitor, node)
    try:
        return _VISIT_METHODS[key]
    except KeyError:
        method = _VISIT_METHODS[key] = getattr(visitor, "visit_" + node.__name__, None)
        return method


class ExprVisitor:
    """Walks an expression tree: ``visit_expr`` dispatches on the node type to ``visit_<Type>`` (e.g.
    ``visit_Load``) when the subclass defines it, else to :meth:`generic_visit_expr`, which visits the
    children (:func:`children`). An override calls ``self.generic_visit_expr(e)`` to keep descending."""

    def visit_expr(self, e: Expr) -> None:
        method = _visit_method(type(self), type(e))
        if method is None:
            self.generic_visit_expr(e)
        else:
            method(self, e)

    def generic_visit_expr(self, e: Expr) -> None:
        for c in children(e):
            self.visit_expr(c)


class ExprMutator:
    """Rewrites an expression tree bottom-up: ``visit_expr`` dispatches like :class:`ExprVisitor` and
    returns the replacement. :meth:`generic_visit_expr` mutates the children and rebuilds the node only
    when a child changed (:func:`rebuild`), so an unchanged tree comes back as the same object."""

    def visit_expr(self, e: Expr) -> Expr:
        method = _visit_method(type(self), type(e))
        return self.generic_visit_expr(e) if method is None else method(self, e)

    def generic_visit_expr(self, e: Expr) -> Expr:
        kids = children(e)
        if not kids:
            return e
        return rebuild(e, [self.visit_expr(c) for c in kids])


class _PostOrder(ExprMutator):
    def __init__(self, fn: Callable[[Expr], Expr | None]) -> None:
        self.fn = fn

    def visit_expr(self, e: Expr) -> Expr:
        e2 = self.generic_visit_expr(e)
        out = self.fn(e2)
        return e2 if out is None else out


def transform(e: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """Post-order rewrite: ``fn`` may return a replacement for a node (or None to keep it)."""
    return _PostOrder(fn).visit_expr(e)


class _Substitute(ExprMutator):
    def __init__(self, mapping: dict[Var, Expr]) -> None:
        self.mapping = mapping

    def visit_Var(self, e: Var) -> Expr:
        return self.mapping.get(e, e)


def substitute(e: Expr, mapping: dict[Var, Expr]) -> Expr:
    """``e`` with the variables of ``mapping`` replaced (the same object when none occurs)."""
    if not mapping:
        return e
    return _Substitute(mapping).visit_expr(e)


def free_vars(e: Expr) -> set[Var]:
    return {x for x in walk(e) if isinstance(x, Var)}


def loads(e: Expr) -> list[Load]:
    return [x for x in walk(e) if isinstance(x, Load)]


def replace_buffer_loads(e: Expr, fn: Callable[[Load], Expr | None]) -> Expr:
    """Post-order rewrite of the loads of ``e``: ``fn`` may return a replacement (or None to keep one)."""
    return transform(e, lambda x: fn(x) if isinstance(x, Load) else None)


def structural_equal(a: Expr, b: Expr, vars_map: dict[Var, Var] | None = None) -> bool:
    if a is b:
        return True
    if type(a) is not type(b) or a.dtype != b.dtype:
        return False
    if isinstance(a, Var):
        return vars_map is not None and vars_map.get(a) is b
    if isinstance(a, Const):
        return a.value == b.value or (a.value != a.value and b.value != b.value)  # type: ignore[attr-defined]
    for attr in ("op", "name", "combiner", "lane"):
        if getattr(a, attr, None) != getattr(b, attr, None):
            return False
    if isinstance(a, Load) and a.buffer is not b.buffer:  # type: ignore[attr-defined]
        return False
    ka, kb = children(a), children(b)
    return len(ka) == len(kb) and all(structural_equal(x, y, vars_map) for x, y in zip(ka, kb))
