"""The reduction sketch: one or more reductions over the same rows with their prologue and epilogue
in one kernel (softmax, layer_norm, rms_norm, pooling by mean ...).

CPU schedule ("row" form, reductions over trailing axes): fuse the row axes into one loop, compute
every reduction (and any kept intermediate) at that loop, vectorize each reduction with ``rfactor``
into ``accum`` x ``vector`` register accumulators, vectorize and unroll the elementwise epilogue, run
rows in parallel. Knobs: ``vector``, ``accum``, ``unroll``, ``keep`` (recompute an expensive shared
intermediate such as softmax's exp, or keep the row in a buffer), ``parallel``.
CUDA knobs: ``threads_per_row``, ``rows_per_block``, ``vector``, ``keep_row``, ``unroll``.
"""

from __future__ import annotations

import math

from compiler.backends.sketch import PARALLEL_MIN_WORK, Config, Knob, Sketch
from compiler.errors import ScheduleError
from compiler.fusion import Group
from compiler.loopir import analysis as A
from compiler.loopir.expr import Call, walk
from compiler.loopir.lower import REDUCE_TREE
from compiler.loopir.schedule import Schedule
from compiler.loopir.stmt import Block, For
from compiler.target import Target
from compiler.te import lower as te_lower
from compiler.te_ops import graph_to_te

EXPENSIVE = {"exp", "log", "tanh", "erf", "sigmoid"}


def _reduce_info(group: Group) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(input shape, reduced axes) of the group's reductions."""
    anchor = group.anchor
    assert anchor is not None
    return anchor.inputs[0].shape, anchor.attrs["axes"]


def row_form(group: Group) -> bool:
    shape, axes = _reduce_info(group)
    r = len(shape)
    return bool(axes) and tuple(axes) == tuple(range(r - len(axes), r))


def row_length(group: Group) -> int:
    shape, axes = _reduce_info(group)
    return math.prod(shape[a] for a in axes)


def _expensive(b: Block) -> bool:
    return any(
        isinstance(e, Call) and e.name in EXPENSIVE for st in A.block_stores(b) for e in walk(st.value)
    )


