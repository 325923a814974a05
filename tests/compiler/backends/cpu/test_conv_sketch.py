"""The CPU convolution sketch: every config its space and ``check`` allow computes the reference result
(hypothesis draws the convolution and the config; the rule picks the method), on the loop-IR interpreter;
its defaults pass their own check on AVX-512 and AVX2 targets."""

from __future__ import annotations

import os
import platform

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler.backends.cpu.codegen import prepare
from compiler.backends.cpu.sketches.conv import (
    FLAT_FREE_REGISTERS,
    CpuConvSketch,
    conv_geometry,
    overlap_step,
)
from compiler.build import compile as compile_model
from compiler.builder import GraphBuilder
from compiler.errors import ScheduleError
from compiler.fusion import Group, fuse
from compiler.graph import Graph
from compiler.layouts import apply_input_layouts
from compiler.loopir import evaluate, lower_func
from compiler.loopir.expr import lanes_of
from compiler.loopir.stmt import Allocate, BufferStore, walk_stmts
from compiler.passes import optimize
from compiler.reference import run_reference
from compiler.target import Target
from tests.compiler.property_graphs import inputs_for

SKETCH = CpuConvSketch()
AVX512 = Target.from_cpuinfo("flags\t: avx512f avx2 fma\n", "x86_64", cores=2)
AVX2 = Target.from_cpuinfo("flags\t: avx2 fma\n", "x86_64", cores=2)
SSE = Target.from_cpuinfo("flags\t: sse2 sse4_1\n", "x86_64", cores=2)
SETTINGS = settings(
    max_examples=int(os.environ.get("KILN_PROPERTY_EXAMPLES", "30")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def conv_net(c: int, o: int, h: int, w: int, k: int, s: int, pad: int, groups: int, epilogue: str) -> Graph:
    """conv2d (constant weight) + a per-channel bias + an activation (relu / relu6 / residual), then a 1x1
    max pool (an identity, but not elementwise: the convolution's chain does not end in the graph output,
    so passes/flatten_pointwise_conv flattens a 1x1 convolution as it would inside a net)."""
    rng = np.random.default_rng(1)
    b = GraphBuilder("conv")
    x = b.input("x", (1, c * groups, h, w))
    weight = b.param("w", rng.standard_normal((o * groups, c, k, k)).astype(np.float32))
    y = b.conv2d(x, weight, strides=(s, s), padding=(pad, pad), groups=groups)
    y = b.add(y, b.param("bias", rng.standard_normal((o * groups, 1, 1)).astype(np.float32)))
    if epilogue == "relu6":
        y = b.minimum(b.maximum(y, b.constant(0.0)), b.constant(6.0))
    elif epilogue == "residual" and y.shape == x.shape:
        y = b.add(y, x)
    else:
        y = b.relu(y)
    return b.build([b.max_pool2d(y, (1, 1))])


def conv_group(graph: Graph) -> Group:
    groups = [g for g in fuse(optimize(graph)).groups if SKETCH.applies(g)]
    assert len(groups) == 1, [g.name for g in fuse(optimize(graph)).groups]
    return groups[0]


def assert_computes(group: Group, config: dict, target: Target) -> None:
    sch = SKETCH.build(group, config, target)
    func = lower_func(sch.func)
    ins = inputs_for(group)
    outs = evaluate(func, apply_input_layouts(func.attrs, ins))
    for o, r in zip(outs, run_reference(group.subgraph, ins)):
        err = float(np.abs(o.astype(np.float64) - r).max())
        assert err <= 2e-5 * max(1.0, float(np.abs(r).max())), f"{config}: max err {err}\n{sch.show_trace()}"


@SETTINGS
@given(
    c=st.integers(1, 4),
    o=st.sampled_from([1, 3, 8]),
    h=st.integers(3, 7),
    w=st.integers(3, 12),
    k=st.sampled_from([1, 3]),
    s=st.integers(1, 2),
    pad=st.integers(0, 1),
    depthwise=st.booleans(),
    deep=st.booleans(),
    epilogue=st.sampled_from(["relu", "relu6", "residual"]),
    avx2=st.booleans(),
    data=st.data(),
)
def test_every_legal_config_computes_the_reference(
    c, o, h, w, k, s, pad, depthwise, deep, epilogue, avx2, data
):
    groups = 1
    if depthwise:  # one input and one output channel per group
        groups, c, o = c + 1, 1, 1
    elif deep and k == 3:  # C x KH x KW > 64: the deep-window rule
        c = 8
    group = conv_group(conv_net(c, o, h, w, k, s, pad, groups, epilogue))
    target = AVX2 if avx2 else AVX512
    config = {k.name: data.draw(st.sampled_from(k.values), label=k.name) for k in SKETCH.space(group, target)}
    try:
        SKETCH.check(group, config, target)
    except ScheduleError:
        return  # rejected up front: allowed
    assert_computes(group, config, target)


@SETTINGS
@given(
    channels=st.integers(2, 9),
    h=st.integers(3, 9),
    w=st.integers(3, 23),
    s=st.integers(1, 2),
    pad=st.integers(0, 1),
    epilogue=st.sampled_from(["relu", "relu6", "residual"]),
    avx2=st.booleans(),
    data=st.data(),
)
def test_every_legal_depthwise_config_computes_the_reference(channels, h, w, s, pad, epilogue, avx2, data):
    """Depthwise 3x3 convolutions (odd sizes, strides, padded or not) with ``pad_at`` (the padded copy
    per channel tile) and ``row_tail`` (overlapped row tiles) drawn with the other knobs."""
    group = conv_group(conv_net(1, 1, h, w, 3, s, pad, channels, epilogue))
    target = AVX2 if avx2 else AVX512
    space = SKETCH.space(group, target)
    config = {k.name: data.draw(st.sampled_from(k.values), label=k.name) for k in space}
    try:
        SKETCH.check(group, config, target)
    except ScheduleError:
        return  # rejected up front: allowed
    assert_computes(group, config, target)


@SETTINGS
@given(
    c=st.integers(1, 6),
    o=st.sampled_from([1, 4, 7]),
    hw=st.sampled_from([(4, 4), (2, 8), (4, 8), (8, 6), (7, 16), (3, 8)]),
    epilogue=st.sampled_from(["relu", "relu6", "residual"]),
    avx2=st.booleans(),
    data=st.data(),
)
def test_every_legal_config_of_a_flattened_pointwise_conv_computes_the_reference(
    c, o, hw, epilogue, avx2, data
):
    """A 1x1 convolution whose image passes/flatten_pointwise_conv viewed as one row: the direct method
    when whole vectors of the target's lanes tile the row."""
    if epilogue == "residual":
        o = c
    target = AVX2 if avx2 else AVX512
    group = conv_group(conv_net(c, o, hw[0], hw[1], 1, 1, 0, 1, epilogue))
    geo_row = hw[0] * hw[1]
    expected = "direct" if geo_row % target.vector_lanes_f32 == 0 else "gemm"
    assert SKETCH.method(group, target) == expected
    config = {k.name: data.draw(st.sampled_from(k.values), label=k.name) for k in SKETCH.space(group, target)}
    try:
        SKETCH.check(group, config, target)
    except ScheduleError:
        return  # rejected up front: allowed
    assert_computes(group, config, target)


@pytest.mark.parametrize("target", [AVX512, AVX2], ids=["avx512", "avx2"])
@pytest.mark.parametrize(
    "shape",
    [
        (3, 32, 16, 16, 3, 1, 1, 1),  # first layer of a conv net: direct
        (1, 1, 14, 14, 3, 1, 1, 24),  # depthwise: direct
        (8, 8, 7, 7, 3, 1, 1, 1),  # 3x3 on a small image
        (8, 24, 7, 7, 1, 1, 0, 1),  # 1x1 on 49 pixels: the GEMM view
        (8, 24, 4, 8, 1, 1, 0, 1),  # 1x1 on 32 pixels: direct along the flattened image
        (4, 8, 9, 9, 3, 2, 0, 1),  # stride 2, unpadded
        (2, 4, 3, 3, 3, 1, 1, 1),  # a 3x3 image: row tiles narrower than the ISA's vectors
        (8, 8, 6, 6, 3, 1, 1, 1),  # deep (72) on 6-pixel rows: direct over the padded copy / GEMM view
        (8, 8, 4, 16, 3, 1, 1, 1),  # deep on 16-pixel rows: direct on both ISAs
    ],
)
def test_default_passes_its_check_and_computes(shape, target):
    c, o, h, k, s, pad, groups = shape[0], shape[1], shape[2], shape[4], shape[5], shape[6], shape[7]
    group = conv_group(conv_net(c, o, h, shape[3], k, s, pad, groups, "relu"))
    config = SKETCH.default(group, target)
    SKETCH.check(group, config, target)
    assert_computes(group, config, target)


def test_default_method_follows_the_rule():
    first = conv_group(conv_net(3, 32, 16, 16, 3, 1, 1, 1, "relu"))
    depthwise = conv_group(conv_net(1, 1, 14, 14, 3, 1, 1, 24, "relu"))
    pointwise = conv_group(conv_net(32, 32, 14, 14, 1, 1, 0, 1, "relu"))
    assert SKETCH.default(first, AVX512)["method"] == "direct"
    assert SKETCH.default(depthwise, AVX512)["method"] == "direct"
    assert SKETCH.default(pointwise, AVX512)["method"] == "gemm"  # 196 pixels: 16-lane vectors leave a tail
    deep_28 = conv_group(conv_net(64, 64, 28, 28, 3, 1, 1, 1, "relu"))  # rows end in a part vector
    deep_16 = conv_group(conv_net(32, 64, 16, 16, 3, 1, 1, 1, "relu"))  # rows of whole vectors
    assert SKETCH.default(deep_28, AVX512)["method"] == "direct"
    assert SKETCH.default(deep_28, AVX2)["method"] == "gemm"
    assert SKETCH.default(deep_16, AVX2)["method"] == "direct"
    flat = conv_group(conv_net(32, 32, 28, 28, 1, 1, 0, 1, "relu"))  # 784 pixels: 49 vectors
    assert SKETCH.default(flat, AVX512)["method"] == "direct"
    assert SKETCH.default(flat, AVX2)["method"] == "direct"


def test_avx2_tiles_fit_sixteen_registers():
    group = conv_group(conv_net(3, 32, 16, 16, 3, 1, 1, 1, "relu"))
    config = SKETCH.default(group, AVX2)
    assert config["vector_x"] <= 8
    assert config["oc_tile"] * config["ry"] * config["nr_x"] // config["vector_x"] <= 14


def test_the_space_holds_the_chosen_methods_knobs_only():
    direct = conv_group(conv_net(3, 32, 16, 16, 3, 1, 1, 1, "relu"))
    gemm = conv_group(conv_net(32, 32, 14, 14, 1, 1, 0, 1, "relu"))
    assert [k.name for k in SKETCH.space(direct, AVX512)] == [
        "method",
        "oc_tile",
        "ry",
        "nr_x",
        "vector_x",
        "parallel_x",
        "pad_at",
        "row_tail",
    ]
    pad_at = {k.name: k.values for k in SKETCH.space(direct, AVX512)}["pad_at"]
    assert pad_at == ("once",)  # a dense convolution pads its whole input once
    assert "mr" in [k.name for k in SKETCH.space(gemm, AVX512)]
    assert "oc_tile" not in [k.name for k in SKETCH.space(gemm, AVX512)]


def test_an_oversized_direct_tile_is_rejected_with_its_size():
    group = conv_group(conv_net(3, 32, 16, 16, 3, 1, 1, 1, "relu"))
    config = {**SKETCH.default(group, AVX2), "oc_tile": 12, "ry": 4, "nr_x": 16, "vector_x": 8}
    with pytest.raises(ScheduleError, match="96 vector accumulators"):
        SKETCH.check(group, config, AVX2)


@pytest.mark.parametrize("two_stage_bytes", [0, 1 << 20], ids=["one-stage pad", "two-stage pad"])
@pytest.mark.parametrize("target", [AVX512, AVX2], ids=["avx512", "avx2"])
def test_both_padded_copies_compute_the_reference(two_stage_bytes, target, monkeypatch):
    """te_ops._conv_pad: one select over the input (large copies) or rows then columns (vectorized); a
    depthwise convolution's copy is made per channel tile, always in two stages, and so is a stride-1
    convolution with output rows as wide as its input's (flat tiles read its rows stage alone)."""
    monkeypatch.setattr("compiler.te_ops.TWO_STAGE_PAD_BYTES", two_stage_bytes)
    for shape in [(3, 8, 5, 19, 3, 1, 1, 1), (1, 1, 6, 17, 3, 1, 1, 6), (6, 4, 7, 9, 3, 2, 1, 1)]:
        c, o, h, w, k, s, pad, groups = shape
        group = conv_group(conv_net(c, o, h, w, k, s, pad, groups, "relu"))
        default = SKETCH.default(group, target)
        for pad_at in ("once", "channel_tile") if groups > 1 else (default.get("pad_at"),):
            config = default if pad_at is None else {**default, "pad_at": pad_at}
            pads = [b.name for b in SKETCH.build(group, config, target).blocks() if b.name.endswith("_pad")]
            one_stage = two_stage_bytes == 0 and groups == 1 and s > 1
            assert len(pads) == (1 if one_stage else 2), pads
            assert_computes(group, config, target)


@pytest.mark.parametrize("target", [AVX512, AVX2, SSE], ids=["avx512", "avx2", "sse"])
@pytest.mark.parametrize("w", [16, 28, 5], ids=["whole-vector rows", "rows with a tail", "short rows"])
def test_a_whole_input_two_stage_pad_copies_in_vectors(target, w):
    """A stride-1 "same" convolution's two-stage padded copy made once for the whole input (conv_net's
    32 -> 64 at 16x16): both stages store whole vectors of the target's lanes (rows the lanes do not
    divide: overlapped vectors, or a guarded last one), not scalars left to gcc (the rows stage was a
    scalar loop: 18.3 of the convolution's 288 us on AVX-512), except rows shorter than a vector. (A rows
    stage whose tail is guarded, not overlapped, stays scalar: the vectorizer cannot prove its clamped
    loads in bounds past the guard; e.g. rows of 19 in vectors of 8.)"""
    group = conv_group(conv_net(4, 8, 6, w, 3, 1, 1, 1, "relu"))
    config = {**SKETCH.default(group, target), "pad_at": "once"}
    if config["method"] != "direct":
        pytest.skip(f"{target.key}: the rule picks {config['method']} for this convolution, no padded copy")
    if config["row_tail"] == "flat":  # flat tiles read the rows stage alone: the same tile over both
        config.update(row_tail="pad", nr_x=config["nr_x"] // config["ry"])
    SKETCH.check(group, config, target)
    func = prepare(lower_func(SKETCH.build(group, config, target).func), target)
    stores = [
        s for s in walk_stmts(func.body) if isinstance(s, BufferStore) and s.buffer.name.endswith("pad")
    ]
    lanes = target.vector_lanes_f32
    for stage, row in (("_rows_pad", w), ("d_pad", w + 2)):  # the columns stage's rows hold the padding
        widths = {lanes_of(s.value.dtype) for s in stores if s.buffer.name.endswith(stage)}
        assert widths and (lanes in widths if row >= lanes else widths == {1}), (stage, row, widths)
    assert_computes(group, config, target)


@pytest.mark.parametrize("target", [AVX512, AVX2], ids=["avx512", "avx2"])
def test_a_depthwise_conv_pads_per_channel_tile_and_overlaps_its_row_tail(target):
    """MobileNetV2's depthwise 3x3 (rows of 28 pixels, 192 channels): by default each channel tile pads
    its own channels into buffers of a few KiB (no copy of the whole input), and the row's last tile is
    shifted back to end at the row's end (whole vectors, no row guard on the stores)."""
    group = conv_group(conv_net(1, 1, 28, 28, 3, 1, 1, 192, "relu6"))
    config = SKETCH.default(group, target)
    assert config["pad_at"] == "channel_tile" and config["row_tail"] == "overlap", config
    func = lower_func(SKETCH.build(group, config, target).func)
    pads = [s.buffer for s in walk_stmts(func.body) if isinstance(s, Allocate) and "pad" in s.buffer.name]
    assert len(pads) == 2 and all(b.nbytes <= 16 * 1024 for b in pads), [(b.name, b.shape) for b in pads]


def test_a_flattened_pointwise_conv_takes_channel_tiles_that_spare_its_input_rereads():
    """MobileNetV2's 1x1 expansion (32 -> 192 on 784 pixels, an input larger than L1, re-read once per
    channel tile): the AVX-512 default takes at least 6 channels per tile (measured: oc 4 x 7 vectors 43 us,
    82 us with an input 16 bytes off a cache line; oc 8 x 3 vectors 36.5 us either way)."""
    group = conv_group(conv_net(32, 192, 28, 28, 1, 1, 0, 1, "relu6"))
    config = SKETCH.default(group, AVX512)
    assert config["method"] == "direct" and config["oc_tile"] >= 6, config
    SKETCH.check(group, config, AVX512)


def test_overlapped_row_tiles_cover_the_row_with_equal_shifts():
    group = conv_group(conv_net(2, 4, 5, 13, 3, 1, 0, 1, "relu"))  # 11-pixel output rows, unpadded
    base = {**SKETCH.default(group, AVX512), "vector_x": 4, "oc_tile": 1, "ry": 1}
    # 11 pixels: 2 tiles of 8 (at 0, 3); tiles of 4 at 0, 1, ..., 7 (3 tiles would start at 0, 3.5, 7)
    assert (overlap_step(11, 8), overlap_step(11, 4), overlap_step(28, 8)) == (3, 1, 5)
    for nr in (8, 4):
        assert_computes(group, {**base, "nr_x": nr, "row_tail": "overlap"}, AVX512)
    with pytest.raises(ScheduleError, match="row_tail overlap"):  # one tile of 16 covers the row
        SKETCH.check(group, {**base, "nr_x": 16, "row_tail": "overlap"}, AVX512)


@SETTINGS
@given(
    c=st.integers(1, 4),
    o=st.sampled_from([1, 3, 5, 8]),
    h=st.integers(2, 8),
    w=st.integers(3, 14),
    k=st.sampled_from([3, 5]),
    groups=st.sampled_from([1, 2]),
    epilogue=st.sampled_from(["relu", "relu6", "residual"]),
    avx2=st.booleans(),
    data=st.data(),
)
def test_every_legal_flat_config_computes_the_reference(c, o, h, w, k, groups, epilogue, avx2, data):
    """``row_tail`` flat (tiles of whole rows as one run of pixels, the column padding read as a lane
    condition from the rows-padded copy) with every other knob drawn: 'same' convolutions, grouped too."""
    group = conv_group(conv_net(c, o, max(h, k // 2 + 1), max(w, k // 2 + 1), k, 1, k // 2, groups, epilogue))
    target = AVX2 if avx2 else AVX512
    space = {kn.name: kn.values for kn in SKETCH.space(group, target)}
    if "flat" not in space.get("row_tail", ()):
        return  # the GEMM view (deep windows whose rows end in a part vector)
    config = {name: data.draw(st.sampled_from(values), label=name) for name, values in space.items()}
    config["row_tail"] = "flat"
    config["pad_at"] = "once"
    config["nr_x"] = config["ry"] * conv_geometry(group)["ow"]
    try:
        SKETCH.check(group, config, target)
    except ScheduleError:
        return  # rejected up front: allowed
    assert_computes(group, config, target)


def test_flat_tiles_are_the_default_for_rows_ending_in_a_part_vector():
    """ResNet's 3x3 64->64 at 28x28 with AVX-512: 28-pixel rows end in a part vector, so the default tile
    runs whole rows as one run of pixels, its accumulators leaving FLAT_FREE_REGISTERS registers; rows of
    whole vectors (32 pixels) keep row tiles unless a tile covers whole rows; AVX2 keeps the GEMM view
    for that deep window."""
    resnet = conv_group(conv_net(64, 64, 28, 28, 3, 1, 1, 1, "relu"))
    config = SKETCH.default(resnet, AVX512)
    assert config["row_tail"] == "flat" and config["nr_x"] == config["ry"] * 28
    assert config["oc_tile"] * config["nr_x"] // config["vector_x"] <= 32 - FLAT_FREE_REGISTERS
    assert SKETCH.default(resnet, AVX2)["method"] == "gemm"
    whole = conv_group(conv_net(16, 32, 16, 32, 3, 1, 1, 1, "relu"))
    assert SKETCH.default(whole, AVX512)["row_tail"] != "flat"
    # conv_net's 32 -> 64 at 16x16: the tile covers whole rows of one vector each, so with AVX-512's masked
    # FMAs it runs them flat (no columns stage), the same accumulators; AVX2 keeps its row tiles
    one_vector = conv_group(conv_net(32, 64, 16, 16, 3, 1, 1, 1, "relu"))
    config = SKETCH.default(one_vector, AVX512)
    assert config["row_tail"] == "flat" and config["nr_x"] == config["ry"] * 16, config
    assert SKETCH.default(one_vector, AVX2)["row_tail"] != "flat"
    with pytest.raises(ScheduleError, match="flat runs in vectors"):  # scalar flat tiles: 50-100x slower
        SKETCH.check(one_vector, {**config, "vector_x": 1}, AVX512)
    unpadded = conv_group(conv_net(2, 8, 10, 10, 3, 1, 0, 1, "relu"))
    assert "flat" not in next(k.values for k in SKETCH.space(unpadded, AVX512) if k.name == "row_tail")


@pytest.mark.parametrize("isa", [None, "avx2"])
@pytest.mark.parametrize(
    ("c", "o", "h", "w", "k", "oc", "ry"),
    [(3, 5, 8, 12, 3, 3, 4), (2, 4, 4, 8, 5, 2, 2), (4, 6, 8, 28, 3, 2, 4)],
)
def test_flat_tiles_compile_to_masked_code_that_computes_the_reference(isa, c, o, h, w, k, oc, ry):
    """The C of flat tiles on the host (native, and narrowed to AVX2): each vector's column padding is a
    constant lane mask, written as merge-masked FMAs / zero-masking loads (or their portable forms)."""
    with open("/proc/cpuinfo") as f:
        target = Target.from_cpuinfo(f.read(), platform.machine(), 1, isa)
    lanes = target.vector_lanes_f32

    def fits(r: int) -> bool:
        return h % r == 0 and (r * w) % lanes == 0 and oc * (r * w // lanes) <= target.vector_registers - 2

    if lanes < 4 or not fits(ry):
        ry = next((r for r in (4, 2, 1) if fits(r)), None)
        if ry is None:
            pytest.skip(f"no flat tile of whole {w}-pixel rows in vectors of {lanes} lanes")
    graph = conv_net(c, o, h, w, k, 1, k // 2, 1, "relu")
    config = {
        "method": "direct", "oc_tile": oc, "ry": ry, "nr_x": ry * w, "vector_x": lanes,
        "parallel_x": "none", "pad_at": "once", "row_tail": "flat",
    }  # fmt: skip
    SKETCH.check(conv_group(graph), config, target)
    model = compile_model(
        graph, target, configs=lambda g, _t: ("conv", config, "test") if SKETCH.applies(g) else None
    )
    assert "kiln_fma_mask_f32x" in model.source
    x = {"x": np.random.default_rng(2).standard_normal((1, c, h, w)).astype(np.float32)}
    (out,) = model.run(x)
    (ref,) = run_reference(graph, x)
    assert np.abs(out - ref).max() <= 2e-5 * max(1.0, float(np.abs(ref).max()))
