"""Index-arithmetic simplification and bound analysis.

Integer expressions are brought to an affine normal form ``sum(coeff * atom) + const`` where atoms are
variables or irreducible sub-expressions (``x // 3`` when nothing better is known). Given variable ranges
(loop extents), floor division and modulo by constants are simplified the way split/fuse create them:
``(io * 16 + ii) // 16 -> io`` and ``(io * 16 + ii) % 16 -> ii`` when ``0 <= ii < 16``. Comparisons that
the ranges decide are folded, so guards that always hold disappear.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from compiler import dtypes
from compiler.errors import CompileError
from compiler.loopir.expr import (
    Binary,
    Call,
    Cast,
    Compare,
    Const,
    Expr,
    ExtractLane,
    Load,
    Logical,
    Select,
    Var,
    children,
    const,
    rebuild,
)

if TYPE_CHECKING:
    from compiler.loopir.stmt import Buffer

Range = tuple[int, int]  # inclusive [lo, hi]
Ranges = Mapping[Var, Range]


def key(e: Expr) -> tuple:
    """A structural key: equal keys mean structurally equal expressions (variables by identity)."""
    if isinstance(e, Var):
        return ("v", e.uid)
    if isinstance(e, Const):
        return ("c", e.dtype, e.value)
    if isinstance(e, Load):
        lanes = () if e.lanes == 1 else (("lanes", e.lanes),)
        return ("load", e.buffer.uid, *lanes, *(key(i) for i in e.indices))
    if isinstance(e, ExtractLane):
        return ("lane", e.lane, key(e.value))
    tag = (type(e).__name__, getattr(e, "op", None), getattr(e, "name", None), e.dtype)
    return (*tag, *(key(c) for c in children(e)))


# ------------------------------------------------------------------- affine
@dataclass
class Affine:
    terms: dict[tuple, tuple[Expr, int]]  # key -> (atom, coefficient)
    const: int
    dtype: str

    def scaled(self, k: int) -> Affine:
        if k == 0:
            return Affine({}, 0, self.dtype)
        return Affine({kk: (a, c * k) for kk, (a, c) in self.terms.items()}, self.const * k, self.dtype)

    def plus(self, other: Affine, sign: int = 1) -> Affine:
        terms = dict(self.terms)
        for kk, (a, c) in other.terms.items():
            c0 = terms.get(kk, (a, 0))[1] + sign * c
            if c0:
                terms[kk] = (a, c0)
            else:
                terms.pop(kk, None)
        return Affine(terms, self.const + sign * other.const, self.dtype)

    def is_const(self) -> bool:
        return not self.terms


def _atom(e: Expr) -> Affine:
    return Affine({key(e): (e, 1)}, 0, e.dtype)


def bound(e: Expr, ranges: Ranges) -> Range | None:
    """Inclusive integer bounds of ``e`` for variables in ``ranges`` (None when unbounded)."""
    if isinstance(e, Const):
        return (int(e.value), int(e.value))
    if isinstance(e, Var):
        return ranges.get(e)
    if isinstance(e, Binary):
        a, b = bound(e.a, ranges), bound(e.b, ranges)
        if a is None or b is None:
            return None
        return interval(e.op, a, b)
    if isinstance(e, Select):
        t, f = bound(e.t, ranges), bound(e.f, ranges)
        if t is None or f is None:
            return None
        return (min(t[0], f[0]), max(t[1], f[1]))
    if isinstance(e, Cast) and dtypes.is_int(e.dtype) and dtypes.is_int(e.value.dtype):
        return bound(e.value, ranges)
    return None


def interval(op: str, a: Range, b: Range) -> Range | None:
    """The bounds of ``x op y`` for ``x`` in ``a`` and ``y`` in ``b`` (None for an op without a rule)."""
    if op == "+":
        return (a[0] + b[0], a[1] + b[1])
    if op == "-":
        return (a[0] - b[1], a[1] - b[0])
    if op == "*":
        c = (a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1])
        return (min(c), max(c))
    if op in ("//", "%") and b[0] == b[1] and b[0] > 0:
        d = b[0]
        if op == "//":
            return (a[0] // d, a[1] // d)
        if a[0] // d == a[1] // d:
            return (a[0] % d, a[1] % d)
        return (0, d - 1)
    if op == "min":
        return (min(a[0], b[0]), min(a[1], b[1]))
    if op == "max":
        return (max(a[0], b[0]), max(a[1], b[1]))
    return None


def affine_bound(a: Affine, ranges: Ranges) -> Range | None:
    lo = hi = a.const
    for atom, c in a.terms.values():
        r = bound(atom, ranges)
        if r is None:
            return None
        lo += min(c * r[0], c * r[1])
        hi += max(c * r[0], c * r[1])
    return (lo, hi)


def to_affine(e: Expr, ranges: Ranges) -> Affine:
    """Affine normal form of an integer expression (atoms are simplified sub-expressions)."""
    if isinstance(e, Const):
        return Affine({}, int(e.value), e.dtype)
    if isinstance(e, Var):
        return _atom(e)
    if isinstance(e, Binary) and e.op in ("+", "-"):
        a, b = to_affine(e.a, ranges), to_affine(e.b, ranges)
        return _merge_divmod(a.plus(b, 1 if e.op == "+" else -1))
    if isinstance(e, Binary) and e.op == "*":
        a, b = to_affine(e.a, ranges), to_affine(e.b, ranges)
        if b.is_const():
            return a.scaled(b.const)
        if a.is_const():
            return b.scaled(a.const)
        return _atom(Binary("*", from_affine(a), from_affine(b), e.dtype))
    if isinstance(e, Binary) and e.op in ("//", "%"):
        b = to_affine(e.b, ranges)
        if b.is_const() and b.const > 0:
            return _divmod(e.op, to_affine(e.a, ranges), b.const, ranges)
        return _atom(Binary(e.op, from_affine(to_affine(e.a, ranges)), from_affine(b), e.dtype))
    if isinstance(e, Binary) and e.op in ("min", "max"):
        a, b = to_affine(e.a, ranges), to_affine(e.b, ranges)
        diff = affine_bound(a.plus(b, -1), ranges)
        if diff is not None:
            if diff[1] <= 0:  # a <= b
                return a if e.op == "min" else b
            if diff[0] >= 0:
                return b if e.op == "min" else a
        return _atom(Binary(e.op, from_affine(a), from_affine(b), e.dtype))
    return _atom(simplify(e, ranges))


def _divmod(op: str, a: Affine, d: int, ranges: Ranges) -> Affine:
    if d == 1:
        return a if op == "//" else Affine({}, 0, a.dtype)
    # split into a part divisible by d and a remainder
    div_terms = {k: (x, c) for k, (x, c) in a.terms.items() if c % d == 0}
    rem_terms = {k: (x, c) for k, (x, c) in a.terms.items() if c % d != 0}
    q_const, r_const = divmod(a.const, d)
    quot = Affine({k: (x, c // d) for k, (x, c) in div_terms.items()}, q_const, a.dtype)
    rem = Affine(rem_terms, r_const, a.dtype)
    r = affine_bound(rem, ranges)
    if r is not None and r[0] // d == r[1] // d:
        k = r[0] // d
        if op == "//":
            return quot.plus(Affine({}, k, a.dtype))
        return rem.plus(Affine({}, k * d, a.dtype), -1)
    # (x % (k*d)) % d -> x % d ; (x // c1) // d -> x // (c1*d)
    if len(rem.terms) == 1 and rem.const == 0:
        ((atom, c),) = rem.terms.values()
        if isinstance(atom, Binary) and c == 1 and atom.b is not None and isinstance(atom.b, Const):
            inner = to_affine(atom.a, ranges)
            if op == "%" and atom.op == "%" and int(atom.b.value) % d == 0:
                return _divmod("%", inner, d, ranges).plus(quot.scaled(0))
            if op == "//" and atom.op == "//" and not quot.terms and quot.const == 0:
                return _divmod("//", inner, int(atom.b.value) * d, ranges)
    if op == "%":  # the divisible part vanishes under modulo
        return _atom(Binary("%", from_affine(rem), const(d, a.dtype), a.dtype))
    if not rem.terms and rem.const == 0:
        return quot
    return quot.plus(_atom(Binary("//", from_affine(rem), const(d, a.dtype), a.dtype)))


def _merge_divmod(a: Affine) -> Affine:
    """k*d*(x // d) + k*(x % d) -> k*x (what a fused loop's bindings flatten back to)."""
    for kk, (atom, c) in list(a.terms.items()):
        if kk not in a.terms or not (
            isinstance(atom, Binary) and atom.op == "%" and isinstance(atom.b, Const)
        ):
            continue
        d = int(atom.b.value)
        div_key = key(Binary("//", atom.a, atom.b, atom.dtype))
        if div_key in a.terms and a.terms[div_key][1] == c * d:
            terms = dict(a.terms)
            del terms[kk], terms[div_key]
            merged = Affine(terms, a.const, a.dtype)
            inner = to_affine(atom.a, {}).scaled(c)
            return _merge_divmod(merged.plus(inner))
    return a


def _order(item: tuple[tuple, tuple[Expr, int]]) -> tuple:
    atom = item[1][0]
    return (0, atom.uid) if isinstance(atom, Var) else (1, repr(item[0]))


def from_affine(a: Affine) -> Expr:
    out: Expr | None = None
    for _, (atom, c) in sorted(a.terms.items(), key=_order):
        if c == 1:
            term = atom
        elif c == -1 and out is not None:
            out = Binary("-", out, atom, a.dtype)
            continue
        else:
            term = Binary("*", const(c, a.dtype), atom, a.dtype) if c != 1 else atom
        out = term if out is None else Binary("+", out, term, a.dtype)
    if out is None:
        return const(a.const, a.dtype)
    if a.const > 0:
        return Binary("+", out, const(a.const, a.dtype), a.dtype)
    if a.const < 0:
        return Binary("-", out, const(-a.const, a.dtype), a.dtype)
    return out


# ----------------------------------------------------------------- simplify
def _fold_float(op: str, x: float, y: float) -> float | None:
    try:
        return {
            "+": x + y,
            "-": x - y,
            "*": x * y,
            "/": x / y if y else None,
            "min": min(x, y),
            "max": max(x, y),
        }.get(op)
    except (OverflowError, ZeroDivisionError):
        return None


def simplify(e: Expr, ranges: Ranges | None = None) -> Expr:
    """Simplify ``e``; integer sub-expressions use the affine normal form under ``ranges``."""
    ranges = ranges or {}
    if dtypes.is_int(e.dtype) and isinstance(e, (Binary, Var, Const)):
        if isinstance(e, Binary) and e.op in ("/", "pow"):
            pass  # truncating division / pow are not index arithmetic
        else:
            return from_affine(to_affine(e, ranges))
    kids = [simplify(c, ranges) for c in children(e)]
    e = rebuild(e, kids)
    if isinstance(e, Binary):
        a, b = e.a, e.b
        if isinstance(a, Const) and isinstance(b, Const) and dtypes.is_float(e.dtype):
            v = _fold_float(e.op, float(a.value), float(b.value))
            if v is not None:
                return const(v, e.dtype)
        if dtypes.is_float(e.dtype):
            if e.op == "*" and isinstance(b, Const) and b.value == 1.0:
                return a
            if e.op == "*" and isinstance(a, Const) and a.value == 1.0:
                return b
            if e.op in ("+", "-") and isinstance(b, Const) and b.value == 0.0:
                return a
            if e.op == "/" and isinstance(b, Const) and b.value == 1.0:
                return a
        return e
    if isinstance(e, Compare):
        if dtypes.is_int(e.a.dtype):
            diff = to_affine(e.a, ranges).plus(to_affine(e.b, ranges), -1)
            r = affine_bound(diff, ranges)
            if r is not None:
                lo, hi = r
                decided = {
                    "<": (hi < 0, lo >= 0),
                    "<=": (hi <= 0, lo > 0),
                    ">": (lo > 0, hi <= 0),
                    ">=": (lo >= 0, hi < 0),
                    "==": (lo == hi == 0, lo > 0 or hi < 0),
                    "!=": (lo > 0 or hi < 0, lo == hi == 0),
                }[e.op]
                if decided[0]:
                    return const(True)
                if decided[1]:
                    return const(False)
        return e
    if isinstance(e, Logical):
        a, b = e.a, e.b
        if e.op == "not":
            return const(not a.value) if isinstance(a, Const) else e
        if isinstance(a, Const):
            if e.op == "and":
                return b if a.value else const(False)  # type: ignore[return-value]
            return const(True) if a.value else b  # type: ignore[return-value]
        if isinstance(b, Const):
            if e.op == "and":
                return a if b.value else const(False)
            return const(True) if b.value else a
        return e
    if isinstance(e, Select) and isinstance(e.cond, Const):
        return e.t if e.cond.value else e.f
    if isinstance(e, Cast) and isinstance(e.value, Const):
        return const(e.value.value, e.dtype)
    if isinstance(e, Call) and e.name == "neg" and isinstance(e.args[0], Const):
        return const(-e.args[0].value, e.dtype)
    return e


def linear_coeff(e: Expr, var: Var, ranges: Ranges | None = None) -> int | None:
    """Coefficient of ``var`` in ``e`` if ``e`` is affine in ``var`` (var appears only linearly)."""
    a = to_affine(e, ranges or {})
    coeff = 0
    for atom, c in a.terms.values():
        if atom is var:
            coeff += c
        elif any(x is var for x in _walk_vars(atom)):
            return None
    return coeff


def _walk_vars(e: Expr):
    from compiler.loopir.expr import walk

    return (x for x in walk(e) if isinstance(x, Var))


def flat_index(buf: Buffer, indices: Sequence[Expr], ranges: Ranges | None = None) -> Expr:
    """The row-major flat index of ``buf[indices]``, simplified under ``ranges`` (a CompileError when the
    number of indices is not the buffer's rank)."""
    if len(indices) != len(buf.shape):
        raise CompileError(
            f"access to {buf.name} has {len(indices)} indices, the buffer has rank {len(buf.shape)}"
        )
    return simplify(flat_expr(buf, indices), ranges)


def flat_expr(buf: Buffer, indices: Sequence[Expr]) -> Expr:
    """``sum(index * stride)`` over the dimensions of ``buf``, not simplified."""
    flat: Expr = const(0)
    for idx, stride in zip(indices, buf.strides):
        flat = flat + idx * stride if stride != 1 else flat + idx
    return flat
