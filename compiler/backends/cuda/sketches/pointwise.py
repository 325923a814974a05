"""The CUDA pointwise sketch: elementwise / broadcast / injective chains and pooling windows.

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

from compiler.backends import group_analysis as G
from compiler.backends.cuda.lower import lower_gpu_func
from compiler.backends.cuda.sketches.common import block_threads, localize, narrow_memory, vector_widths
from compiler.backends.sketch import Config, Knob, Sketch, output_blocks, place_windows, prepare
from compiler.errors import ScheduleError
from compiler.fusion import Group
from compiler.loopir import analysis as A
from compiler.loopir.schedule import Schedule
from compiler.loopir.stmt import Block, PrimFunc
from compiler.target import Target
from compiler.te import TEProgram, compute, lower, placeholder


class CudaPointwiseSketch(Sketch):
    """Pointwise groups on the GPU: the output's elements spread over a grid of thread blocks."""

    name = "pointwise"
    version = 1
    kinds = ("pointwise",)

    def space(self, group: Group, target: Target) -> list[Knob]:
        return [
            Knob("threads", (64, 128, 256, 512, 1024), "threads per block"),
            Knob("elems", (1, 2, 4, 8), "elements per thread"),
            Knob(
                "vector",
                vector_widths(group),
                "vector width of loads and stores (float2/float4; 16-bit floats: 4, 8 or 16 bytes)",
            ),
        ]

    def check_combination(self, group: Group, config: Config, target: Target) -> None:
        if config["elems"] % config["vector"]:
            raise ScheduleError("pointwise: elems must be a multiple of vector")

    def default(self, group: Group, target: Target) -> Config:
        shape = G.out_shape(group)
        if narrow_memory(group) and shape[-1:] and shape[-1] % 8 == 0:  # 16-byte accesses of 8 halves
            return {"threads": 256, "elems": 8, "vector": 8}
        return {"threads": 256, "elems": 4, "vector": 4 if shape[-1:] and shape[-1] % 4 == 0 else 1}

    def build(self, group: Group, config: Config, target: Target) -> Schedule:
        self.check(group, config, target)
        sch, _ = prepare(group)
        for out in output_blocks(sch):
            schedule_elementwise(sch, out, config["threads"], config["elems"], config["vector"])
        localize(sch)
        return sch


def schedule_elementwise(sch: Schedule, out: Block, threads: int, elems: int, vector: int) -> None:
    """Bind the spatial loops of ``out`` to a grid of ``threads``-thread blocks, ``elems`` elements per
    thread in vectors of ``vector``; reductions feeding ``out`` (pooling windows) run inside each thread."""
    spatial = place_windows(sch, out)
    if not spatial:  # a scalar output: one thread
        return
    f = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    window = any(b is not out for b in A.blocks_under(f)) or out.is_reduction
    v = vector if not window else 1
    chunks = max(1, elems // v)
    outer, lane = sch.split(f, [None, v])
    total = outer.extent
    threads = block_threads(threads, total)
    chunks = max(1, min(chunks, -(-total // threads)))
    bx, step, tx = sch.split(outer, [None, chunks, threads])
    sch.reorder(bx, tx, step)
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    if chunks > 1:
        sch.unroll(step)
    if v > 1:
        sch.vectorize(lane)


def copy_func(shape: tuple[int, ...], dtype: str, name: str) -> PrimFunc:
    """A lowered GPU kernel copying a tensor (graph outputs that are an input or a param)."""
    x = placeholder(shape, dtype, "src")
    y = compute(shape, lambda *i: x[i] if i else x[()], "dst")
    sch = Schedule(lower(TEProgram(name, [x], [y], [y])))
    for out in output_blocks(sch):
        schedule_elementwise(sch, out, 256, 4, 4 if shape and shape[-1] % 4 == 0 else 1)
    return lower_gpu_func(sch.func)
