"""CpuCompiledModel: the CPU launch step of :class:`~compiler.runtime.executor.CompiledModel`.

The model is one C library (built with gcc, :mod:`compiler.backends.cpu.gcc`) holding every kernel plus
``void kiln_run(void** buffers)``, which calls the launches in order; ``buffers[id]`` points at buffer
``id``, so a run is a single ctypes call. Intermediates live in one arena laid out by the memory plan;
outputs and the arena are allocated once and reused by every call (a fresh 48 MiB output would cost
milliseconds of page faults). Inputs are bound per call without copying when they are C-contiguous, and
``out=`` arrays are written in place (they must not overlap an input).

A saved CPU model also holds ``model.so``; loading uses it only when it was built on a CPU like this one
(same target key and features: ``-march=native`` code may not run elsewhere) by the same gcc, and
otherwise rebuilds ``model.c`` through the kernel cache.
"""

from __future__ import annotations

import ctypes
import os
import time
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from compiler.backends import get_backend
from compiler.backends.cpu import gcc
from compiler.dtypes import to_numpy
from compiler.errors import CompileError, KilnError
from compiler.runtime.artifact import SavedModel
from compiler.runtime.executor import CompiledModel
from compiler.target import Target


def _host() -> dict[str, Any]:
    t = Target.host()
    return {"key": t.key, "features": list(t.features)}


class CpuCompiledModel(CompiledModel):
    """A compiled model for the CPU: ``num_threads`` OpenMP threads (default: this process's CPUs);
    ``library`` is the loaded :class:`~compiler.backends.cpu.gcc.KernelLibrary` (built on first use)."""

    backend: ClassVar[str] = "cpu"
    source_name: ClassVar[str] = "model.c"

    def __init__(
        self,
        *args: Any,
        num_threads: int | None = None,
        library: gcc.KernelLibrary | None = None,
        **kwargs: Any,
    ) -> None:
        """The arguments of :class:`~compiler.runtime.executor.CompiledModel`, plus the CPU's own."""
        super().__init__(*args, **kwargs)
        self.num_threads = num_threads or len(os.sched_getaffinity(0))
        self.library = library
        self._run_fn: Any = None
        self._allocate()

    # ---------------------------------------------------------------- setup
    def _allocate(self) -> None:
        self._arena_raw = np.empty(self.plan.peak_bytes + 64, np.uint8)
        shift = (-self._arena_raw.ctypes.data) % 64
        self._arena = self._arena_raw[shift : shift + self.plan.peak_bytes]
        self._owned: dict[int, np.ndarray] = {}
        for b in self.buffers:
            r = self.roots[b.id]
            if r != b.id or r in self.plan.offsets or b.role in ("input", "param"):
                continue
            self._owned[r] = np.empty(b.shape, to_numpy(b.dtype))  # outputs and pinned intermediates
        self._slots = (ctypes.c_void_p * (max(self.by_id, default=0) + 1))()
        self._groups: dict[int, list[int]] = {}
        for b in self.buffers:
            self._groups.setdefault(self.roots[b.id], []).append(b.id)
        for b in self.buffers:
            r = self.roots[b.id]
            if r in self.plan.offsets:
                self._slots[b.id] = self._arena.ctypes.data + self.plan.offsets[r]
            elif r in self.params:
                self._slots[b.id] = self.params[r].ctypes.data
            elif r in self._owned:
                self._slots[b.id] = self._owned[r].ctypes.data

    def _ensure_built(self) -> Any:
        """``kiln_run`` of the library (built, or fetched from the kernel cache, on first use)."""
        if self.library is None:
            self.library = get_backend(self.target).compile_module(self.source, self.target)
        if self._run_fn is None:
            self.library.set_num_threads(self.num_threads)
            self._run_fn = self.library.function("kiln_run", 1)
        return self._run_fn

    def _bind_root(self, root: int, arr: np.ndarray) -> None:
        ptr = arr.ctypes.data
        for i in self._groups[root]:
            self._slots[i] = ptr

    def _bind(self, values: list[Any], out: list[np.ndarray] | None) -> list[np.ndarray]:
        """Point the slots at the inputs and the output arrays; returns the arrays the outputs land in."""
        arrays = [np.ascontiguousarray(v) for v in values]
        for i, arr in zip(self.inputs, arrays):
            self._bind_root(self.roots[i], arr)
        results = []
        for k, o in enumerate(self.outputs):
            own = self._owned.get(o)
            if out is None:
                if own is not None:
                    self._bind_root(o, own)
                spec = self.by_id[o]
                results.append(own if own is not None else np.empty(spec.shape, to_numpy(spec.dtype)))
                continue
            dst = out[k]
            if any(np.may_share_memory(dst, a) for a in arrays):
                raise KilnError(f"out[{k}] ({self.by_id[o].name!r}) overlaps an input")
            if self.roots[o] == o:
                self._bind_root(o, dst)
            results.append(dst)
        return results

    def _finish(self, results: list[np.ndarray]) -> None:
        """Outputs that are views of another buffer (an input, a param, a pinned intermediate) are copied."""
        for o, dst in zip(self.outputs, results):
            if self.roots[o] == o:
                continue
            spec = self.by_id[o]
            src_ptr = ctypes.cast(self._slots[o], ctypes.POINTER(ctypes.c_uint8))
            dst.reshape(-1).view(np.uint8)[:] = np.ctypeslib.as_array(src_ptr, (spec.nbytes,))

    # ---------------------------------------------------------- launch step
    def _execute(
        self, values: list[Any], out: list[np.ndarray] | None, copy: bool, **options: Any
    ) -> list[np.ndarray]:
        if options:
            raise KilnError(f"{self.name}: the CPU model takes no run options {sorted(options)}")
        fn = self._ensure_built()
        results = self._bind(values, out)
        fn(self._slots)
        self._finish(results)
        if out is None and copy:
            return [r.copy() for r in results]
        return results

    def _time(
        self, values: list[Any], repeats: int, warmup: int, **options: Any
    ) -> tuple[list[float], dict[str, Any]]:
        if options:
            raise KilnError(f"{self.name}: the CPU model takes no timing options {sorted(options)}")
        fn = self._ensure_built()
        self._bind(values, None)
        slots = self._slots
        for _ in range(warmup):
            fn(slots)
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter_ns()
            fn(slots)
            samples.append((time.perf_counter_ns() - t0) / 1e3)
        return samples, {"threads": self.num_threads}

    # ----------------------------------------------------------- save / load
    def _saved_extra(self) -> tuple[dict[str, Any], dict[str, bytes]]:
        self._ensure_built()
        assert self.library is not None
        fields = {
            "built_on": _host(),
            "compiler": gcc.compiler_id(),
            "flags": list(gcc.FLAGS),
            "library": "model.so",
            "num_threads": self.num_threads,
        }
        return fields, {"model.so": self.library.path.read_bytes()}

    @classmethod
    def _from_saved(
        cls, saved: SavedModel, fields: dict[str, Any], num_threads: int | None = None
    ) -> CpuCompiledModel:
        manifest = saved.manifest
        library = None
        so = Path(saved.directory) / manifest["library"]
        same_host = manifest.get("built_on") == _host() and manifest.get("compiler") == gcc.compiler_id()
        if same_host and so.exists():
            try:
                library = gcc.KernelLibrary(so)
            except CompileError:
                library = None
        if library is None:
            library = gcc.build(saved.source)
        return cls(**fields, num_threads=num_threads, library=library)
