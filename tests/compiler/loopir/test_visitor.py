"""The generic loop-IR visitors and mutators (compiler/loopir/visitor.py)."""

from __future__ import annotations

import dataclasses

import pytest

from compiler.loopir.expr import (
    Binary,
    Const,
    ExprMutator,
    ExprVisitor,
    Load,
    Var,
    const,
    substitute,
    transform,
)
from compiler.loopir.stmt import (
    Allocate,
    Barrier,
    Block,
    Buffer,
    BufferStore,
    Evaluate,
    For,
    IfThenElse,
    IterVar,
    SeqStmt,
    Stmt,
    rebuild_stmt,
    stmt_children,
    stmt_exprs,
    walk_stmts,
)
from compiler.loopir.visitor import (
    StmtExprMutator,
    StmtExprVisitor,
    StmtMutator,
    StmtVisitor,
    map_stores,
    post_order,
    replace_loads,
    rewrite_exprs,
    substitute_stmt,
    with_body,
)

F32 = "float32"


def _nest() -> tuple[Stmt, Var, Var, Buffer, Buffer]:
    """for i in 4: for j in 8 (vectorized): if (i < 3) y[i, j] = x[i, j] + 1; barrier"""
    i, j = Var("i"), Var("j")
    x, y = Buffer("x", (4, 8), F32), Buffer("y", (4, 8), F32)
    store = BufferStore(y, (i, j), Load(x, (i, j)) + const(1.0, F32))
    inner = For(j, 8, IfThenElse(i.lt(3), store), "vectorized", annotations={"tag": 1})
    return SeqStmt([For(i, 4, inner), Barrier()]), i, j, x, y


def test_identity_mutators_return_the_same_tree() -> None:
    s, *_ = _nest()
    assert StmtMutator().visit_stmt(s) is s
    assert StmtExprMutator().visit_stmt(s) is s
    assert rewrite_exprs(s, lambda e: None) is s
    assert substitute_stmt(s, {Var("unused"): const(0)}) is s


def test_mutator_rebuilds_only_the_changed_path() -> None:
    s, _, j, _, _ = _nest()
    out = substitute_stmt(s, {j: j + 1})
    assert out is not s and isinstance(out, SeqStmt)
    assert out.stmts[1] is s.stmts[1]  # the barrier is untouched
    outer, inner = out.stmts[0], s.stmts[0].body  # type: ignore[attr-defined]
    assert isinstance(outer, For) and outer is not s.stmts[0]
    new_inner = outer.body
    assert isinstance(new_inner, For) and new_inner.kind == "vectorized"
    assert new_inner.annotations == {"tag": 1} and new_inner.annotations is not inner.annotations
    store = new_inner.body.then  # type: ignore[attr-defined]
    assert repr(store) == "y[i, (j + 1)] = (x[i, (j + 1)] + 1.0f)"
    assert new_inner.body.cond is inner.body.cond  # type: ignore[attr-defined]  # no j: kept as is


def test_visitor_dispatches_by_node_type_and_sees_expressions() -> None:
    s, *_ = _nest()
    seen: list[str] = []

    class Names(StmtExprVisitor):
        def visit_For(self, f: For) -> None:
            seen.append(f"for {f.var.name}")
            self.generic_visit_stmt(f)

        def visit_Load(self, e: Load) -> None:
            seen.append(f"load {e.buffer.name}")
            self.generic_visit_expr(e)

        def visit_Var(self, e: Var) -> None:
            seen.append(e.name)

    Names().visit_stmt(s)
    assert seen == ["for i", "for j", "i", "i", "j", "load x", "i", "j"]

    stmts_only: list[str] = []

    class Kinds(StmtVisitor):
        def visit_expr(self, e: object) -> None:
            raise AssertionError("a StmtVisitor leaves expressions alone unless asked")

        def visit_Barrier(self, b: Barrier) -> None:
            stmts_only.append("barrier")

    with pytest.raises(AssertionError):
        Kinds().visit_stmt(s)
    stmts_only.clear()

    class Stmts(StmtVisitor):
        def visit_Barrier(self, b: Barrier) -> None:
            stmts_only.append("barrier")

    Stmts().visit_stmt(s)
    assert stmts_only == ["barrier"]


def test_seq_rebuild_flattens_and_drops_empty_sequences() -> None:
    s, *_ = _nest()

    class DropBarriers(StmtMutator):
        def visit_Barrier(self, b: Barrier) -> Stmt:
            return SeqStmt([])

        def visit_For(self, f: For) -> Stmt:
            if f.kind == "vectorized":
                return SeqStmt([Evaluate(const(1)), Evaluate(const(2))])
            return self.generic_visit_stmt(f)

    loop = DropBarriers().visit_stmt(s)  # a sequence left with one statement is that statement
    assert isinstance(loop, For) and isinstance(loop.body, SeqStmt) and len(loop.body.stmts) == 2


