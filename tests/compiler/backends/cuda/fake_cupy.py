"""A stand-in for CuPy that runs "device" kernels in Kiln's SIMT interpreter: enough of the API the
CUDA runtime uses (arrays, RawModule/RawKernel, streams, graphs, events) to test the executor end to
end on a machine without a GPU. Kernels are looked up by name in ``KERNELS`` (name -> lowered PrimFunc
of one kernel), which the tests fill from the same plan the model was compiled from.

:func:`install` puts the fake in ``sys.modules`` as ``cupy`` for one test and hides a real CuPy's own
modules (``cupy.*``, ``cupy_backends``) meanwhile, so nothing reaches a real CuPy's internals (which would
import ``cupy`` and get this fake): Kiln's NVRTC path then finds no low-level binding and compiles through
``RawModule(code=...)``, which the fake provides.

Spawned measurement workers (``tuner.measure.cuda``, option ``cupy_module``) import this module as their
``cupy`` through :func:`activate`. They learn the kernels from the builder through
:func:`register_kernels` (the simulation hook the CUDA builder calls when its ``cupy`` has it): the loop IR
of each kernel is pickled into ``$KILN_FAKE_CUPY_DIR`` under the hash of its source, where
``RawModule(code=source)`` of any process finds it.

Fault injection (``$KILN_FAKE_CUPY_FAULTS``, JSON ``{kernel name prefix: fault}``, read at each use, so
spawned workers see what the test set): ``compile_error`` (NVRTC rejects the source with an error line in
the kernel), ``compile_hang`` (NVRTC never returns), ``resources`` (the kernel allows 0 threads per block:
too many registers), ``sticky`` (the launch raises an illegal-address error and every later CUDA call of
the process fails), ``hang`` (the launch never returns), ``wrong_result`` (the kernel runs, then its first
output is off by one), ``oob`` (the kernel runs, then writes 4 bytes past the end of its first output)."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import sys
import time
import types
from pathlib import Path
from typing import Any

import numpy as np

from compiler.loopir import run_func

KERNELS: dict[str, object] = {}
LAUNCHES: list[tuple[str, tuple, tuple, int]] = []
REGISTRY_ENV = "KILN_FAKE_CUPY_DIR"  # directory of pickled kernels shared by processes
FAULTS_ENV = "KILN_FAKE_CUPY_FAULTS"  # JSON {kernel name prefix: fault}
FAULTS = ("compile_error", "compile_hang", "resources", "sticky", "hang", "wrong_result", "oob")
_sticky: list[str] = []  # the error that poisoned this process's "context"


class CUDARuntimeError(RuntimeError):
    """What CuPy raises for a failed CUDA call."""


def fault(name: str) -> str | None:
    """The fault injected into kernel ``name`` (see the module docstring), or None."""
    spec = json.loads(os.environ.get(FAULTS_ENV) or "{}")
    for prefix, what in spec.items():
        if name.startswith(prefix):
            if what not in FAULTS:
                raise ValueError(f"unknown fault {what!r}; known: {', '.join(FAULTS)}")
            return what
    return None


def _check_sticky() -> None:
    if _sticky:
        raise CUDARuntimeError(_sticky[0])


def _source_key(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:32]


def register_kernels(source: str, kernels: dict[str, object]) -> None:
    """The simulation hook: the loop IR (lowered PrimFunc of one kernel each) of the kernels of ``source``,
    for this process (``KERNELS``) and, under ``$KILN_FAKE_CUPY_DIR``, for every other one."""
    KERNELS.update(kernels)
    root = os.environ.get(REGISTRY_ENV)
    if root:
        path = Path(root) / f"{_source_key(source)}.pkl"
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(pickle.dumps(kernels))
        os.replace(tmp, path)


def _registered(source: str | None) -> dict[str, object]:
    root = os.environ.get(REGISTRY_ENV)
    if source is None or not root:
        return {}
    path = Path(root) / f"{_source_key(source)}.pkl"
    return pickle.loads(path.read_bytes()) if path.exists() else {}


def activate() -> types.ModuleType:
    """Make ``import cupy`` give this module in this whole process (a spawned worker: nothing to undo)."""
    fake = sys.modules[__name__]
    for name in list(sys.modules):
        if name.split(".")[0] in REAL_CUPY_PACKAGES:
            del sys.modules[name]
    sys.modules["cupy"] = fake
    sys.modules["cupy_backends"] = None  # type: ignore[assignment]
    return fake


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
    _check_sticky()
    return np.empty(shape, dtype).view(ndarray)


def asarray(x, dtype=None):
    _check_sticky()
    return np.array(x, dtype=dtype).view(ndarray)


def asnumpy(x):
    return np.array(x)


uint8 = np.uint8
float32 = np.float32


class RawKernel:
    def __init__(self, name, func=None):
        self.name = name
        self.func = func
        self.max_dynamic_shared_size_bytes = 0
        self.attributes = {
            "max_threads_per_block": 1024,
            "num_regs": 32,
            "shared_size_bytes": 0,
            "local_size_bytes": 0,
        }
        if fault(name) == "resources":
            self.attributes.update(max_threads_per_block=0, num_regs=255, local_size_bytes=4096)

    def __call__(self, grid, block, args, shared_mem=0):
        _check_sticky()
        if _capturing:
            _capturing[-1].append((self, grid, block, args, shared_mem))
            return
        func = self.func if self.func is not None else KERNELS[self.name]
        LAUNCHES.append((self.name, tuple(grid), tuple(block), shared_mem))
        what = fault(self.name)
        if what == "sticky":
            _sticky.append("cudaErrorIllegalAddress: an illegal memory access was encountered")
            _check_sticky()
        if what == "hang":
            while True:
                time.sleep(1.0)
        arrays = [np.asarray(a) for a in args]
        run_func(func, arrays)
        out = arrays[func.num_inputs] if len(arrays) > func.num_inputs else None
        if what == "wrong_result" and out is not None:
            out.reshape(-1)[0] += 1
        if what == "oob" and out is not None:
            import ctypes

            ctypes.memset(out.ctypes.data + out.nbytes, 0x11, 4)  # inside the runner's guard region


class RawModule:
    def __init__(self, code=None, path=None, options=(), backend="nvrtc"):
        self.code, self.path = code, path
        self._kernels: dict[str, object] | None = None

    def compile(self):
        _check_sticky()
        if self.code is None:
            return None
        for line_no, line in enumerate(self.code.splitlines(), 1):
            m = re.search(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", line)
            if m and fault(m.group(1)) == "compile_hang":
                while True:
                    time.sleep(1.0)
            if m and fault(m.group(1)) == "compile_error":
                raise CUDARuntimeError(
                    f'kiln.cu({line_no + 1}): error: identifier "injected_fault" is undefined\n'
                    '1 error detected in the compilation of "kiln.cu".'
                )
        return None

    def get_function(self, name):
        _check_sticky()
        if self._kernels is None:
            self.compile()
            self._kernels = _registered(self.code)
        if name not in self._kernels and name not in KERNELS:
            raise RuntimeError(f"no kernel {name}")
        return RawKernel(name, self._kernels.get(name))  # KERNELS are looked up at launch


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
        _check_sticky()


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
