"""The CUDA build of the pointwise sketch: elementwise / broadcast / injective chains and pooling windows.

Knobs ``threads`` (T, per block), ``elems`` (E, per thread), ``vector`` (V). The output's axes are fused
into one index ``f``, and each thread handles E elements as E/V vectors of V consecutive elements, the
vectors of one block interleaved across its threads so that a warp touches consecutive memory::

    blockIdx.x bx
      threadIdx.x tx
        for e in 0 .. E/V (unrolled)
          for v in 0 .. V (vectorized: one float4/float2 load and store per operand)
            f = ((bx * E/V + e) * T + tx) * V + v
            out[f] = chain(in0[f], bias[f % C], ...)

Pooling windows (a reduction block feeding the output) run serially per output element inside the
thread. A tail (``f`` past the end) is a guard; the codegen keeps the vector path for full vectors.
"""

from __future__ import annotations

from compiler.backends.cuda.sketches.common import localize
from compiler.backends.sketch import Config, output_blocks, prepare
from compiler.fusion import Group
from compiler.loopir import analysis as A
from compiler.loopir.schedule import Schedule
from compiler.loopir.stmt import Block
from compiler.target import Target


def build_pointwise_cuda(sketch, group: Group, config: Config, target: Target) -> Schedule:
    """Schedule a pointwise group for the GPU with ``config`` (already checked)."""
    sch, _ = prepare(group)
    for out in output_blocks(sch):
        schedule_elementwise(sch, out, config["threads"], config["elems"], config["vector"])
    localize(sch)
    return sch


def schedule_elementwise(sch: Schedule, out: Block, threads: int, elems: int, vector: int) -> None:
    """Bind the spatial loops of ``out`` to a grid of ``threads``-thread blocks, ``elems`` elements per
    thread in vectors of ``vector``; reductions feeding ``out`` (pooling windows) run inside each thread."""
    loops = sch.get_loops(out)
    n_sp = sum(1 for iv in out.iter_vars if iv.kind == "S")
    spatial = loops[:n_sp]
    for b in sch.blocks():
        if b is not out and b.is_reduction and spatial and _feeds(b, out):
            sch.compute_at(b, spatial[-1])
    if out.is_reduction and out.init is not None and len(loops) > n_sp:
        sch.decompose_reduction(out, loops[n_sp])
    if not spatial:  # a scalar output: one thread
        return
    f = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    window = any(b is not out for b in A.blocks_under(f)) or out.is_reduction
    v = vector if not window else 1
    chunks = max(1, elems // v)
    outer, lane = sch.split(f, [None, v])
    total = outer.extent
    threads = min(threads, max(32, 1 << (total - 1).bit_length()))
    chunks = max(1, min(chunks, -(-total // threads)))
    bx, step, tx = sch.split(outer, [None, chunks, threads])
    sch.reorder(bx, tx, step)
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    if chunks > 1:
        sch.unroll(step)
    if v > 1:
        sch.vectorize(lane)


def _feeds(producer: Block, consumer: Block) -> bool:
    return any(w in A.reads(consumer) for w in A.writes(producer))


def copy_func(shape: tuple[int, ...], dtype: str, name: str):
    """A lowered GPU kernel copying a tensor (graph outputs that are an input or a param)."""
    from compiler.loopir import lower_func
    from compiler.te import TEProgram, compute, lower, placeholder

    x = placeholder(shape, dtype, "src")
    y = compute(shape, lambda *i: x[i] if i else x[()], "dst")
    sch = Schedule(lower(TEProgram(name, [x], [y], [y])))
    for out in output_blocks(sch):
        schedule_elementwise(sch, out, 256, 4, 4 if shape and shape[-1] % 4 == 0 else 1)
    return lower_func(sch.func)
