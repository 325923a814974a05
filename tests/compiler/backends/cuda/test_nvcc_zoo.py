"""Every built-in model's groups, scheduled for cuda with the default config and a seeded sample of other
legal configs, compile with ``nvcc -cubin -arch=sm_90`` (one batched nvcc run per session) and fit the
device: threads x registers within the register file, shared memory within the opt-in limit, no spills
for default schedules."""

from __future__ import annotations

import math

import pytest

from compiler.frontend.models import MODELS
from tests.compiler.backends.cuda.conftest import CUDA

REGISTER_FILE = 65536


@pytest.mark.parametrize("model", list(MODELS))
def test_zoo_kernels_compile(zoo_nvcc, model):
    kernels = zoo_nvcc.kernels[model]
    assert kernels, f"{model} has no kernels"
    for name, config, is_default in kernels:
        res = zoo_nvcc.resources.get(name)
        assert res is not None, f"nvcc produced no kernel {name} ({config})"
        launch = zoo_nvcc.launches[name]
        threads = math.prod(launch["block"])
        assert 1 <= threads <= CUDA.max_threads_per_block
        assert res.registers * threads <= REGISTER_FILE, f"{name} {config}: {res.registers} regs x {threads}"
        assert res.shared_bytes <= CUDA.max_shared_bytes_optin, f"{name}: {res.shared_bytes} bytes of smem"
        if is_default:
            assert res.spill_stores == 0, f"default schedule {name} {config} spills {res.spill_stores} bytes"


def test_zoo_nvcc_summary(zoo_nvcc):
    """The batched compile covered many kernels quickly (printed with -s)."""
    n = len(zoo_nvcc.resources)
    print(
        f"\nnvcc compiled {n} kernels in {len(zoo_nvcc.sources)} units; "
        f"build + compile {zoo_nvcc.seconds:.1f} s"
    )
    assert n >= sum(1 for _ in MODELS)
