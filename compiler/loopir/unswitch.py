"""Loop unswitching of edge guards: a micro-kernel run once guarded and once not.

A tiled loop nest whose tiles do not divide the extent guards each row of its register tile
(``if (base + r < M)``), and lowering places those guards at the statements they protect, inside the
reduction loop: every iteration of every tile tests them, and the compiler keeps one guarded branch per
row instead of a straight run of vector FMAs (on a Xeon, [100, 512] x [512, 512] ran about 3x slower per
row than [96, 512] x [512, 512]). :func:`unswitch_guards` versions the body of the loop whose variable
the guards depend on::

    for t { S }   ->   for t { if (g1 && ... && gn) S[g1..gn := true] else S }

where g1..gn are the guard conjuncts found inside a loop nested in S that depend on ``t`` and on no
variable bound inside S (nor on memory): they are invariant over S, so the fast copy drops them and the
guarded copy runs only for the edge tiles. Innermost loops first; a copy already versioned is not
versioned again for the same guards (their variables are bound inside the outer bodies).
"""

from __future__ import annotations

from compiler.loopir.expr import Expr, Load, Var, conjuncts, free_vars, logical_and, walk
from compiler.loopir.simplify import key
from compiler.loopir.stmt import For, IfThenElse, LetStmt, Stmt, stmt_children, walk_stmts
from compiler.loopir.visitor import StmtMutator, with_body


def _bound_inside(s: Stmt) -> set[Var]:
    return {x.var for x in walk_stmts(s) if isinstance(x, (For, LetStmt))}


def _invariant_guards(loop: For) -> list[Expr]:
    """The guard conjuncts of ``if`` statements inside a loop nested in ``loop``'s body that depend on
    ``loop.var``, on no variable bound inside the body and on no memory, deduplicated in order."""
    inner = _bound_inside(loop.body)
    found: dict[tuple, Expr] = {}

    def collect(s: Stmt, in_loop: bool) -> None:
        if isinstance(s, IfThenElse) and s.else_ is None and in_loop:
            for c in conjuncts(s.cond):
                vs = free_vars(c)
                if loop.var in vs and not vs & inner and not any(isinstance(x, Load) for x in walk(c)):
                    found.setdefault(key(c), c)
        for c in stmt_children(s):
            collect(c, in_loop or isinstance(s, For))

    collect(loop.body, False)
    return list(found.values())


class _Assume(StmtMutator):
    """The statement with the given conjuncts known true: ``if`` conditions lose them."""

    def __init__(self, known: list[Expr]) -> None:
        self.known = {key(c) for c in known}

    def visit_IfThenElse(self, s: IfThenElse) -> Stmt:
        then = self.visit_stmt(s.then)
        else_ = self.visit_stmt(s.else_) if s.else_ is not None else None
        rest = [c for c in conjuncts(s.cond) if key(c) not in self.known]
        if not rest:
            return then
        return IfThenElse(logical_and(*rest), then, else_)


class _Unswitch(StmtMutator):
    def visit_For(self, s: For) -> Stmt:
        loop = with_body(s, self.visit_stmt(s.body))
        assert isinstance(loop, For)
        if loop.kind == "vectorized":
            return loop
        guards = _invariant_guards(loop)
        if not guards:
            return loop
        fast = _Assume(guards).visit_stmt(loop.body)
        return with_body(loop, IfThenElse(logical_and(*guards), fast, loop.body))


def unswitch_guards(body: Stmt) -> Stmt:
    """``body`` with every loop whose nested loops test invariant edge guards versioned (module doc)."""
    return _Unswitch().visit_stmt(body)
