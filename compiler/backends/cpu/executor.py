"""CpuCompiledModel: the CPU launch step of :class:`~compiler.runtime.executor.CompiledModel`.

The model is one C library (built with gcc, :mod:`compiler.backends.cpu.gcc`) holding every kernel plus
``void kiln_run(void** buffers)``, which calls the launches in order; ``buffers[id]`` points at buffer
``id``, so a run is a single ctypes call. Intermediates live in one arena laid out by the memory plan;
the arena is allocated once. ``run(inputs)`` binds output arrays from an
:class:`~compiler.runtime.executor.OutputPool` and the kernels write into them (no copy pass; arrays the
caller dropped are reused, so a loop pays no page faults for fresh 48 MiB outputs); ``timeit`` and
``copy=False`` use the model's own output arrays. Inputs are bound per call without copying when they are
C-contiguous (the same array passed again is not even re-read). The generated code assumes nothing about
an input's alignment (unaligned vector loads, correct at any address), but a kernel that re-reads a
misaligned input from cache can run 2x slower (MobileNetV2's first kernel with an oc 4 x 112 px tile: 43 vs
83 us), so a misaligned input of at most a quarter of the target's L2 (:data:`STAGE_L2_FRACTION`; a
98 KiB copy costs ~3 us) is copied into a 64-byte aligned staging array the model owns (one per input,
allocated on first need, refreshed on every call and every call of :meth:`bind`'s function, since the
caller may change the array in between). Larger ones are read in place: copying a 6-16 MiB input cost
more than the misalignment (rmsnorm, softmax_large through ``run()``: 0.48x / 0.61x staged vs 0.76x /
0.98x in place, relative to an aligned input). numpy gives 16-byte alignment (malloc), so most inputs
are misaligned unless made with :func:`~compiler.runtime.executor.aligned_empty`.
``out=`` arrays are written in place (they must not overlap an input). Scratch buffers over 64 KiB inside a
kernel are per-thread arrays kept across calls (:mod:`compiler.backends.cpu.codegen`). One model object
runs one call at a time (its buffer slots are shared). One call costs a few microseconds of Python around
the one ctypes call into ``kiln_run``.

A saved CPU model also holds ``model.so``; loading uses it only when it was built on a CPU like this one
(same target key and features: ``-march=native`` code may not run elsewhere) by the same gcc, and
otherwise rebuilds ``model.c`` through the kernel cache. Its parallel loops call the process's one thread
pool (:mod:`compiler.backends.cpu.pool`), a runtime library that loading builds into the kernel cache when
missing and loads first; a ``model.so`` saved before that carries its own pool and still loads.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from compiler.backends import get_backend
from compiler.backends.cpu import gcc
from compiler.dtypes import to_numpy
from compiler.errors import CompileError, KilnError
from compiler.runtime.artifact import SavedModel
from compiler.runtime.executor import CompiledModel, OutputPool, aligned_empty
from compiler.target import Target

# misaligned inputs of at most this fraction of the target's L2 are staged (see the module doc)
STAGE_L2_FRACTION = 0.25


def _host() -> dict[str, Any]:
    t = Target.host()
    return {"key": t.key, "features": list(t.features)}


class CpuCompiledModel(CompiledModel):
    """A compiled model for the CPU: ``num_threads`` threads per parallel loop, the calling one included
    (default: this process's CPUs; :mod:`compiler.backends.cpu.pool`);
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
        self._prepare_calls()

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
            self._owned[r] = aligned_empty(b.shape, to_numpy(b.dtype))  # outputs and pinned intermediates
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

    def _bind_root(self, root: int, ptr: int) -> None:
        for i in self._groups[root]:
            self._slots[i] = ptr

    def _prepare_calls(self) -> None:
        """What every call needs, computed once: the output pool, which outputs are written in place."""
        self._direct = [self.roots[o] == o for o in self.outputs]
        self._pool = OutputPool([(self.by_id[o].shape, to_numpy(self.by_id[o].dtype)) for o in self.outputs])
        self._in_roots = [self.roots[i] for i in self.inputs]
        self._last_in: list[Any] = [None] * len(self.inputs)
        self._staging: list[np.ndarray | None] = [None] * len(self.inputs)  # aligned copies, see the doc
        self._staged = [False] * len(self.inputs)  # input k of the last call was copied into its staging
        self._stage_limit = int(getattr(self.target, "l2_bytes", 1 << 20) * STAGE_L2_FRACTION)
        self._binding: object | None = None  # the bind() call whose arrays the slots point at
        self._last_out: list[tuple[np.ndarray, int] | None] = [None] * len(self.outputs)
        self._own_ptrs = [(o, self._owned[o].ctypes.data) for o in self.outputs if o in self._owned]
        self._own_results = [
            self._owned.get(o, np.empty(self.by_id[o].shape, to_numpy(self.by_id[o].dtype)))
            for o in self.outputs
        ]

    def _stage(self, k: int, arr: np.ndarray) -> int:
        """Copy input ``k`` into its 64-byte aligned staging array (allocated once); returns its address."""
        staging = self._staging[k]
        if staging is None:
            staging = self._staging[k] = aligned_empty(arr.shape, arr.dtype)
        np.copyto(staging, arr)
        return staging.ctypes.data

    def _refresh_staged(self, values: list[np.ndarray]) -> None:
        """Copy the inputs bound through staging arrays again (their arrays may have changed)."""
        for k, v in enumerate(values):
            if self._staged[k]:
                np.copyto(self._staging[k], v)  # type: ignore[arg-type]

    def _bind_inputs(self, values: list[Any]) -> list[np.ndarray]:
        """Point the input slots at the inputs (no copy when C-contiguous, except a small misaligned one:
        then at its staging copy). The arrays of the last call are kept, so passing the same array again skips
        reading its address (~1 us each); a staged one is copied again."""
        arrays = []
        for k, (root, v) in enumerate(zip(self._in_roots, values)):
            if v is self._last_in[k]:
                if self._staged[k]:
                    np.copyto(self._staging[k], v)  # type: ignore[arg-type]
                arrays.append(v)
                continue
            arr = np.ascontiguousarray(v)
            ptr = arr.ctypes.data
            self._staged[k] = ptr % 64 != 0 and arr.nbytes <= self._stage_limit
            if self._staged[k]:
                ptr = self._stage(k, arr)
            self._bind_root(root, ptr)
            self._last_in[k] = arr if arr is v else None
            self._last_out = [None] * len(self.outputs)  # out= arrays were checked against other inputs
            arrays.append(arr)
        return arrays

    def _bind(self, values: list[Any], out: list[np.ndarray] | None) -> list[np.ndarray]:
        """Point the slots at the inputs and the model's own output arrays (timing, ``copy=False``) or the
        caller's ``out`` arrays; returns the arrays the outputs land in. ``out`` arrays of the last call
        passed again, with no input changed since, are not checked for overlap again."""
        arrays = self._bind_inputs(values)
        self._binding = None
        if out is None:
            for o, ptr in self._own_ptrs:
                self._bind_root(o, ptr)
            return list(self._own_results)
        for k, (o, dst) in enumerate(zip(self.outputs, out)):
            last = self._last_out[k]
            if last is not None and last[0] is dst:
                ptr = last[1]
            else:
                if any(np.may_share_memory(dst, a) for a in arrays):
                    raise KilnError(f"out[{k}] ({self.by_id[o].name!r}) overlaps an input")
                ptr = dst.ctypes.data
                self._last_out[k] = (dst, ptr)
            if self._direct[k]:
                self._bind_root(o, ptr)
        return list(out)

    def _bind_fresh(self, values: list[Any]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Bind the inputs and output arrays from the pool (fresh to the caller: no one else holds them);
        returns the outputs and the bound inputs (kept alive until the call returns)."""
        arrays = self._bind_inputs(values)
        self._binding = None
        results, ptrs = self._pool.take()
        for o, direct, ptr in zip(self.outputs, self._direct, ptrs):
            if direct:
                self._bind_root(o, ptr)
        return results, arrays

    def _finish(self, results: list[np.ndarray]) -> None:
        """Outputs that are views of another buffer (an input, a param, a pinned intermediate) are copied."""
        for o, direct, dst in zip(self.outputs, self._direct, results):
            if direct:
                continue
            spec = self.by_id[o]
            src_ptr = ctypes.cast(self._slots[o], ctypes.POINTER(ctypes.c_uint8))
            dst.reshape(-1).view(np.uint8)[:] = np.ctypeslib.as_array(src_ptr, (spec.nbytes,))

    def _bound(self, values: list[Any], out: list[np.ndarray] | None) -> Callable[[], list[np.ndarray]]:
        fn = self._run_fn or self._ensure_built()
        values = [np.ascontiguousarray(v) for v in values]  # kept alive with the call (copied once if needed)
        results = self._bind(values, out)
        token = self._binding = object()
        slots, finish = self._slots, not all(self._direct)
        staged = any(self._staged)

        def call() -> list[np.ndarray]:
            if self._binding is not token:  # another call bound other arrays since
                self._bind(values, out)
                self._binding = token
            elif staged:
                self._refresh_staged(values)
            fn(slots)
            if finish:
                self._finish(results)
            return results

        return call

    # ---------------------------------------------------------- launch step
    def _execute(
        self, values: list[Any], out: list[np.ndarray] | None, copy: bool, **options: Any
    ) -> list[np.ndarray]:
        if options:
            raise KilnError(f"{self.name}: the CPU model takes no run options {sorted(options)}")
        fn = self._run_fn or self._ensure_built()
        if out is None and copy:
            results, _bound = self._bind_fresh(values)
        else:
            results = self._bind(values, out)
        fn(self._slots)
        self._finish(results)
        return results

    def _time(
        self, values: list[Any], repeats: int, warmup: int, **options: Any
    ) -> tuple[list[float], dict[str, Any]]:
        if options:
            raise KilnError(f"{self.name}: the CPU model takes no timing options {sorted(options)}")
        fn = self._ensure_built()
        values = [np.ascontiguousarray(v) for v in values]  # alive while the slots point at them
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
            "flags": list(gcc.flags_for(self.source)),
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
