"""CuPy in the CUDA measurement processes: the check made when a builder or runner is created, and the
``cupy_module`` simulation hook applied in each worker process."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any

from compiler.backends.cuda.device import CudaUnavailable, cupy_or_none, why_unavailable

INSTALL = 'pip install -e ".[cuda]"'


def require(what: str, cupy_module: str | None, gpu: bool) -> None:
    """Raise CudaUnavailable (one line, with the install command) when ``what`` cannot work here: CuPy (its
    NVRTC) missing, or with ``gpu`` no GPU visible. With ``cupy_module``, only that it can be imported."""
    if cupy_module is not None:
        if importlib.util.find_spec(cupy_module) is None:
            raise CudaUnavailable(f"{what}: cupy_module {cupy_module!r} cannot be imported")
        return
    if cupy_or_none() is None:
        raise CudaUnavailable(f"{what} needs CuPy (with its NVRTC), which is not installed: {INSTALL}")
    if gpu:
        reason = why_unavailable()
        if reason is not None:
            raise CudaUnavailable(f"{what} needs an NVIDIA GPU: {' '.join(reason.split())}")


def use_cupy_module(name: str | None) -> Any:
    """In a worker process: import ``name`` as ``cupy`` (its ``activate()`` when it has one), or CuPy."""
    if name is not None:
        module = importlib.import_module(name)
        activate = getattr(module, "activate", None)
        if activate is not None:
            activate()
        else:
            sys.modules["cupy"] = module
    return importlib.import_module("cupy")
