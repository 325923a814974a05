"""Fixtures of the CUDA tests: a throwaway kernel cache, and one batched nvcc run per session.

``zoo_nvcc`` schedules every group of every built-in model for the cuda target with its default config
and a seeded sample of other legal configs, generates all kernels into a few translation units (one per
CPU, so two nvcc processes run side by side here) and compiles them with ``nvcc -cubin -arch=sm_90
-Xptxas -v`` once per session; tests then look up each kernel's resource usage."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from compiler.backends import sketch_for
from compiler.backends.cuda.codegen import generate_cuda, kernel_names
from compiler.backends.cuda.nvrtc import KernelResources, error_message, parse_ptxas
from compiler.build import kernel_for
from compiler.frontend.models import MODELS
from compiler.fusion import fuse
from compiler.passes import optimize
from compiler.target import Target
from tests.compiler.backends.cuda.util import legal_samples, need_nvcc

CUDA = Target.cuda()
SAMPLES = int(os.environ.get("KILN_NVCC_SAMPLES", "2"))  # legal non-default configs per unique group


@dataclass
class ZooBuild:
    """Kernels of the zoo: model -> kernel names (default config first), and nvcc's resource usage."""

    kernels: dict[str, list[tuple[str, dict, bool]]] = field(default_factory=dict)  # name, config, default
    launches: dict[str, dict] = field(default_factory=dict)
    resources: dict[str, KernelResources] = field(default_factory=dict)
    seconds: float = 0.0
    sources: list[str] = field(default_factory=list)


def compile_units(sources: list[str], workdir: Path) -> dict[str, KernelResources]:
    """nvcc every translation unit at once (one process each); raise with nvcc's lines on failure."""
    procs = []
    for k, src in enumerate(sources):
        cu = workdir / f"unit{k}.cu"
        cu.write_text(src)
        cmd = [
            "nvcc",
            "-cubin",
            "-arch=sm_90",
            "--std=c++17",
            "-Xptxas",
            "-v",
            "-o",
            str(cu.with_suffix(".cubin")),
            str(cu),
        ]
        procs.append(
            (src, cu, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        )
    out: dict[str, KernelResources] = {}
    for src, cu, p in procs:
        _, err = p.communicate()
        if p.returncode != 0:
            raise AssertionError(error_message("nvcc", src, err.replace(str(cu), "unit.cu"), "sm_90"))
        out.update(parse_ptxas(err))
    return out


@pytest.fixture(scope="session")
def zoo_nvcc() -> ZooBuild:
    need_nvcc()
    t0 = time.perf_counter()
    zoo = ZooBuild()
    funcs = []
    built: dict[tuple[str, str], str] = {}  # (workload, config) -> kernel name (groups shared by models)
    for model, spec in MODELS.items():
        names = zoo.kernels.setdefault(model, [])
        for group in fuse(optimize(spec.graph())).groups:
            if group.is_view:
                continue
            sketch = sketch_for(group, CUDA)
            default = sketch.default(group, CUDA)
            for k, config in enumerate([default, *legal_samples(group, SAMPLES)]):
                key = (group.workload_key, repr(sorted(config.items())))
                if key not in built:
                    name = f"{model}_g{group.index}_c{k}"
                    plan = kernel_for(group, CUDA, config, name=name)
                    funcs.append(plan.func)
                    built[key] = name
                    for launch in plan.func.attrs["launches"]:
                        zoo.launches[name] = launch
                    assert kernel_names(plan.func) == [name] or len(kernel_names(plan.func)) > 1
                names.append((built[key], config, k == 0))
    units = max(1, min(len(os.sched_getaffinity(0)), 4))
    chunks = [funcs[i::units] for i in range(units)]
    zoo.sources = [generate_cuda(c, CUDA) for c in chunks if c]
    with tempfile.TemporaryDirectory() as d:
        zoo.resources = compile_units(zoo.sources, Path(d))
    zoo.seconds = time.perf_counter() - t0
    return zoo
