"""Schedule primitives over block-structured loop IR.

A :class:`Schedule` edits a :class:`PrimFunc` in place. Every primitive checks its legality and raises
:class:`ScheduleError` naming the block, loop or buffer at fault; every applied primitive is appended
to a printable trace. The primitives follow TVM TensorIR's semantics:

- loops: ``split``, ``fuse``, ``reorder``, ``parallel``, ``vectorize``, ``unroll``, ``bind``
- blocks: ``compute_inline``, ``reverse_compute_inline``, ``compute_at``, ``reverse_compute_at``,
  ``cache_read``, ``cache_write``, ``rfactor``, ``decompose_reduction``, ``set_scope``,
  ``transform_layout``

A reduction block's ``init`` runs when all of its reduce iteration variables are zero, so loops may be
reordered freely; ``decompose_reduction`` hoists the init into its own loop nest.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

from compiler.errors import ScheduleError
from compiler.loopir import analysis as A
from compiler.loopir.expr import (
    Binary,
    Const,
    Expr,
    IterVar,
    Load,
    Logical,
    Var,
    combine,
    const,
    free_vars,
    logical_and,
    replace_buffer_loads,
    substitute,
    walk,
)
from compiler.loopir.simplify import simplify
from compiler.loopir.stmt import (
    Block,
    Buffer,
    BufferStore,
    For,
    PrimFunc,
    SeqStmt,
    Stmt,
    seq,
    walk_stmts,
)

THREAD_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z")
_COMBINER_OF = {"+": "sum", "max": "max", "min": "min"}


class Schedule:
    """Apply schedule primitives to ``func`` (edited in place); ``trace`` records each step."""

    def __init__(self, func: PrimFunc) -> None:
        if not isinstance(func.body, Block):
            raise ScheduleError(f"function {func.name} has no root block; schedule a TE-lowered function")
        self.func = func
        self.root: Block = func.body
        if not isinstance(self.root.body, SeqStmt):
            self.root.body = SeqStmt([self.root.body])
        self.trace: list[str] = []

    # ----------------------------------------------------------- inspection
    def blocks(self) -> list[Block]:
        return A.blocks_under(self.root)

    def get_block(self, name: str) -> Block:
        for b in self.blocks():
            if b.name == name:
                return b
        raise ScheduleError(
            f"no block named '{name}' in {self.func.name}; blocks: {', '.join(b.name for b in self.blocks())}"
        )

    def get_loops(self, block: Block) -> list[For]:
        return [s for s in A.ancestors(self.root, block) if isinstance(s, For)]

    def producers(self, buffer: Buffer) -> list[Block]:
        return [b for b in self.blocks() if buffer in A.writes(b)]

    def consumers(self, buffer: Buffer) -> list[Block]:
        return [b for b in self.blocks() if buffer in A.reads(b)]

    def _log(self, text: str) -> None:
        self.trace.append(text)

    def show_trace(self) -> str:
        return "\n".join(self.trace)

    def _parent(self, node: Stmt) -> Stmt:
        p = A.parent_map(self.root).get(id(node))
        if p is None:
            raise ScheduleError(f"{_name(node)} is not part of function {self.func.name}")
        return p

    def _check_loop(self, loop: For) -> None:
        if not isinstance(loop, For):
            raise ScheduleError(f"expected a loop, got {type(loop).__name__}")
        self._parent(loop)

    def _subst_under(self, stmt: Stmt, mapping: dict[Var, Expr], extra_pred: Expr | None = None) -> None:
        for b in A.blocks_under(stmt) if not isinstance(stmt, Block) else [stmt]:
            b.bindings = [substitute(e, mapping) for e in b.bindings]
            if b.predicate is not None:
                b.predicate = substitute(b.predicate, mapping)
            if extra_pred is not None:
                b.predicate = extra_pred if b.predicate is None else Logical("and", b.predicate, extra_pred)

    # ----------------------------------------------------------------- loops
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
        anc = {id(lp): A.ancestors(self.root, lp) for lp in loops}
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

    # ---------------------------------------------------------------- blocks
    def _single_store(self, block: Block, what: str) -> BufferStore:
        stores = A.block_stores(block)
        if len(stores) != 1 or not isinstance(block.body, BufferStore):
            raise ScheduleError(f"{what}: block {block.name} must consist of a single store")
        return stores[0]

    def _is_param(self, buf: Buffer) -> bool:
        return any(p is buf for p in self.func.params)

    def _remove_nest(self, block: Block) -> None:
        """Remove ``block`` and every enclosing loop or sequence that would be left empty."""
        parents = A.parent_map(self.root)
        node: Stmt = block
        while True:
            parent = parents[id(node)]
            single_seq = (
                isinstance(parent, SeqStmt) and len(parent.stmts) == 1 and parent is not self.root.body
            )
            if isinstance(parent, For) or single_seq:
                node = parent
                continue
            break
        if not isinstance(parent, SeqStmt):
            raise ScheduleError(f"cannot remove block {block.name} from under a {type(parent).__name__}")
        A.replace_child(parent, node, None)

    def _nest_top(self, block: Block) -> Stmt:
        """The outermost loop containing only ``block`` (or the block itself)."""
        parents = A.parent_map(self.root)
        node: Stmt = block
        parent = parents[id(node)]
        while isinstance(parent, For) and parent.body is node:
            node = parent
            parent = parents[id(node)]
        return node

    def _top_level(self, node: Stmt) -> Stmt:
        """The statement directly under the root that contains ``node``."""
        anc = A.ancestors(self.root, node)
        chain = [*anc, node]
        i = next(k for k, s in enumerate(chain) if s is self.root.body)
        return chain[i + 1]

    def compute_inline(self, block: Block) -> None:
        """Inline an elementwise producer into every consumer and remove it."""
        st = self._single_store(block, "compute_inline")
        buf = st.buffer
        if block.is_reduction or block.init is not None:
            raise ScheduleError(f"compute_inline: block {block.name} is a reduction")
        ivars = [iv.var for iv in block.iter_vars]
        if len(st.indices) != len(ivars) or any(i is not v for i, v in zip(st.indices, ivars)):
            raise ScheduleError(
                f"compute_inline: block {block.name} does not store at its own iteration indices"
            )
        if self._is_param(buf):
            raise ScheduleError(f"compute_inline: block {block.name} writes function output {buf.name}")
        if len(self.producers(buf)) != 1:
            raise ScheduleError(f"compute_inline: buffer {buf.name} has more than one producer")
        if any(ld.buffer is buf for ld in walk(st.value) if isinstance(ld, Load)):
            raise ScheduleError(f"compute_inline: block {block.name} reads its own output")

        def inline(ld: Load) -> Expr | None:
            if ld.buffer is not buf:
                return None
            return substitute(st.value, dict(zip(ivars, ld.indices)))

        for b in self.consumers(buf):
            ranges = {iv.var: (0, iv.extent - 1) for iv in b.iter_vars}

            def inline_simplified(ld: Load, ranges=ranges) -> Expr | None:
                out = inline(ld)
                if out is None:
                    return None
                # index math substituted from reshapes/transposes collapses under the consumer's ranges
                return replace_buffer_loads(
                    out, lambda x: Load(x.buffer, tuple(simplify(i, ranges) for i in x.indices))
                )

            for s in walk_stmts(b):
                if isinstance(s, BufferStore):
                    s.value = replace_buffer_loads(s.value, inline_simplified)
                    s.indices = tuple(replace_buffer_loads(i, inline_simplified) for i in s.indices)
        self._remove_nest(block)
        self._drop_alloc(buf)
        self._log(f"compute_inline({block.name})")

    def _drop_alloc(self, buf: Buffer) -> None:
        self.root.alloc_buffers = [b for b in self.root.alloc_buffers if b is not buf]

    def reverse_compute_inline(self, block: Block) -> None:
        """Inline an elementwise consumer into its (elementwise) producer and remove it."""
        st = self._single_store(block, "reverse_compute_inline")
        if block.is_reduction:
            raise ScheduleError(f"reverse_compute_inline: block {block.name} is a reduction")
        ins = [b for b in A.reads(block) if not self._is_param(b)]
        if len(ins) != 1:
            raise ScheduleError(
                f"reverse_compute_inline: block {block.name} must read exactly one intermediate"
            )
        src = ins[0]
        prods = self.producers(src)
        if len(prods) != 1 or len(self.consumers(src)) != 1:
            raise ScheduleError(f"reverse_compute_inline: {src.name} must have one producer and one consumer")
        prod = prods[0]
        pst = self._single_store(prod, "reverse_compute_inline")
        if prod.is_reduction or prod.init is not None:
            raise ScheduleError(
                f"reverse_compute_inline: producer {prod.name} of block {block.name} is a reduction; "
                "use reverse_compute_at"
            )
        src_loads = [ld for ld in walk(st.value) if isinstance(ld, Load) and ld.buffer is src]
        ivars = [iv.var for iv in block.iter_vars]
        first = src_loads[0].indices
        if (
            any(not all(x is y for x, y in zip(ld.indices, first)) for ld in src_loads)
            or len(first) != len(ivars)
            or {id(i) for i in first} != {id(v) for v in ivars}
        ):
            raise ScheduleError(
                f"reverse_compute_inline: block {block.name} must read {src.name} once "
                "at its own iteration indices"
            )
        # consumer iteration var at position k of the load == producer's store index k
        mapping = {v: pst.indices[k] for k, v in enumerate(first)}  # type: ignore[misc]
        new_value = replace_buffer_loads(
            substitute(st.value, mapping), lambda ld: pst.value if ld.buffer is src else None
        )
        prod.body = BufferStore(st.buffer, tuple(substitute(i, mapping) for i in st.indices), new_value)
        self._remove_nest(block)
        self._drop_alloc(src)
        self._log(f"reverse_compute_inline({block.name})")

    def compute_at(self, block: Block, loop: For) -> None:
        """Move a producer under ``loop`` so it computes only the region its consumers there read."""
        self._check_loop(loop)
        st_bufs = A.writes(block)
        if len(st_bufs) != 1:
            raise ScheduleError(f"compute_at: block {block.name} must write one buffer")
        buf = st_bufs[0]
        self._check_identity_store(block, buf, "compute_at")
        consumers = [c for c in self.consumers(buf) if c is not block]
        if not consumers:
            raise ScheduleError(f"compute_at: {buf.name} written by block {block.name} has no consumer")
        loop_blocks = {id(b) for b in A.blocks_under(loop)}
        if id(block) in loop_blocks:
            raise ScheduleError(f"compute_at: block {block.name} is already inside loop {loop.var.name}")
        outside = [c.name for c in consumers if id(c) not in loop_blocks]
        if outside:
            raise ScheduleError(
                f"compute_at: {buf.name} is also read by block(s) {', '.join(outside)} "
                f"outside loop {loop.var.name}"
            )
        top = self._nest_top(block)
        if len(A.blocks_under(top)) + isinstance(top, Block) != 1:
            raise ScheduleError(f"compute_at: the loops of block {block.name} contain other blocks")
        outer_loops = [*self.get_loops(loop), loop]
        outer = A.loop_ranges(outer_loops)
        accesses, inner = [], {}
        for c in consumers:
            inner.update(A.loop_ranges(lp for lp in self.get_loops(c) if lp not in outer_loops))
            accesses += A.accesses_in_loop_vars(c, buf, "r")
        reg = iter(A.region(accesses, buf.shape, inner, outer))
        per_var = [next(reg) if iv.kind == "S" else (const(0), iv.extent) for iv in block.iter_vars]
        new_nest = self._region_nest(block, per_var)
        self._remove_nest(block)
        self._insert_in_loop(loop, new_nest, consumers, before=True)
        self._log(f"compute_at({block.name}, {loop.var.name})")

    def reverse_compute_at(self, block: Block, loop: For) -> None:
        """Move a consumer under ``loop`` so it handles exactly the region its producers there write.
        The consumer must read that buffer at a permutation of its own iteration variables; reduction
        variables of the consumer must cover their whole extent in that region."""
        self._check_loop(loop)
        ins = [b for b in A.reads(block) if self.producers(b)]
        loop_blocks = {id(b) for b in A.blocks_under(loop)}
        srcs = [b for b in ins if any(id(p) in loop_blocks for p in self.producers(b))]
        if len(srcs) != 1:
            raise ScheduleError(
                f"reverse_compute_at: block {block.name} must read exactly one buffer "
                f"produced in loop {loop.var.name}"
            )
        src = srcs[0]
        producers = self.producers(src)
        if any(id(p) not in loop_blocks for p in producers):
            raise ScheduleError(
                f"reverse_compute_at: {src.name} is also produced outside loop {loop.var.name}"
            )
        if id(block) in loop_blocks:
            raise ScheduleError(
                f"reverse_compute_at: block {block.name} is already inside loop {loop.var.name}"
            )
        src_loads = [ld for ld in A.block_loads(block) if ld.buffer is src]
        ivars = [iv.var for iv in block.iter_vars]
        first = src_loads[0].indices
        dim_of: dict[int, int] = {}
        for d, i in enumerate(first):
            if isinstance(i, Var) and i in ivars and i.uid not in dim_of:
                dim_of[i.uid] = d
        if (
            len(dim_of) != len(ivars)
            or len(first) != len(ivars)
            or any(any(x is not y for x, y in zip(ld.indices, first)) for ld in src_loads)
        ):
            raise ScheduleError(
                f"reverse_compute_at: block {block.name} must read {src.name} "
                "at a permutation of its iteration vars"
            )
        outer_loops = [*self.get_loops(loop), loop]
        outer = A.loop_ranges(outer_loops)
        accesses, inner = [], {}
        for p in producers:
            inner.update(A.loop_ranges(lp for lp in self.get_loops(p) if lp not in outer_loops))
            accesses += A.accesses_in_loop_vars(p, src, "w")
        reg = A.region(accesses, src.shape, inner, outer)
        per_var = []
        for iv in block.iter_vars:
            start, ext = reg[dim_of[iv.var.uid]]
            if iv.kind == "R" and ext != iv.extent:
                raise ScheduleError(
                    f"reverse_compute_at: reduction variable {iv.var.name} of block {block.name} "
                    "would see only "
                    f"part of {src.name} under loop {loop.var.name}"
                )
            per_var.append((start, ext))
        new_nest = self._region_nest(block, per_var)
        self._remove_nest(block)
        self._insert_in_loop(loop, new_nest, producers, before=False)
        self._log(f"reverse_compute_at({block.name}, {loop.var.name})")

    def _check_identity_store(self, block: Block, buf: Buffer, what: str) -> None:
        sp = [iv.var for iv in block.iter_vars if iv.kind == "S"]
        for st in A.block_stores(block):
            if len(st.indices) != len(sp) or any(i is not v for i, v in zip(st.indices, sp)):
                raise ScheduleError(
                    f"{what}: block {block.name} must store {buf.name} at its spatial iteration vars"
                )

    def _region_nest(self, block: Block, per_var: list[tuple[Expr, int]]) -> Stmt:
        """Rebuild ``block``'s loops so iteration variable k covers [start_k, start_k + extent_k)."""
        loops: list[tuple[Var, int]] = []
        bindings: list[Expr] = []
        preds: list[Expr] = []
        for d, (iv, (start, ext)) in enumerate(zip(block.iter_vars, per_var)):
            whole = isinstance(start, Const) and start.value == 0 and ext == iv.extent
            if ext == 1:
                value = start
            else:
                lv = Var(f"ax{d}" if iv.kind == "S" else f"{iv.var.name}_l")
                loops.append((lv, ext))
                value = start + lv if not (isinstance(start, Const) and start.value == 0) else lv
            bindings.append(simplify(value))
            if not whole:
                preds.append(value.ge(0))
                preds.append(value.lt(iv.extent))
        block.bindings = bindings
        block.predicate = logical_and(*preds) if preds else None
        stmt: Stmt = block
        for lv, ext in reversed(loops):
            stmt = For(lv, ext, stmt)
        return stmt

    def _insert_in_loop(self, loop: For, new: Stmt, anchors: list[Block], before: bool) -> None:
        body = loop.body if isinstance(loop.body, SeqStmt) else SeqStmt([loop.body])
        ids = {id(a) for a in anchors}
        hits = [
            k
            for k, s in enumerate(body.stmts)
            if id(s) in ids or any(id(b) in ids for b in A.blocks_under(s))
        ]
        pos = (hits[0] if hits else 0) if before else (hits[-1] + 1 if hits else len(body.stmts))
        body.stmts.insert(pos, new)
        loop.body = body

    def cache_read(self, block: Block, buffer: Buffer, scope: str) -> Block:
        """Read ``buffer`` in ``block`` through a copy in ``scope``; returns the copy block."""
        if buffer not in A.reads(block):
            raise ScheduleError(f"cache_read: block {block.name} does not read {buffer.name}")
        cache = Buffer(f"{buffer.name}_{scope}", buffer.shape, buffer.dtype, scope)
        copy = self._copy_block(f"{buffer.name}_{scope}", buffer, cache)
        for s in walk_stmts(block):
            if isinstance(s, BufferStore):
                s.value = replace_buffer_loads(
                    s.value, lambda ld: Load(cache, ld.indices) if ld.buffer is buffer else None
                )
        top = self._top_level(block)
        self.root.body.stmts.insert(self.root.body.stmts.index(top), self._nest_for(copy))  # type: ignore[union-attr]
        self.root.alloc_buffers.append(cache)
        self._log(f'cache_read({block.name}, {buffer.name}, "{scope}") -> {copy.name}')
        return copy

    def cache_write(self, block: Block, buffer: Buffer, scope: str) -> Block:
        """Make ``block`` write a ``scope`` copy of ``buffer`` and add a block copying it back."""
        if buffer not in A.writes(block):
            raise ScheduleError(f"cache_write: block {block.name} does not write {buffer.name}")
        cache = Buffer(f"{buffer.name}_{scope}", buffer.shape, buffer.dtype, scope)
        for s in walk_stmts(block):
            if isinstance(s, BufferStore):
                if s.buffer is buffer:
                    s.buffer = cache
                s.value = replace_buffer_loads(
                    s.value, lambda ld: Load(cache, ld.indices) if ld.buffer is buffer else None
                )
        copy = self._copy_block(f"{buffer.name}_write", cache, buffer)
        top = self._top_level(block)
        self.root.body.stmts.insert(self.root.body.stmts.index(top) + 1, self._nest_for(copy))  # type: ignore[union-attr]
        self.root.alloc_buffers.append(cache)
        self._log(f'cache_write({block.name}, {buffer.name}, "{scope}") -> {copy.name}')
        return copy

    @staticmethod
    def _copy_block(name: str, src: Buffer, dst: Buffer) -> Block:
        ivs = [IterVar(Var(f"v{d}"), n, "S") for d, n in enumerate(src.shape)]
        idx = tuple(iv.var for iv in ivs)
        loops = [Var(f"{name}_i{d}") for d in range(len(ivs))]
        return Block(name, ivs, list(loops), BufferStore(dst, idx, Load(src, idx)))

    @staticmethod
    def _nest_for(block: Block) -> Stmt:
        stmt: Stmt = block
        for lv, iv in reversed(list(zip(block.bindings, block.iter_vars))):
            stmt = For(lv, iv.extent, stmt)  # type: ignore[arg-type]
        return stmt

    def set_scope(self, buffer: Buffer, scope: str) -> None:
        if self._is_param(buffer):
            raise ScheduleError(f"set_scope: {buffer.name} is a function parameter")
        buffer.scope = scope
        self._log(f'set_scope({buffer.name}, "{scope}")')

    def transform_layout(
        self, buffer: Buffer, index_map: Callable[..., Sequence[Expr]], new_shape: Sequence[int]
    ) -> None:
        """Store an intermediate buffer in a new layout: every access ``B[i...]`` becomes
        ``B'[index_map(i...)]`` (e.g. packing ``[K, N] -> [N // 16, K, 16]``)."""
        if self._is_param(buffer):
            raise ScheduleError(f"transform_layout: {buffer.name} is a function parameter")
        old_shape = buffer.shape
        if math.prod(new_shape) < math.prod(old_shape):
            raise ScheduleError(
                f"transform_layout: new shape {list(new_shape)} is smaller than {list(old_shape)}"
            )

        def remap(idx: Sequence[Expr]) -> tuple[Expr, ...]:
            return tuple(simplify(e) for e in index_map(*idx))

        for b in self.blocks():
            for s in walk_stmts(b):
                if isinstance(s, BufferStore):
                    s.value = replace_buffer_loads(
                        s.value, lambda ld: Load(buffer, remap(ld.indices)) if ld.buffer is buffer else None
                    )
                    if s.buffer is buffer:
                        s.indices = remap(s.indices)
        buffer.shape = tuple(new_shape)
        self._log(f"transform_layout({buffer.name}, {list(old_shape)} -> {list(new_shape)})")

    def pad(self, block: Block, loop: For, fill: float | None = None) -> None:
        """Let ``block`` run the whole padded range of ``loop`` (TVM's pad_einsum): the guard conjuncts
        that mention ``loop`` are removed, and every intermediate buffer the block indexes through
        ``loop`` grows to cover the padded range. Reading a function parameter through ``loop`` needs
        ``fill``: the stored value becomes ``select(guard, value, fill)`` so the padding holds ``fill``
        and nothing is read out of bounds. Writing a function parameter through ``loop`` is illegal."""
        from compiler.loopir.expr import select

        self._check_loop(loop)
        if block not in A.blocks_under(loop):
            raise ScheduleError(f"pad: loop {loop.var.name} does not contain block {block.name}")
        conj = _conjuncts(block.predicate) if block.predicate is not None else []
        removed = [c for c in conj if loop.var in free_vars(c)]
        if not removed:
            raise ScheduleError(f"pad: block {block.name} has no guard on loop {loop.var.name}")
        kept = [c for c in conj if loop.var not in free_vars(c)]
        bind = A.binding_map(block)
        loops = self.get_loops(block)
        ranges = A.loop_ranges(loops)
        param_reads = False
        grow: dict[int, tuple[Buffer, list[int]]] = {}
        accesses = [(st.buffer, st.indices, True) for st in A.block_stores(block)]
        accesses += [(ld.buffer, ld.indices, False) for ld in A.block_loads(block)]
        for buf, idx, is_store in accesses:
            full = [substitute(i, bind) for i in idx]
            if not any(loop.var in free_vars(i) for i in full):
                continue
            if self._is_param(buf):
                if is_store:
                    raise ScheduleError(
                        f"pad: block {block.name} writes function output {buf.name} through "
                        f"loop {loop.var.name}"
                    )
                # an input whose padded extent covers the whole range (a pre-packed weight) reads safely;
                # otherwise the padded lanes must not read it at all (fill)
                dims = [(e, n) for e, n in zip(full, buf.shape) if loop.var in free_vars(e)]
                if not _in_bounds([e for e, _ in dims], [n for _, n in dims], ranges):
                    param_reads = True
                continue
            entry = grow.setdefault(buf.uid, (buf, list(buf.shape)))
            for d, e in enumerate(full):
                from compiler.loopir.simplify import bound

                b = bound(simplify(e, ranges), ranges)
                if b is None:
                    raise ScheduleError(f"pad: cannot bound index {d} of {buf.name} in block {block.name}")
                entry[1][d] = max(entry[1][d], b[1] + 1)
        if param_reads:
            if fill is None:
                raise ScheduleError(
                    f"pad: block {block.name} reads a function parameter through loop "
                    f"{loop.var.name}; give fill"
                )
            st = self._single_store(block, "pad")
            cond = _in_iter_vars(block, logical_and(*removed))
            st.value = select(cond, st.value, fill)
        for buf, shape in grow.values():
            buf.shape = tuple(shape)
        block.predicate = logical_and(*kept) if kept else None
        self._log(f"pad({block.name}, {loop.var.name}" + (f", fill={fill}" if fill is not None else "") + ")")

    def transform_input_layout(self, buffer: Buffer, layout: Any) -> Buffer:
        """Make the kernel take input ``buffer`` in ``layout`` (e.g. TilePack): the parameter is replaced
        by one of the new shape, every load is remapped, and ``func.attrs["input_layouts"]`` records the
        layout so the caller lays the data out the same way (for constant weights: once, at compile time)."""
        pos = next((i for i, p in enumerate(self.func.params) if p is buffer), None)
        if pos is None or pos >= self.func.num_inputs:
            raise ScheduleError(f"transform_input_layout: {buffer.name} is not an input of {self.func.name}")
        new = Buffer(buffer.name, tuple(layout.shape(buffer.shape)), buffer.dtype, buffer.scope)

        def remap(ld: Load) -> Expr | None:
            if ld.buffer is not buffer:
                return None
            return Load(new, tuple(simplify(e) for e in layout.index(list(ld.indices))))

        for b in self.blocks():
            for s in walk_stmts(b):
                if isinstance(s, BufferStore):
                    s.value = replace_buffer_loads(s.value, remap)
        self.func.params[pos] = new
        self.func.attrs.setdefault("input_layouts", {})[str(pos)] = layout.to_json()
        self._log(f"transform_input_layout({buffer.name}, {layout.to_json()})")
        return new

    def rfactor(self, loop: For, factor_axis: int = 0) -> Block:
        """Turn the reduction driven by ``loop`` into a spatial axis of a partial-result buffer; a
        write-back block then reduces the partial results. Returns the rfactor block."""
        self._check_loop(loop)
        inner = A.blocks_under(loop)
        if len(inner) != 1 or not inner[0].is_reduction:
            raise ScheduleError(f"rfactor: loop {loop.var.name} must contain exactly one reduction block")
        block = inner[0]
        st = self._single_store(block, "rfactor")
        value = st.value
        if not (
            isinstance(value, Binary)
            and value.op in _COMBINER_OF
            and isinstance(value.a, Load)
            and value.a.buffer is st.buffer
        ):
            raise ScheduleError(f"rfactor: block {block.name} is not a plain sum/max/min reduction")
        combiner, source = _COMBINER_OF[value.op], value.b
        s_ivs = [(iv, e) for iv, e in zip(block.iter_vars, block.bindings) if iv.kind == "S"]
        r_ivs = [(iv, e) for iv, e in zip(block.iter_vars, block.bindings) if iv.kind == "R"]
        if any(loop.var in free_vars(e) for _, e in s_ivs):
            raise ScheduleError(
                f"rfactor: loop {loop.var.name} also drives spatial variables of {block.name}"
            )
        if not any(loop.var in free_vars(e) for _, e in r_ivs):
            raise ScheduleError(f"rfactor: loop {loop.var.name} does not drive a reduction of {block.name}")
        r_loops = [lp for lp in self.get_loops(block) if any(lp.var in free_vars(e) for _, e in r_ivs)]
        for lp in r_loops:
            if any(lp.var in free_vars(e) for _, e in s_ivs):
                raise ScheduleError(f"rfactor: loop {lp.var.name} mixes spatial and reduction variables")
        buf = st.buffer
        if not 0 <= factor_axis <= len(buf.shape):
            raise ScheduleError(f"rfactor: factor_axis {factor_axis} out of range for {buf.name}")
        rf_shape = list(buf.shape)
        rf_shape.insert(factor_axis, loop.extent)
        rf = Buffer(f"{buf.name}_rf", tuple(rf_shape), buf.dtype, "global")
        vr = IterVar(Var("vrf"), loop.extent, "S")
        new_s = [IterVar(Var(iv.var.name), iv.extent, "S") for iv, _ in s_ivs]
        new_r = {lp.var: IterVar(Var(f"r_{lp.var.name}"), lp.extent, "R") for lp in r_loops if lp is not loop}
        loopvar_to_iv: dict[Var, Expr] = {loop.var: vr.var, **{k: v.var for k, v in new_r.items()}}
        s_map = {iv.var: n.var for (iv, _), n in zip(s_ivs, new_s)}
        r_map = {iv.var: substitute(e, loopvar_to_iv) for iv, e in r_ivs}
        src = substitute(source, {**s_map, **r_map})
        idx = [n.var for n in new_s]
        rf_idx = tuple([*idx[:factor_axis], vr.var, *idx[factor_axis:]])
        rf_block = Block(
            f"{block.name}_rf",
            [vr, *new_s, *new_r.values()],
            [loop.var, *(e for _, e in s_ivs), *(lp.var for lp in r_loops if lp is not loop)],
            BufferStore(rf, rf_idx, combine(combiner, Load(rf, rf_idx), src)),
            BufferStore(rf, rf_idx, _identity(block)),
            block.predicate,
        )
        A.replace_child(self._parent(block), block, rf_block)
        # write-back: buf[s] = combine(buf[s], rf[r, s]) over a fresh nest after the rfactor nest
        wb_s = [IterVar(Var(iv.var.name), iv.extent, "S") for iv, _ in s_ivs]
        wr = IterVar(Var("vrf"), loop.extent, "R")
        widx = [iv.var for iv in wb_s]
        wrf_idx = tuple([*widx[:factor_axis], wr.var, *widx[factor_axis:]])
        wb = Block(
            block.name,
            [*wb_s, wr],
            [Var(f"{block.name}_i{d}") for d in range(len(wb_s))] + [Var(f"{block.name}_rf")],
            BufferStore(buf, tuple(widx), combine(combiner, Load(buf, tuple(widx)), Load(rf, wrf_idx))),
            BufferStore(buf, tuple(widx), _identity(block)),
        )
        top = self._top_level(rf_block)
        self.root.body.stmts.insert(self.root.body.stmts.index(top) + 1, self._nest_for(wb))  # type: ignore[union-attr]
        self.root.alloc_buffers.append(rf)
        self._log(f"rfactor({loop.var.name}, factor_axis={factor_axis}) -> {rf_block.name}")
        return rf_block

    def decompose_reduction(self, block: Block, loop: For) -> Block:
        """Hoist ``block``'s init into its own loop nest placed just before ``loop``."""
        self._check_loop(loop)
        if block.init is None:
            raise ScheduleError(f"decompose_reduction: block {block.name} has no init")
        loops = self.get_loops(block)
        if loop not in loops:
            raise ScheduleError(
                f"decompose_reduction: loop {loop.var.name} does not contain block {block.name}"
            )
        s_bind = [(iv, e) for iv, e in zip(block.iter_vars, block.bindings) if iv.kind == "S"]
        r_vars = set().union(
            *(free_vars(e) for iv, e in zip(block.iter_vars, block.bindings) if iv.kind == "R")
        )
        below = loops[loops.index(loop) :]
        copied = []
        for lp in below:
            in_s = any(lp.var in free_vars(e) for _, e in s_bind)
            if in_s and lp.var in r_vars:
                raise ScheduleError(
                    f"decompose_reduction: loop {lp.var.name} drives both spatial and reduction vars"
                )
            if in_s:
                copied.append(lp)
        new_vars = {lp.var: Var(f"{lp.var.name}_init") for lp in copied}
        ivs = [IterVar(Var(iv.var.name), iv.extent, "S") for iv, _ in s_bind]
        init = _subst_stmt(block.init, {iv.var: n.var for (iv, _), n in zip(s_bind, ivs)})
        pred = None
        if block.predicate is not None:
            allowed = set(new_vars) | {lp.var for lp in loops[: loops.index(loop)]}
            kept = [c for c in _conjuncts(block.predicate) if free_vars(c) <= allowed]
            pred = substitute(logical_and(*kept), new_vars) if kept else None  # type: ignore[arg-type]
        init_block = Block(
            f"{block.name}_init", ivs, [substitute(e, new_vars) for _, e in s_bind], init, None, pred
        )
        stmt: Stmt = init_block
        for lp in reversed(copied):
            stmt = For(new_vars[lp.var], lp.extent, stmt)  # type: ignore[arg-type]
        parent = self._parent(loop)
        A.replace_child(parent, loop, seq(stmt, loop))
        block.init = None
        self._log(f"decompose_reduction({block.name}, {loop.var.name}) -> {init_block.name}")
        return init_block


