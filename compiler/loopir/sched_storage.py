"""Storage primitives: cache_read, cache_write, set_scope, transform_layout, transform_input_layout, pad."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from compiler.errors import ScheduleError
from compiler.loopir import analysis as A
from compiler.loopir.expr import (
    Expr,
    Load,
    conjuncts,
    free_vars,
    logical_and,
    replace_buffer_loads,
    substitute,
)
from compiler.loopir.sched_base import (
    ScheduleBase,
    _in_bounds,
    _in_iter_vars,
)
from compiler.loopir.simplify import simplify
from compiler.loopir.stmt import (
    Block,
    Buffer,
    BufferStore,
    For,
    walk_stmts,
)


class StoragePrimitives(ScheduleBase):
    """Storage primitives."""

    def cache_read(
        self, block: Block, buffer: Buffer, scope: str, only: Callable[[Load], bool] | None = None
    ) -> Block:
        """Read ``buffer`` in ``block`` through a copy in ``scope``; returns the copy block. With ``only``,
        just the loads of ``buffer`` it selects read the copy and the others keep reading ``buffer`` (one
        operand of a product whose two operands are views of one buffer: the copy only reads ``buffer``,
        so both may alias it)."""
        if buffer not in A.reads(block):
            raise ScheduleError(f"cache_read: block {block.name} does not read {buffer.name}")
        if only is not None and not any(ld.buffer is buffer and only(ld) for ld in A.block_loads(block)):
            raise ScheduleError(f"cache_read: no selected load of {buffer.name} in block {block.name}")
        name = f"{buffer.name}_{scope}"
        taken = {b.name for b in self.root.alloc_buffers}
        if name in taken:  # a second copy of one buffer (each operand view of it packed apart)
            name = next(f"{name}_{i}" for i in range(1, len(taken) + 2) if f"{name}_{i}" not in taken)
        cache = Buffer(name, buffer.shape, buffer.dtype, scope)
        copy = self._copy_block(name, buffer, cache)

        def redirect(ld: Load) -> Expr | None:
            if ld.buffer is not buffer or (only is not None and not only(ld)):
                return None
            return Load(cache, ld.indices)

        for s in walk_stmts(block):
            if isinstance(s, BufferStore):
                s.value = replace_buffer_loads(s.value, redirect)
        top = self._top_level(block)
        self.root.body.stmts.insert(self.root.body.stmts.index(top), self._nest_for(copy))  # type: ignore[union-attr]
        self.root.alloc_buffers.append(cache)
        part = "" if only is None else ", only=<selected loads>"
        self._log(f'cache_read({block.name}, {buffer.name}, "{scope}"{part}) -> {copy.name}')
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
        conj = conjuncts(block.predicate) if block.predicate is not None else []
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
