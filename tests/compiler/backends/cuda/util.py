"""Helpers for the CUDA tests: schedule a group for the GPU and check it in the SIMT interpreter."""

from __future__ import annotations

import random

import numpy as np
import pytest

from compiler.backends import sketch_for
from compiler.backends.cuda.lower import lower_gpu_func
from compiler.backends.cuda.nvrtc import nvcc_available
from compiler.errors import ScheduleError
from compiler.fusion import Group, fuse
from compiler.loopir import evaluate
from compiler.loopir.stmt import PrimFunc
from compiler.passes import optimize
from compiler.reference import run_reference
from compiler.target import Target
from tests.compiler.property_graphs import inputs_for

CUDA = Target.cuda()


def need_nvcc() -> None:
    """Skip (saying why) when nvcc is not on PATH: the CUDA compile checks need the CUDA toolkit."""
    if not nvcc_available():
        pytest.skip("nvcc is not installed: the CUDA compile checks need the CUDA toolkit (nvcc on PATH)")


# contraction knobs left at their plain values
PLAIN = {"min_blocks": 1, "smem_pad": 0, "group_m": 1, "warp_rows": 0, "swizzle": 0, "stages": 1}


def lowered(group: Group, config: dict | None = None) -> PrimFunc:
    sketch = sketch_for(group, CUDA)
    config = config if config is not None else sketch.default(group, CUDA)
    return lower_gpu_func(sketch.build(group, config, CUDA).func)


def check_group(group: Group, config: dict | None = None, tol: float = 2e-5) -> PrimFunc:
    """Build ``group`` for CUDA with ``config``, interpret it and compare with the numpy reference."""
    func = lowered(group, config)
    ins = inputs_for(group)
    outs = evaluate(func, ins)
    refs = run_reference(group.subgraph, ins)
    for o, r in zip(outs, refs):
        o64, r64 = o.astype(np.float64), np.asarray(r, np.float64)
        same = (o64 == r64) | (np.isnan(o64) & np.isnan(r64))  # equal infinities, NaN for NaN
        finite = np.abs(r64[np.isfinite(r64)])
        scale = max(1.0, float(finite.max()) if finite.size else 1.0)
        with np.errstate(invalid="ignore"):
            err = float(np.where(same, 0.0, np.abs(o64 - r64)).max()) if o64.size else 0.0
        assert err <= tol * scale, f"{group.name} {config}: max err {err}\n{func}"
    return func


def groups_of(graph) -> list[Group]:
    """The non-view groups of ``graph`` after the standard passes and the rule-based fusion."""
    return [g for g in fuse(optimize(graph)).groups if not g.is_view]


def legal_samples(group: Group, n: int) -> list[dict]:
    """Up to ``n`` distinct random legal configs of ``group``'s sketch other than its default (seeded by
    the group's key)."""
    sketch = sketch_for(group, CUDA)
    space = sketch.space(group, CUDA)
    rng = random.Random(group.workload_key)
    default = sketch.default(group, CUDA)
    out: list[dict] = []
    for _ in range(200):
        if len(out) >= n:
            break
        config = {k.name: rng.choice(k.values) for k in space}
        if config == default or config in out:
            continue
        try:
            sketch.check(group, config, CUDA)
        except ScheduleError:
            continue
        out.append(config)
    return out


def samples(group: Group, n: int) -> list[dict]:
    """The default config of ``group``'s sketch and up to ``n`` random legal ones."""
    return [sketch_for(group, CUDA).default(group, CUDA), *legal_samples(group, n)]
