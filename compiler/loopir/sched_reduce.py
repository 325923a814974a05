"""Reduction primitives: rfactor and decompose_reduction."""

from __future__ import annotations

from compiler.errors import ScheduleError
from compiler.loopir import analysis as A
from compiler.loopir.expr import (
    Binary,
    Expr,
    IterVar,
    Load,
    Var,
    combine,
    conjuncts,
    free_vars,
    logical_and,
    substitute,
)
from compiler.loopir.sched_base import (
    _COMBINER_OF,
    ScheduleBase,
    _identity,
    _subst_stmt,
)
from compiler.loopir.stmt import (
    Block,
    Buffer,
    BufferStore,
    For,
    Stmt,
    seq,
)


class ReductionPrimitives(ScheduleBase):
    """Reduction primitives."""

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
            kept = [c for c in conjuncts(block.predicate) if free_vars(c) <= allowed]
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