def _identity(block: Block) -> Expr:
    assert block.init is not None and isinstance(block.init, BufferStore)
    return block.init.value


def _subst_stmt(s: Stmt, mapping: dict[Var, Expr]) -> Stmt:
    assert isinstance(s, BufferStore)
    return BufferStore(
        s.buffer, tuple(substitute(i, mapping) for i in s.indices), substitute(s.value, mapping)
    )


def _in_bounds(idx: Sequence[Expr], shape: Sequence[int], ranges: dict) -> bool:
    from compiler.loopir.simplify import bound

    for e, n in zip(idx, shape):
        b = bound(simplify(e, ranges), ranges)
        if b is None or b[0] < 0 or b[1] >= n:
            return False
    return True


def _in_iter_vars(block: Block, guard: Expr) -> Expr:
    """Rewrite a guard over loop variables in terms of the block's iteration variables, by matching
    each binding expression structurally (guards are built from the bindings)."""
    from compiler.loopir.expr import children, rebuild
    from compiler.loopir.simplify import key

    by_key = {key(simplify(e)): iv.var for iv, e in zip(block.iter_vars, block.bindings)}
    by_key.update({key(e): iv.var for iv, e in zip(block.iter_vars, block.bindings)})

    def swap(e: Expr) -> Expr:  # pre-order: the largest matching sub-expression wins
        hit = by_key.get(key(e))
        return hit if hit is not None else rebuild(e, [swap(c) for c in children(e)])

    out = swap(guard)
    loop_vars = {v for e in block.bindings for v in free_vars(e)}
    if free_vars(out) & loop_vars:
        raise ScheduleError(
            f"pad: the guard of block {block.name} is not a condition on its iteration variables"
        )
    return out


def _conjuncts(e: Expr) -> list[Expr]:
    if isinstance(e, Logical) and e.op == "and":
        return _conjuncts(e.a) + _conjuncts(e.b)  # type: ignore[arg-type]
    return [e]


def _name(node: Stmt) -> str:
    if isinstance(node, For):
        return f"loop {node.var.name}"
    if isinstance(node, Block):
        return f"block {node.name}"
    return type(node).__name__