class ReductionSketch(Sketch):
    name = "reduction"
    version = 1
    kinds = ("reduction",)

    def space(self, group: Group, target: Target) -> list[Knob]:
        if target.kind == "cuda":
            return [
                Knob("threads_per_row", (32, 64, 128, 256, 512, 1024), "threads cooperating on one row"),
                Knob("rows_per_block", (1, 2, 4, 8), "rows handled by one thread block"),
                Knob("vector", (1, 2, 4), "vector width of row loads (float2/float4)"),
                Knob("keep_row", ("registers", "reread"), "keep the row in registers or re-read it"),
                Knob("unroll", (1, 4, 8), "unroll of the per-thread loop"),
            ]
        if not row_form(group):
            return [
                Knob("vector", (1,)),
                Knob("accum", (1,)),
                Knob("unroll", (1,)),
                Knob("keep", ("recompute",)),
                Knob("parallel", ("rows", "none")),
                Knob("div", ("exact",)),
            ]
        lanes = target.vector_lanes_f32
        keep = ("recompute", "buffer") if self._has_shared_expensive(group) else ("recompute",)
        return [
            Knob("vector", tuple(v for v in (1, 4, 8, 16) if v <= lanes), "SIMD lanes of row loops"),
            Knob("accum", (1, 2, 4), "independent vector accumulators per reduction"),
            Knob("unroll", (1, 2, 4), "unroll of the vectorized epilogue loop"),
            Knob("keep", keep, "recompute shared transcendental intermediates or keep the row in a buffer"),
            Knob("parallel", ("rows", "none"), "OpenMP over rows"),
            Knob(
                "div",
                ("reciprocal", "exact") if self._divides(group) else ("exact",),
                "divide by a per-row value, or multiply by its reciprocal computed once per row "
                "(<= 1 ulp apart; division is several times slower)",
            ),
        ]

    @staticmethod
    def _divides(group: Group) -> bool:
        return any(n.op == "divide" for n in group.subgraph.nodes)

    @staticmethod
    def _has_shared_expensive(group: Group) -> bool:
        ops = {"exp", "log", "tanh", "erf", "sigmoid"}
        users = group.subgraph.consumers()
        return any(n.op in ops and len(users.get(n.output, [])) >= 2 for n in group.subgraph.nodes)

    def check_combination(self, group: Group, config: Config, target: Target) -> None:
        if target.kind == "cuda":
            if config["threads_per_row"] * config["rows_per_block"] > target.max_threads_per_block:
                raise ScheduleError(
                    "reduction: threads_per_row * rows_per_block exceeds the block size limit"
                )
            if row_length(group) % config["vector"]:
                raise ScheduleError(
                    f"reduction: vector {config['vector']} does not divide the row {row_length(group)}"
                )
            return
        n = row_length(group)
        v = config["vector"]
        for knob in ("accum", "unroll"):
            if n % (v * config[knob]):
                raise ScheduleError(
                    f"reduction: vector*{knob} = {v * config[knob]} does not divide the row length {n}"
                )

    def default(self, group: Group, target: Target) -> Config:
        if target.kind == "cuda":
            n = row_length(group)
            tpr = 32 if n <= 256 else 128 if n <= 2048 else 256
            return {
                "threads_per_row": tpr,
                "rows_per_block": 1,
                "vector": 4 if n % 4 == 0 else 1,
                "keep_row": "registers",
                "unroll": 1,
            }
        rows = math.prod(group.outputs[0].shape) // max(
            1, row_length(group) if self._full_output(group) else 1
        )
        config = {
            "vector": 1,
            "accum": 1,
            "unroll": 1,
            "keep": "buffer" if self._has_shared_expensive(group) else "recompute",
            "parallel": "rows"
            if rows >= 2 and rows * max(1, row_length(group)) >= PARALLEL_MIN_WORK
            else "none",
            "div": "reciprocal" if self._divides(group) else "exact",
        }
        if not row_form(group):
            config["keep"] = "recompute"
            config["div"] = "exact"
            return config
        n = row_length(group)
        for v in (16, 8, 4):
            if v <= target.vector_lanes_f32 and n % v == 0:
                config["vector"] = v
                break
        v = config["vector"]
        if v > 1 and n % (4 * v) == 0 and n >= 16 * v:
            config["accum"] = 4
        elif v > 1 and n % (2 * v) == 0:
            config["accum"] = 2
        return config

    @staticmethod
    def _full_output(group: Group) -> bool:
        shape, _ = _reduce_info(group)
        return group.outputs[-1].shape == shape

    # ------------------------------------------------------------------ build
    def build(self, group: Group, config: Config, target: Target) -> Schedule:
        self.check(group, config, target)
        if target.kind == "cuda":
            from compiler.backends.cuda.sketches.reduction import build_reduction_cuda

            return build_reduction_cuda(self, group, config, target)
        sch = Schedule(te_lower(graph_to_te(group.subgraph, group.name)))
        outs = {id(b) for b in sch.func.outputs}
        kept: list[Block] = []
        for b in list(sch.blocks()):
            if b.is_reduction or any(id(w) in outs for w in A.writes(b)):
                continue
            if config["keep"] == "buffer" and _expensive(b) and len(sch.consumers(A.writes(b)[0])) >= 2:
                kept.append(b)
                continue
            sch.compute_inline(b)
        main = [b for b in sch.blocks() if any(id(w) in outs for w in A.writes(b))][-1]
        if config.get("div") == "reciprocal":
            _reciprocal_divisions(main)
        shape, axes = _reduce_info(group)
        loops = sch.get_loops(main)
        n_sp = sum(1 for iv in main.iter_vars if iv.kind == "S")
        spatial = loops[:n_sp]
        full = main.iter_vars and len(spatial) == len(shape) and not main.is_reduction and row_form(group)
        if full:
            row_loops, col_loops = spatial[: len(shape) - len(axes)], spatial[len(shape) - len(axes) :]
        else:
            row_loops, col_loops = spatial, []
        if not row_loops:  # a single row (full reduction): nothing to parallelize over rows
            row = None
        else:
            row = sch.fuse(*row_loops) if len(row_loops) > 1 else row_loops[0]
        col = sch.fuse(*col_loops) if len(col_loops) > 1 else (col_loops[0] if col_loops else None)
        # bring every producer of the main output into the row loop (consumers first)
        deps = [b for b in sch.blocks() if b is not main]
        if row is not None:
            for b in reversed(deps):
                if self._reaches(sch, b, main):
                    sch.compute_at(b, row)
        v = config["vector"]
        rf_ok = row_form(group)
        for b in [b for b in sch.blocks() if b.is_reduction and b is not main]:
            self._schedule_reduce(sch, b, row, v if rf_ok else 1, config["accum"] if rf_ok else 1)
        if main.is_reduction:
            self._schedule_reduce(sch, main, row, v if rf_ok else 1, config["accum"] if rf_ok else 1)
        for b in kept:
            self._vector_loop(sch, sch.get_loops(b)[-1], v, 1)
        if col is not None:
            self._vector_loop(sch, col, v, config["unroll"])
        if row is not None and config["parallel"] == "rows":
            sch.parallel(row)
        for buf in sch.root.alloc_buffers:
            buf.scope = "local"
        return sch

    def _reaches(self, sch: Schedule, src: Block, dst: Block) -> bool:
        frontier = set(map(id, A.writes(src)))
        for b in sch.blocks():  # program order is a topological order
            if b is src:
                continue
            if any(id(r) in frontier for r in A.reads(b)):
                if b is dst:
                    return True
                frontier.update(map(id, A.writes(b)))
        return False

    def _vector_loop(self, sch: Schedule, loop: For, v: int, u: int) -> None:
        if v == 1 and u == 1:
            return
        _, lu, lv = sch.split(loop, [None, u, v])
        if v > 1:
            sch.vectorize(lv)
        if u > 1:
            sch.unroll(lu)

    def _schedule_reduce(self, sch: Schedule, b: Block, row: For | None, v: int, acc: int) -> None:
        loops = sch.get_loops(b)
        rloops = [lp for lp in loops if self._drives_reduce(b, lp)]
        if not rloops:
            return
        k = sch.fuse(*rloops) if len(rloops) > 1 else rloops[0]
        if v * acc == 1:
            sch.decompose_reduction(b, k)
            return
        ko, kf = sch.split(k, [None, acc * v])
        rf = sch.rfactor(kf)
        wb = sch.get_block(b.name)
        if row is not None:
            if sch.consumers(A.writes(wb)[0]):
                sch.compute_at(wb, row)
            else:  # the reduction is the group's output: place the write-back after its partials
                sch.reverse_compute_at(wb, row)
        rloops = sch.get_loops(rf)
        kf_loop = next(lp for lp in rloops if lp.var is kf.var)
        ko_loop = next(lp for lp in rloops if lp.var is ko.var)
        init = sch.decompose_reduction(rf, ko_loop)
        ka, kv = sch.split(kf_loop, [acc, v])
        sch.vectorize(kv)
        if acc > 1:
            sch.unroll(ka)
        init_loop = sch.get_loops(init)[-1]
        if init_loop.extent == acc * v:
            _ia, iv = sch.split(init_loop, [acc, v])
            sch.vectorize(iv)
        wb_loops = sch.get_loops(wb)
        if wb_loops and wb_loops[-1].extent == acc * v:
            sch.decompose_reduction(wb, wb_loops[-1])
            # a fully unrolled horizontal reduction leaves only constant indices into the partials,
            # so the codegen keeps the accumulators in vector registers; as a balanced tree, its
            # latency is log2(accum x vector) operations instead of accum x vector
            sch.unroll(wb_loops[-1])
            wb_loops[-1].annotations[REDUCE_TREE] = True

    @staticmethod
    def _drives_reduce(b: Block, lp: For) -> bool:
        from compiler.loopir.expr import free_vars

        return any(iv.kind == "R" and lp.var in free_vars(e) for iv, e in zip(b.iter_vars, b.bindings))


def _reciprocal_divisions(block: Block) -> None:
    """``a / b`` with ``b`` constant along the row (it reads no column iteration variable) becomes
    ``a * recip(b)``: the reciprocal is loop-invariant in the column loop, so it is computed once per row."""
    from compiler.loopir.expr import Binary, Call, free_vars, transform
    from compiler.loopir.stmt import BufferStore

    reduced = {iv.var for iv in block.iter_vars if iv.kind == "S"}
    if not reduced:
        return
    col = {iv.var for iv in block.iter_vars[-1:]}  # the innermost (column) iteration variable

    def swap(e):
        if (
            isinstance(e, Binary)
            and e.op == "/"
            and not (free_vars(e.b) & col)
            and e.dtype.startswith("float")
        ):
            return Binary("*", e.a, Call("recip", (e.b,), e.dtype), e.dtype)
        return None

    for st in A.block_stores(block):
        assert isinstance(st, BufferStore)
        st.value = transform(st.value, swap)