def test_children_description_covers_every_statement() -> None:
    i = Var("i")
    buf = Buffer("b", (4,), F32)
    store = BufferStore(buf, (i,), const(0.0, F32))
    blk = Block("blk", [IterVar(Var("v"), 4)], [i], store, init=Evaluate(const(0)), predicate=i.lt(2))
    assert stmt_children(blk) == [blk.init, store]
    assert stmt_exprs(blk) == [i, blk.predicate]
    assert stmt_exprs(store) == [i, store.value]
    other = BufferStore(buf, (i,), const(1.0, F32))
    new = rebuild_stmt(blk, [blk.init, other], [i + 1, blk.predicate])  # type: ignore[list-item]
    assert isinstance(new, Block) and new.body is other and repr(new.bindings[0]) == "(i + 1)"
    assert new.predicate is blk.predicate and new.init is blk.init
    alloc = Allocate(buf, store)
    assert with_body(alloc, store) is alloc
    swapped = with_body(alloc, other)
    assert isinstance(swapped, Allocate) and swapped.body is other and swapped.buffer is buf


def test_post_order_map_stores_and_replace_loads() -> None:
    s, _, _, x, _ = _nest()
    z = Buffer("z", (4, 8), F32)
    out = replace_loads(s, lambda ld: Load(z, ld.indices) if ld.buffer is x else None)
    assert "z[i, j]" in repr(out) and "x[" not in repr(out)
    seen = []
    out = map_stores(s, lambda st: seen.append(st.buffer.name) or Evaluate(st.value))
    assert seen == ["y"] and not any(isinstance(x_, BufferStore) for x_ in walk_stmts(out))

    def unroll(st: Stmt) -> Stmt | None:  # children first: the inner loop is gone when the outer is seen
        if isinstance(st, For):
            assert not any(isinstance(c, For) for c in walk_stmts(st.body))
            return SeqStmt([substitute_stmt(st.body, {st.var: const(k)}) for k in range(2)])
        return None

    out = post_order(s, unroll)
    assert not any(isinstance(c, For) for c in walk_stmts(out))


def test_expression_helpers_go_through_the_mutator() -> None:
    a, b = Var("a"), Var("b")
    e = (a + b) * 2
    assert substitute(e, {}) is e and substitute(e, {Var("c"): const(1)}) is e
    out = substitute(e, {a: const(3)})
    assert repr(out) == "((3 + b) * 2)" and out.b is e.b  # type: ignore[attr-defined]
    order: list[str] = []
    transform(e, lambda x: order.append(repr(x)) or None)
    assert order == ["a", "b", "(a + b)", "2", "((a + b) * 2)"]

    class Count(ExprVisitor):
        n = 0

        def visit_Const(self, c: Const) -> None:
            self.n += 1

    counter = Count()
    counter.visit_expr(e)
    assert counter.n == 1

    class Swap(ExprMutator):
        def visit_Binary(self, x: Binary) -> Binary:
            y = self.generic_visit_expr(x)
            return Binary(y.op, y.b, y.a, y.dtype) if y.op == "+" else y  # type: ignore[attr-defined]

    assert repr(Swap().visit_expr(e)) == "((b + a) * 2)"


def test_every_expression_node_lists_and_rebuilds_its_children() -> None:
    """children() and rebuild() are tables by node type: a node type missing from them would look like a
    leaf to every traversal. Each node type defined in loopir.expr is in both (or is a leaf), and rebuilding
    with new children keeps every other field."""
    from compiler.loopir import expr as E
    from compiler.loopir.stmt import IterVar as StmtIterVar

    a, b, c = Var("a"), Var("b"), Var("c")
    buf = Buffer("buf", (4,), F32)
    samples = [
        E.Binary("+", a, b, "int32"),
        E.Compare("<", a, b),
        E.Logical("and", a, b),
        E.Logical("not", a),
        E.Select(a, b, c, "int32"),
        E.Cast(a, F32),
        E.Call("exp", (a,), F32),
        E.Load(buf, (a,)),
        E.Reduce("sum", a, (StmtIterVar(c, 4, "R"),), F32),
        E.Ramp(a, b, 4),
        E.Broadcast(a, 4),
        E.MakeVector((a, b)),
        E.ExtractLane(a, 2),
    ]
    leaves = {Var, Const}
    assert {type(s) for s in samples} | leaves == set(E.Expr.__subclasses__())
    for s in samples:
        kids = list(E.children(s))
        assert kids and all(isinstance(k, E.Expr) for k in kids), s
        assert E.rebuild(s, kids) is s
        new = [const(i + 7) for i in range(len(kids))]
        out = E.rebuild(s, new)
        assert type(out) is type(s) and list(E.children(out)) == new
        for f in dataclasses.fields(s):  # the fields that are not children come through as they were
            v = getattr(s, f.name)
            whole = isinstance(v, tuple) and len(v) == len(kids) and all(a is b for a, b in zip(v, kids))
            if not (whole or any(v is k for k in kids)):
                assert getattr(out, f.name) is v or getattr(out, f.name) == v, (s, f.name)
    assert E.children(a) == () and E.rebuild(a, []) is a
