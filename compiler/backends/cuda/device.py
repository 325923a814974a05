"""The CUDA device as Kiln sees it: CuPy imported lazily, the current GPU's target, clear errors.

Importing :mod:`compiler` never imports CuPy. ``Target.parse("cuda")`` calls :func:`current_cuda_target`,
which describes the current GPU when CuPy and a device are there, and otherwise falls back to
``Target.cuda()`` (sm_90, H100) so that code generation, ``kiln show --target cuda`` and the nvcc checks
work on machines without a GPU. Running anything needs :func:`require_cupy`, which says what is missing
and how to install it.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from compiler.errors import KilnError
from compiler.target import Target

INSTALL_HINT = 'pip install -e ".[cuda]"  (CuPy for CUDA 13 with its NVRTC: cupy-cuda13x[ctk])'


class CudaUnavailable(KilnError):
    """CuPy or an NVIDIA GPU is missing, so CUDA kernels cannot be built or run here."""


def cupy_or_none() -> Any:
    """The ``cupy`` module, or None when it is not installed (or fails to load)."""
    if os.environ.get("KILN_DISABLE_CUPY"):
        return None
    try:
        import cupy
    except Exception:  # ImportError, or a broken CUDA installation raising at import
        return None
    return cupy


def why_unavailable() -> str | None:
    """None when CuPy can run kernels on a GPU here, else a one-line reason."""
    cp = cupy_or_none()
    if cp is None:
        return f"CuPy is not installed: {INSTALL_HINT}"
    try:
        count = cp.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return (
            f"CuPy is installed but cannot reach the CUDA driver ({type(exc).__name__}: {exc}); "
            "is there an NVIDIA GPU and driver?"
        )
    if count < 1:
        return "CuPy is installed but no NVIDIA GPU is visible (cudaGetDeviceCount() == 0)"
    return None


def nvrtc_load_error(exc: BaseException) -> CudaUnavailable | None:
    """A one-line CudaUnavailable when ``exc`` says CuPy could not load the NVRTC library (CuPy 13:
    ``RuntimeError: CuPy failed to load libnvrtc.so.13: OSError: ...``; CuPy 14: cuda-pathfinder's
    ``DynamicLibNotFoundError``; an OSError from ``dlopen``), else None (a real compile error)."""
    text = f"{type(exc).__name__}: {exc}"
    lowered = text.lower()
    if "nvrtc" not in lowered:
        return None
    loading = (
        isinstance(exc, (OSError, ImportError))
        or "failed to load" in lowered
        or "cannot open shared object" in lowered
        or "could not find module" in lowered
        or "dynamiclib" in lowered
        or "not found" in lowered
        or "builtin_operation_failure" in lowered
    )
    if not loading:
        return None
    first = " ".join(text.split())[:200]
    return CudaUnavailable(
        f"CuPy is installed but cannot load the NVRTC library libnvrtc ({first}); install CUDA's NVRTC "
        f"with the cuda extra: {INSTALL_HINT}"
    )


def require_cupy(what: str = "running a model on the cuda target") -> Any:
    """The ``cupy`` module, or CudaUnavailable saying what is missing and how to install it."""
    reason = why_unavailable()
    if reason is not None:
        raise CudaUnavailable(f"{what} needs CuPy and an NVIDIA GPU: {reason}")
    return cupy_or_none()


@functools.cache
def current_cuda_target() -> Target:
    """The current GPU as a Target (arch, name, SMs, limits), or ``Target.cuda()`` without one."""
    if why_unavailable() is not None:
        return Target.cuda()
    cp = cupy_or_none()
    try:
        dev = cp.cuda.Device()
        props = cp.cuda.runtime.getDeviceProperties(dev.id)
    except Exception:
        return Target.cuda()
    name = props.get("name", b"NVIDIA GPU")
    name = name.decode() if isinstance(name, bytes) else str(name)
    arch = f"sm_{props.get('major', 9)}{props.get('minor', 0)}"
    base = Target.cuda(arch, name, int(props.get("multiProcessorCount", 132)))
    return Target(
        kind="cuda",
        arch=arch,
        device=name,
        cores=base.cores,
        vector_bytes=16,
        max_threads_per_block=int(props.get("maxThreadsPerBlock", base.max_threads_per_block)),
        max_shared_bytes=int(props.get("sharedMemPerBlock", base.max_shared_bytes)),
        max_shared_bytes_optin=int(props.get("sharedMemPerBlockOptin", base.max_shared_bytes_optin)),
        max_registers_per_thread=255,
        warp_size=int(props.get("warpSize", 32)),
        l2_bytes=int(props.get("l2CacheSize", base.l2_bytes)),
        extra={"regs_per_block": int(props.get("regsPerBlock", 65536))},
    )


def device_arch(target: Target) -> str:
    """The ``sm_XY`` to compile for: the target's arch (the current GPU's when it is the current one)."""
    return target.arch if target.arch.startswith("sm_") else "sm_90"
