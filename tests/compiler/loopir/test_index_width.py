"""The index-width check's one-pass bounds: on random integer expressions (sums, products, floor division,
modulo, min/max, selects, casts, loads) it decides exactly what bounding every sub-expression on its own
with ``simplify.bound`` decides, and a kernel with such an index is found needing 64 bits iff it does."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from compiler.loopir import simplify as simp
from compiler.loopir.expr import Binary, Cast, Compare, Expr, Load, Select, Var, const, walk
from compiler.loopir.index_width import INT32_MAX, INT32_MIN, _bound_and_check, _overflows, index_overflow
from compiler.loopir.stmt import Buffer, BufferStore, For, PrimFunc

VARS = [Var("i"), Var("j"), Var("k")]
EXTENTS = {"i": 7, "j": 50_000, "k": 1 << 20}
TABLE = Buffer("table", (64,), "int32")


def _exprs() -> st.SearchStrategy[Expr]:
    leaves = st.one_of(
        st.sampled_from(VARS),
        st.integers(-(1 << 33), 1 << 33).map(lambda v: const(v, "int32")),
        st.integers(-4, 40).map(lambda v: const(v, "int32")),
    )

    def grow(inner: st.SearchStrategy[Expr]) -> st.SearchStrategy[Expr]:
        ops = st.sampled_from(["+", "-", "*", "//", "%", "min", "max"])
        return st.one_of(
            st.builds(lambda op, a, b: Binary(op, a, b, "int32"), ops, inner, inner),
            st.builds(lambda a, b, c, d: Select(Compare("<", a, b, "bool"), c, d, "int32"), *[inner] * 4),
            inner.map(lambda a: Cast(a, "int32")),
            inner.map(lambda a: Load(TABLE, (a,))),
        )

    return st.recursive(leaves, grow, max_leaves=12)


def _ranges() -> dict[Var, tuple[int, int]]:
    return {v: (0, EXTENTS[v.name] - 1) for v in VARS}


def _walk_and_bound(e: Expr, ranges: dict[Var, tuple[int, int]]) -> bool:
    """The reference: some scalar integer sub-expression's own bounds leave int32."""
    for x in walk(e):
        if x.dtype in ("int32", "int64"):
            r = simp.bound(x, ranges)
            if r is not None and (r[0] < INT32_MIN or r[1] > INT32_MAX):
                return True
    return False


@settings(max_examples=300, deadline=None)
@given(_exprs())
def test_one_pass_bounds_decide_what_bounding_each_sub_expression_decides(e):
    assert _overflows(e, _ranges(), None) == _walk_and_bound(e, _ranges())
    for x in walk(e):  # and every node's bounds are simplify.bound's
        assert _bound_and_check(x, _ranges(), None)[0] == simp.bound(x, _ranges()), x


@settings(max_examples=100, deadline=None)
@given(_exprs())
def test_a_kernel_indexed_by_the_expression_needs_64_bits_when_a_sub_expression_overflows(e):
    out = Buffer("out", (8,), "int32")
    i, j, k = VARS
    body = BufferStore(out, (const(0),), Load(TABLE, (const(0),)) + e)
    func = PrimFunc("k", [TABLE, out], For(i, 7, For(j, 50_000, For(k, 1 << 20, body))), 1)
    reason = index_overflow(func)
    loads = [x for x in walk(e) if isinstance(x, Load)]
    # a load's own flat index is its index expression (stride 1), checked raw and simplified
    expected = _walk_and_bound(e, _ranges()) or any(
        _walk_and_bound(simp.simplify(x.indices[0], _ranges()), _ranges()) for x in loads
    )
    assert (reason is not None) == expected, reason
    if reason is not None:
        assert reason.startswith("kernel 'k': ")
