"""The CPU attention sketch: every config its space allows that ``check`` accepts, on AVX-512, AVX2 and SSE
targets, computes the attention core (scale, masks, head layouts, rows != keys; two-pass or online softmax,
rows whose first key blocks are all masked) as numpy does; the default
passes its own check on every ISA and fills the ISA's registers; the generated C runs on the host."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from compiler.backends import get_backend, sketch_for
from compiler.backends.cpu.sketches.attention import CpuAttentionSketch
from compiler.builder import GraphBuilder
from compiler.errors import ScheduleError
from compiler.fusion import Group, attention_edges, fuse
from compiler.graph import Graph
from compiler.layouts import apply_input_layouts
from compiler.loopir import evaluate
from compiler.passes import optimize
from compiler.reference import run_reference
from compiler.target import Target
from tests.compiler.backends.cpu import util
from tests.compiler.property_graphs import inputs_for
from tests.targets import X86_TARGETS

TARGETS = (Target.host(), *X86_TARGETS.values())
SETTINGS = settings(
    max_examples=int(os.environ.get("KILN_PROPERTY_EXAMPLES", "30")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
MASKS = ("none", "add", "where", "suffix")
SCALES = ("multiply", "divide", "none")


def core_graph(batch: int, heads: int, m: int, n: int, hd: int, scale: str, mask: str) -> Graph:
    """Multi-head attention of q [batch, m, heads*hd] over k, v [batch, n, heads*hd] (head split by
    reshape + transpose), with an optional scale and a constant mask of the keys each row may see (additive
    -inf or ``where``)."""
    b = GraphBuilder("core")

    def heads_of(name: str, rows: int):
        x = b.input(name, (batch, rows, heads * hd))
        return b.transpose(b.reshape(x, (batch, rows, heads, hd)), (0, 2, 1, 3))

    q, k, v = heads_of("q", m), heads_of("k", n), heads_of("v", n)
    s = b.batch_matmul(q, k, transpose_b=True)
    if scale == "multiply":
        s = b.multiply(s, 1.0 / math.sqrt(hd))
    elif scale == "divide":
        s = b.divide(s, math.sqrt(hd))
    keep = np.tril(np.ones((m, n), bool), max(0, n - m))  # every row sees at least one key
    if mask == "suffix":  # row i sees keys i.. only: a row's first key blocks can be all -inf
        keep = np.arange(n)[None, :] >= np.minimum(np.arange(m), n - 1)[:, None]
    if mask in ("add", "suffix"):
        s = b.add(s, b.param("mask", np.where(keep, 0.0, -np.inf).astype(np.float32)))
    elif mask == "where":
        s = b.where(b.param("keep", keep), s, float(np.finfo(np.float32).min))
    return b.build([b.batch_matmul(b.softmax(s, axis=-1), v)])


def attention_group(graph: Graph) -> Group:
    g = optimize(graph)
    edges = attention_edges(g)
    assert len(edges) == 1, "the test graph's core was not matched"
    groups = [x for x in fuse(g, {edges[0].id: True}).groups if x.kind == "attention"]
    assert len(groups) == 1
    return groups[0]


def check_close(out: np.ndarray, ref: np.ndarray, what: str) -> None:
    o64, r64 = out.astype(np.float64), ref.astype(np.float64)
    scale = max(1.0, float(np.abs(r64).max()))
    err = float(np.abs(o64 - r64).max())
    assert err <= 2e-5 * scale, f"{what}: max err {err}"


@SETTINGS
@given(
    batch=st.integers(1, 2),
    heads=st.integers(1, 3),
    m=st.sampled_from([1, 4, 8, 16]),
    n=st.sampled_from([4, 8, 16, 32]),
    hd=st.sampled_from([4, 8, 16]),
    scale=st.sampled_from(SCALES),
    mask=st.sampled_from(MASKS),
    data=st.data(),
)
def test_every_legal_config_computes_the_core(batch, heads, m, n, hd, scale, mask, data):
    group = attention_group(core_graph(batch, heads, m, n, hd, scale, mask))
    target = data.draw(st.sampled_from(TARGETS), label="target")
    sketch = sketch_for(group, target)
    assert isinstance(sketch, CpuAttentionSketch)
    config = {k.name: data.draw(st.sampled_from(k.values), label=k.name) for k in sketch.space(group, target)}
    try:
        sketch.check(group, config, target)
    except ScheduleError:
        assume(False)  # rejected up front is allowed; hypothesis draws another example
    func = get_backend(target).lower(sketch.build(group, config, target).func)
    ins = inputs_for(group)
    (out,) = evaluate(func, apply_input_layouts(func.attrs, ins))
    (ref,) = run_reference(group.subgraph, ins)
    check_close(out, ref, f"{target.isa} {config}")


@pytest.mark.parametrize("target", TARGETS, ids=["host", *X86_TARGETS])
def test_default_passes_its_check_and_fills_the_registers(target):
    group = attention_group(core_graph(1, 12, 128, 128, 64, "multiply", "none"))
    sketch = CpuAttentionSketch()
    config = sketch.default(group, target)
    sketch.check(group, config, target)
    assert config["vector"] == min(16, target.vector_lanes_f32)
    budget = target.vector_registers // 2
    for mr, nu in (("mr", "nu"), ("pv_mr", "pv_nu")):
        assert config[mr] * config[nu] <= budget
    assert config["mr"] == 8  # the most rows per tile (query rows broadcast)
    assert config["rows"] == 128  # 12 heads leave 6 tasks per thread: K packed once per head
    assert config["parallel"] == "tasks"


def test_illegal_tiles_are_rejected_naming_the_knob():
    group = attention_group(core_graph(1, 2, 8, 16, 8, "multiply", "none"))
    target = X86_TARGETS["avx2"]
    sketch = CpuAttentionSketch()
    config = sketch.default(group, target)
    with pytest.raises(ScheduleError, match="pv_mr"):
        sketch.check(group, {**config, "mr": 2, "pv_mr": 4}, target)
    with pytest.raises(ScheduleError, match="nu"):
        sketch.check(group, {**config, "vector": 8, "nu": 4}, target)  # 32 does not divide 16 keys


@pytest.mark.parametrize(
    ("mask", "online"), [*((m, False) for m in MASKS), ("suffix", True)], ids=[*MASKS, "suffix-online"]
)
def test_generated_c_runs_on_the_host(mask, online):
    group = attention_group(core_graph(2, 3, 16, 32, 16, "divide", mask))
    target = Target.host()
    sketch = CpuAttentionSketch()
    config = sketch.default(group, target)
    if online:  # key blocks of 16: rows of the suffix mask start with fully masked blocks
        config = {**config, "keys": 16, "nu": 1}
    func = get_backend(target).lower(sketch.build(group, config, target).func)
    ins = inputs_for(group, seed=1)
    (out,) = util.run(func, *ins)
    (ref,) = run_reference(group.subgraph, ins)
    check_close(out, ref, f"host C, mask {mask}, {config}")
