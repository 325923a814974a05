"""Generic traversal of loop IR: visitors that look and mutators that rebuild (TVM's ``StmtVisitor`` /
``StmtMutator`` / ``StmtExprMutator``).

A visitor's ``visit_stmt(s)`` dispatches on the node type to ``visit_<Type>`` (``visit_For``,
``visit_BufferStore`` ...) when the subclass defines one, else to ``generic_visit_stmt``, which visits the
node's expressions (``visit_expr``) and then its child statements. Expressions dispatch the same way
(``visit_Load`` ...; :class:`~compiler.loopir.expr.ExprVisitor`). An override calls
``self.generic_visit_stmt(s)`` to keep descending.

A mutator's methods return the replacement node; ``generic_visit_stmt`` mutates the expressions and
children and rebuilds the node only when one of them changed, so an untouched subtree comes back as the
same object. Which children a node has is known in one place: ``stmt_children`` / ``stmt_exprs`` /
``rebuild_stmt`` (``compiler.loopir.stmt``) and ``children`` / ``rebuild`` (``compiler.loopir.expr``).

``StmtVisitor`` and ``StmtMutator`` leave expressions alone (``visit_expr`` does nothing / returns its
argument: override it to act on every top-level expression); ``StmtExprVisitor`` and ``StmtExprMutator``
descend into expressions too. The functions at the end are the common passes built on them.
"""

from __future__ import annotations

from collections.abc import Callable

from compiler.loopir.expr import Expr, ExprMutator, ExprVisitor, Load, Var, substitute, transform
from compiler.loopir.stmt import BufferStore, Stmt, rebuild_stmt, stmt_children, stmt_exprs

__all__ = [
    "ExprMutator",
    "ExprVisitor",
    "StmtExprMutator",
    "StmtExprVisitor",
    "StmtMutator",
    "StmtVisitor",
    "map_stores",
    "post_order",
    "replace_loads",
    "rewrite_exprs",
    "substitute_stmt",
    "with_body",
]


class StmtVisitor:
    """Walks a statement tree (see the module docstring); expressions are not visited unless
    ``visit_expr`` is overridden."""

    def visit_stmt(self, s: Stmt) -> None:
        method = getattr(self, "visit_" + type(s).__name__, None)
        if method is None:
            self.generic_visit_stmt(s)
        else:
            method(s)

    def generic_visit_stmt(self, s: Stmt) -> None:
        for e in stmt_exprs(s):
            self.visit_expr(e)
        for c in stmt_children(s):
            self.visit_stmt(c)

    def visit_expr(self, e: Expr) -> None:
        return None


class StmtExprVisitor(StmtVisitor, ExprVisitor):
    """A :class:`StmtVisitor` that also walks every expression (``visit_Load`` & co. apply)."""

    visit_expr = ExprVisitor.visit_expr


class StmtMutator:
    """Rewrites a statement tree (see the module docstring); expressions are kept unless ``visit_expr``
    is overridden."""

    def visit_stmt(self, s: Stmt) -> Stmt:
        method = getattr(self, "visit_" + type(s).__name__, None)
        return self.generic_visit_stmt(s) if method is None else method(s)

    def generic_visit_stmt(self, s: Stmt) -> Stmt:
        exprs = [self.visit_expr(e) for e in stmt_exprs(s)]
        kids = [self.visit_stmt(c) for c in stmt_children(s)]
        return rebuild_stmt(s, kids, exprs)

    def visit_expr(self, e: Expr) -> Expr:
        return e


class StmtExprMutator(StmtMutator, ExprMutator):
    """A :class:`StmtMutator` that also rewrites every expression (``visit_Load`` & co. apply)."""

    visit_expr = ExprMutator.visit_expr


def with_body(s: Stmt, body: Stmt) -> Stmt:
    """A statement with one child (``For``, ``Allocate``) with that child replaced (``s`` if unchanged)."""
    return rebuild_stmt(s, [body], stmt_exprs(s))


# ------------------------------------------------------------ common passes
class _PostOrderStmts(StmtMutator):
    def __init__(self, fn: Callable[[Stmt], Stmt | None]) -> None:
        self.fn = fn

    def visit_stmt(self, s: Stmt) -> Stmt:
        s2 = self.generic_visit_stmt(s)
        out = self.fn(s2)
        return s2 if out is None else out


def post_order(s: Stmt, fn: Callable[[Stmt], Stmt | None]) -> Stmt:
    """Bottom-up statement rewrite: ``fn`` sees each node with its children already rewritten and may
    return a replacement (or None to keep it)."""
    return _PostOrderStmts(fn).visit_stmt(s)


class _MapExprs(StmtMutator):
    def __init__(self, fn: Callable[[Expr], Expr]) -> None:
        self.visit_expr = fn  # type: ignore[method-assign]


def rewrite_exprs(s: Stmt, fn: Callable[[Expr], Expr | None]) -> Stmt:
    """Apply ``transform(expr, fn)`` (a post-order expression rewrite) to every expression under ``s``."""
    return _MapExprs(lambda e: transform(e, fn)).visit_stmt(s)


def substitute_stmt(s: Stmt, mapping: dict[Var, Expr]) -> Stmt:
    """``s`` with the variables of ``mapping`` replaced in every expression."""
    if not mapping:
        return s
    return _MapExprs(lambda e: substitute(e, mapping)).visit_stmt(s)


def replace_loads(s: Stmt, fn: Callable[[Load], Expr | None]) -> Stmt:
    """Every load under ``s`` rewritten by ``fn`` (None keeps it)."""
    return rewrite_exprs(s, lambda x: fn(x) if isinstance(x, Load) else None)


class _MapStores(StmtMutator):
    def __init__(self, fn: Callable[[BufferStore], Stmt]) -> None:
        self.visit_BufferStore = fn  # type: ignore[assignment]


def map_stores(s: Stmt, fn: Callable[[BufferStore], Stmt]) -> Stmt:
    """Every store under ``s`` replaced by ``fn(store)``."""
    return _MapStores(fn).visit_stmt(s)
