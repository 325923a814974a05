"""DESIGN.md's worked example: softmax [64,128] on the GPU with the default reduction config — one
block per row, 128 threads, rfactor + cross-thread reduce, exp recomputed in the row loop — built with
the schedule primitives and checked in the SIMT interpreter."""

from __future__ import annotations

from compiler.backends import sketch_for
from compiler.frontend.models import MODELS
from compiler.fusion import fuse
from compiler.passes import optimize
from tests.compiler.backends.cuda.util import CUDA, check_group


def test_softmax_64x128_default_schedule():
    (group,) = fuse(optimize(MODELS["softmax"].graph())).groups
    sketch = sketch_for(group, CUDA)
    config = sketch.default(group, CUDA)
    assert sketch.name == "reduction" and config["rows_per_block"] == 1
    trace = sketch.build(group, config, CUDA).show_trace()
    for step in ("rfactor(", "bind(", '"blockIdx.x"', '"threadIdx.x"', "compute_at(", "set_scope("):
        assert step in trace
    func = check_group(group, config)
    assert func.attrs["launch"]["grid"] == [64, 1, 1]
    assert func.attrs["launch"]["block"] == [config["threads_per_row"], 1, 1]


def test_softmax_with_the_design_config():
    (group,) = fuse(optimize(MODELS["softmax"].graph())).groups
    config = {
        "threads_per_row": 128,
        "rows_per_block": 1,
        "vector": 1,
        "keep_row": "registers",
        "unroll": 1,
        "fast_math": 0,
    }
    func = check_group(group, config)
    assert func.attrs["launch"] == {"grid": [64, 1, 1], "block": [128, 1, 1], "shared_bytes": 32}
