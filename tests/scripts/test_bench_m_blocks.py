"""scripts/bench_m_blocks.py without measuring: its "old" contender is the rule before stop 34 (the sketch's
default with that rule swapped in, restored afterwards), and a malformed shape is named."""

from __future__ import annotations

import dataclasses

import pytest

from compiler.backends.cpu.sketches import contraction
from scripts import bench_m_blocks as B
from scripts.bench_edge_tiles import gemm_task
from tests.targets import PINNED_TARGETS


def test_old_contender_is_the_rule_before_stop_34_and_the_sketch_is_restored():
    two = dataclasses.replace(PINNED_TARGETS["avx512"], cores=2)
    task = gemm_task(3000, 512, 128, two)
    rule = contraction._balanced_tiles
    old, new = B.old_default(task), task.default()
    assert contraction._balanced_tiles is rule
    assert old["parallel"] == new["parallel"] == "batch_m"
    assert (old["mr"], old["mc_tiles"]) == (8, 1)  # 375 blocks of 8 rows: the only size dividing M
    assert new["mc_tiles"] > old["mc_tiles"]
    assert {**old, "mc_tiles": 0} == {**new, "mc_tiles": 0}  # only the M blocks differ


def test_malformed_shape_is_named():
    assert B.parse_shapes("8x16x32,") == [(8, 16, 32)]
    with pytest.raises(SystemExit, match="'8x16' is not MxKxN"):
        B.parse_shapes("8x16")
