"""A stand-in for CuPy that runs "device" kernels in Kiln's SIMT interpreter: enough of the API the
CUDA runtime uses (arrays, RawModule/RawKernel, streams, graphs, events) to test the executor end to
end on a machine without a GPU. Kernels are looked up by name in ``KERNELS`` (name -> lowered PrimFunc
of one kernel), which the tests fill from the same plan the model was compiled from.

:func:`install` puts the fake in ``sys.modules`` as ``cupy`` for one test and hides a real CuPy's own
modules (``cupy.*``, ``cupy_backends``) meanwhile, so nothing reaches a real CuPy's internals (which would
import ``cupy`` and get this fake): Kiln's NVRTC path then finds no low-level binding and compiles through
``RawModule(code=...)``, which the fake provides."""

from __future__ import annotations

import sys
import time
import types
from typing import Any

import numpy as np

from compiler.loopir import run_func

KERNELS: dict[str, object] = {}
LAUNCHES: list[tuple[str, tuple, tuple, int]] = []


class ndarray(np.ndarray):
    def get(self, out=None):
        if out is not None:
            out[...] = np.asarray(self)
            return out
        return np.array(self)

    def set(self, value):
        self[...] = value

    @property
    def data(self):  # type: ignore[override]
        return types.SimpleNamespace(ptr=self.ctypes.data)


def empty(shape, dtype=np.float32):
    return np.empty(shape, dtype).view(ndarray)


def asarray(x, dtype=None):
    return np.array(x, dtype=dtype).view(ndarray)


def asnumpy(x):
    return np.array(x)


uint8 = np.uint8
float32 = np.float32


class RawKernel:
    def __init__(self, name):
        self.name = name
        self.max_dynamic_shared_size_bytes = 0
        self.attributes = {"max_threads_per_block": 1024, "num_regs": 32}

    def __call__(self, grid, block, args, shared_mem=0):
        if _capturing:
            _capturing[-1].append((self, grid, block, args, shared_mem))
            return
        func = KERNELS[self.name]
        LAUNCHES.append((self.name, tuple(grid), tuple(block), shared_mem))
        run_func(func, [np.asarray(a) for a in args])


class RawModule:
    def __init__(self, code=None, path=None, options=(), backend="nvrtc"):
        self.code, self.path = code, path

    def compile(self):
        return None

    def get_function(self, name):
        if name not in KERNELS:
            raise RuntimeError(f"no kernel {name}")
        return RawKernel(name)


_capturing: list[list] = []


class Graph:
    def __init__(self, calls):
        self.calls = calls
        self.launches = 0

    def launch(self, stream=None):
        self.launches += 1
        for fn, grid, block, args, smem in self.calls:
            fn(grid, block, args, shared_mem=smem)


class Stream:
    def __init__(self, non_blocking=False):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def begin_capture(self):
        _capturing.append([])

    def end_capture(self):
        return Graph(_capturing.pop())

    def synchronize(self):
        pass


class Event:
    def record(self, stream=None):
        self.t = time.perf_counter()

    def synchronize(self):
        pass


class Device:
    id = 0

    def synchronize(self):
        pass


def _elapsed(a, b):
    return (b.t - a.t) * 1e3


runtime = types.SimpleNamespace(
    getDeviceCount=lambda: 1,
    getDeviceProperties=lambda i: {
        "name": b"Fake GPU (SIMT interpreter)",
        "major": 9,
        "minor": 0,
        "multiProcessorCount": 4,
        "sharedMemPerBlock": 48 * 1024,
        "sharedMemPerBlockOptin": 227 * 1024,
        "maxThreadsPerBlock": 1024,
        "l2CacheSize": 1 << 20,
        "warpSize": 32,
    },
)
cuda = types.SimpleNamespace(
    runtime=runtime,
    Stream=Stream,
    Event=Event,
    Device=Device,
    get_elapsed_time=_elapsed,
    get_current_stream=lambda: Stream(),
)


REAL_CUPY_PACKAGES = ("cupy", "cupy_backends")


def install(monkeypatch: Any) -> types.ModuleType:
    """Make ``import cupy`` give this module for the rest of the test (``monkeypatch`` undoes it).

    Every loaded module of a real CuPy is taken out of ``sys.modules`` and ``cupy_backends`` is blocked
    (``None`` makes importing it raise ImportError), so that a real CuPy installed beside the fake never
    runs with the fake as its ``cupy``."""
    fake = sys.modules[__name__]
    for name in list(sys.modules):
        if name.split(".")[0] in REAL_CUPY_PACKAGES:
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setitem(sys.modules, "cupy_backends", None)
    return fake
