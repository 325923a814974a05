"""Loop primitives: split, fuse, reorder, parallel, vectorize, unroll, bind."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from compiler.errors import ScheduleError
from compiler.loopir import analysis as A
from compiler.loopir.expr import (
    Expr,
    Var,
    const,
    free_vars,
)
from compiler.loopir.sched_base import (
    THREAD_TAGS,
    ScheduleBase,
)
from compiler.loopir.simplify import simplify
from compiler.loopir.stmt import (
    For,
    walk_stmts,
)


class LoopPrimitives(ScheduleBase):
    """Loop primitives."""

    def split(self, loop: For, factors: Sequence[int | None]) -> list[For]:
        """Split ``loop`` into nested loops of the given extents (one may be None: inferred). When the
        product exceeds the extent, blocks under the loop get a predicate guarding the tail."""
        self._check_loop(loop)
        factors = list(factors)
        if factors.count(None) > 1 or not factors:
            raise ScheduleError(f"split of loop {loop.var.name}: give all factors or all but one")
        if any(f is not None and (not isinstance(f, int) or f < 1) for f in factors):
            raise ScheduleError(
                f"split of loop {loop.var.name}: factors must be positive integers, got {factors}"
            )
        known = math.prod(f for f in factors if f is not None)
        if None in factors:
            factors[factors.index(None)] = -(-loop.extent // known)
        total = math.prod(factors)  # type: ignore[arg-type]
        if total < loop.extent:
            raise ScheduleError(
                f"split of loop {loop.var.name} (extent {loop.extent}) by {factors}: "
                f"product {total} is too small"
            )
        new_vars = [Var(f"{loop.var.name}_{k}") for k in range(len(factors))]
        fused: Expr = const(0)
        for v, f in zip(new_vars, factors):
            fused = fused * f + v  # type: ignore[operator]
        fused = simplify(fused)
        pred = None if total == loop.extent else fused.lt(loop.extent)
        self._subst_under(loop.body, {loop.var: fused}, pred)
        body = loop.body
        loops: list[For] = []
        for v, f in reversed(list(zip(new_vars, factors))):
            body = For(v, f, body)  # type: ignore[arg-type]
            loops.append(body)
        A.replace_child(self._parent(loop), loop, body)
        self._log(f"split({loop.var.name}, factors={factors}) -> [{', '.join(v.name for v in new_vars)}]")
        return list(reversed(loops))

    def fuse(self, *loops: For) -> For:
        """Fuse directly nested loops (each the only statement in the previous one) into one."""
        if len(loops) < 2:
            raise ScheduleError("fuse needs at least two loops")
        for outer, inner in itertools.pairwise(loops):
            self._check_loop(outer)
            if outer.body is not inner:
                raise ScheduleError(
                    f"fuse: loop {inner.var.name} is not the only statement in loop {outer.var.name}"
                )
        extent = math.prod(lp.extent for lp in loops)
        f = Var("_".join(lp.var.name for lp in loops) + "_f")
        mapping: dict[Var, Expr] = {}
        stride = 1
        for lp in reversed(loops):
            term = f // stride if stride > 1 else f
            mapping[lp.var] = term % lp.extent if lp is not loops[0] else term
            stride *= lp.extent
        ranges = {f: (0, extent - 1)}
        mapping = {k: simplify(v, ranges) for k, v in mapping.items()}
        self._subst_under(loops[-1].body, mapping)
        new = For(f, extent, loops[-1].body)
        A.replace_child(self._parent(loops[0]), loops[0], new)
        self._log(f"fuse({', '.join(lp.var.name for lp in loops)}) -> {f.name}")
        return new

    def reorder(self, *loops: For) -> None:
        """Permute loops of one perfectly nested chain into the given order (others keep their place)."""
        if len(set(map(id, loops))) != len(loops):
            raise ScheduleError("reorder: a loop is given twice")
        for lp in loops:
            self._check_loop(lp)
        anc = {id(lp): self._ancestors(lp) or [] for lp in loops}
        chain_order = sorted(loops, key=lambda lp: len(anc[id(lp)]))
        outer, innermost = chain_order[0], chain_order[-1]
        chain: list[For] = [outer]
        while chain[-1] is not innermost:
            body = chain[-1].body
            if not isinstance(body, For):
                names = ", ".join(lp.var.name for lp in loops)
                raise ScheduleError(
                    f"reorder({names}): loop {chain[-1].var.name} does not contain exactly one loop; "
                    "the loops must form a perfect nest"
                )
            chain.append(body)
        given = {id(lp) for lp in loops}
        if not all(id(lp) in {id(c) for c in chain} for lp in loops):
            raise ScheduleError("reorder: the loops are not nested in one chain")
        slots = [k for k, c in enumerate(chain) if id(c) in given]
        new_chain = list(chain)
        for k, lp in zip(slots, loops):
            new_chain[k] = lp
        parent = self._parent(chain[0])
        inner_body = chain[-1].body
        for k in range(len(new_chain) - 1, -1, -1):
            new_chain[k].body = inner_body if k == len(new_chain) - 1 else new_chain[k + 1]
        A.replace_child(parent, chain[0], new_chain[0])
        self._log(f"reorder({', '.join(lp.var.name for lp in loops)})")

    def _check_data_parallel(self, loop: For, what: str) -> None:
        for b in A.blocks_under(loop):
            for iv, e in zip(b.iter_vars, b.bindings):
                if iv.kind == "R" and loop.var in free_vars(e):
                    raise ScheduleError(
                        f"cannot {what} loop {loop.var.name}: it drives reduction variable {iv.var.name} of "
                        f"block {b.name} (use rfactor first)"
                    )

    def parallel(self, loop: For) -> None:
        self._check_loop(loop)
        self._check_data_parallel(loop, "parallelize")
        loop.kind = "parallel"
        self._log(f"parallel({loop.var.name})")

    def vectorize(self, loop: For) -> None:
        self._check_loop(loop)
        self._check_data_parallel(loop, "vectorize")
        if any(isinstance(s, For) for s in walk_stmts(loop.body)):
            raise ScheduleError(f"cannot vectorize loop {loop.var.name}: it is not innermost")
        loop.kind = "vectorized"
        self._log(f"vectorize({loop.var.name})")

    def unroll(self, loop: For) -> None:
        self._check_loop(loop)
        loop.kind = "unrolled"
        self._log(f"unroll({loop.var.name})")

    def bind(self, loop: For, thread: str, allow_reduce: bool = False) -> None:
        """Bind a loop to a CUDA thread axis. Binding a reduction loop to threadIdx needs a cross-thread
        reduction (``allow_reduce``), which the CUDA lowering implements."""
        self._check_loop(loop)
        if thread not in THREAD_TAGS:
            raise ScheduleError(f"bind: unknown thread axis '{thread}'; use one of {', '.join(THREAD_TAGS)}")
        if not (allow_reduce and thread.startswith("threadIdx")):
            self._check_data_parallel(loop, f"bind to {thread}")
        loop.kind, loop.thread = "thread", thread
        self._log(f'bind({loop.var.name}, "{thread}")')
