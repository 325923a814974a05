"""Where blocks compute: compute_inline, reverse_compute_inline, compute_at, reverse_compute_at."""

from __future__ import annotations

from compiler.errors import ScheduleError
from compiler.loopir import analysis as A
from compiler.loopir.expr import (
    Expr,
    Load,
    Var,
    const,
    replace_buffer_loads,
    substitute,
    walk,
)
from compiler.loopir.sched_base import (
    ScheduleBase,
)
from compiler.loopir.simplify import simplify
from compiler.loopir.stmt import (
    Block,
    BufferStore,
    For,
    walk_stmts,
)


class ComputePrimitives(ScheduleBase):
    """Where blocks compute."""

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
