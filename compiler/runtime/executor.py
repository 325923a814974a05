"""CompiledModel: a whole model as one C library, run with a single ctypes call.

The library holds every kernel plus ``void kiln_run(void** buffers)``, which calls the launches in order;
``buffers[id]`` points at buffer ``id``. Intermediates live in one arena laid out by the memory plan;
outputs and the arena are allocated once and reused by every call (a fresh 48 MiB output would cost
milliseconds of page faults). Inputs are bound per call without copying when they are C-contiguous.

``run`` returns *copies* of the outputs by default, so a result is never overwritten by a later call.
``run(..., copy=False)`` returns the model's own output arrays (valid until the next call), and
``run(..., out=[...])`` writes into caller arrays and returns them.
"""

from __future__ import annotations

import ctypes
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from compiler.backends.cpu import gcc as cbuild
from compiler.dtypes import to_numpy
from compiler.errors import KilnError
from compiler.runtime.memory_plan import BufferSpec, Launch, plan_memory
from compiler.target import Target


@dataclass
class KernelInfo:
    """What a kernel was built from (opaque metadata carried into the manifest)."""

    name: str
    workload_key: str | None = None
    sketch: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # origin, sketch_version, group kind, ops

    def to_json(self) -> dict[str, Any]:
        return {
            **self.extra,
            "name": self.name,
            "workload_key": self.workload_key,
            "sketch": self.sketch,
            "config": self.config,
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> KernelInfo:
        core = ("name", "workload_key", "sketch", "config")
        return KernelInfo(
            data["name"],
            data.get("workload_key"),
            data.get("sketch"),
            data.get("config") or {},
            {k: v for k, v in data.items() if k not in core},
        )


def _describe(dtype: Any, shape: Sequence[int]) -> str:
    return f"{np.dtype(dtype).name}[{', '.join(str(int(d)) for d in shape)}]"


class CompiledModel:
    """A compiled model for the CPU; see the module docstring for the calling conventions."""

    def __init__(
        self,
        name: str,
        target: Target,
        source: str,
        kernels: Sequence[KernelInfo],
        buffers: Sequence[BufferSpec],
        launches: Sequence[Launch],
        params: Mapping[int, np.ndarray],
        inputs: Sequence[int],
        input_names: Sequence[str],
        outputs: Sequence[int],
        num_threads: int | None = None,
        library: cbuild.KernelLibrary | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        self.name, self.target, self.source = name, target, source
        self.meta: dict[str, Any] = dict(meta or {})  # model name, graph hash, output names ...
        self.kernels = list(kernels)
        self.buffers = list(buffers)
        self.launches = [a if isinstance(a, Launch) else Launch(a.kernel, a.args) for a in launches]
        self.inputs, self.input_names, self.outputs = list(inputs), list(input_names), list(outputs)
        if len(self.inputs) != len(self.input_names):
            raise KilnError("inputs and input_names differ in length")
        self.by_id = {b.id: b for b in self.buffers}
        self.plan = plan_memory(self.buffers, self.launches)
        self.roots = self.plan.roots
        for ids, role in ((self.inputs, "input"), (self.outputs, "output")):
            for i in ids:
                if i not in self.by_id or self.by_id[i].role != role:
                    raise KilnError(f"buffer id {i} is not an {role} buffer")
        self.params = {}
        for b in self.buffers:
            if b.role == "param" and b.alias_of is None:
                if b.id not in params:
                    raise KilnError(f"param {b.name!r} (id {b.id}) has no array")
                arr = np.ascontiguousarray(params[b.id], dtype=to_numpy(b.dtype))
                if arr.shape != b.shape:
                    raise KilnError(f"param {b.name!r}: expected shape {b.shape}, got {arr.shape}")
                self.params[b.id] = arr
        self.num_threads = num_threads or len(os.sched_getaffinity(0))
        self.library = library
        self._allocate()

    @classmethod
    def from_funcs(
        cls,
        name: str,
        funcs: Sequence[Any],
        buffers: Sequence[BufferSpec],
        launches: Sequence[Launch],
        params: Mapping[int, np.ndarray],
        inputs: Sequence[int],
        input_names: Sequence[str],
        outputs: Sequence[int],
        target: Target | None = None,
        kernels: Sequence[KernelInfo] | None = None,
        num_threads: int | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> CompiledModel:
        """Generate the C source of lowered ``funcs`` plus the ``kiln_run`` entry, and wrap it."""
        from compiler.backends.cpu.codegen import generate_c

        target = target or Target.host()
        source = generate_c(list(funcs), target, launches)
        infos = list(kernels) if kernels is not None else [KernelInfo(f.name) for f in funcs]
        return cls(
            name,
            target,
            source,
            infos,
            buffers,
            launches,
            params,
            inputs,
            input_names,
            outputs,
            num_threads,
            meta=meta,
        )

    @property
    def input_specs(self) -> list[dict[str, Any]]:
        return [
            {"name": n, "shape": list(self.by_id[i].shape), "dtype": self.by_id[i].dtype}
            for n, i in zip(self.input_names, self.inputs)
        ]

    @property
    def output_specs(self) -> list[dict[str, Any]]:
        names = self.meta.get("output_names") or [self.by_id[i].name for i in self.outputs]
        return [
            {"name": n, "shape": list(self.by_id[i].shape), "dtype": self.by_id[i].dtype}
            for n, i in zip(names, self.outputs)
        ]

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

    def _ensure_built(self) -> ctypes._CFuncPtr:  # type: ignore[name-defined]
        if self.library is None:
            self.library = cbuild.build(self.source)
        fn = getattr(self, "_run_fn", None)
        if fn is None:
            self.library.set_num_threads(self.num_threads)
            fn = self._run_fn = self.library.function("kiln_run", 1)
        return fn

    def _bind_root(self, root: int, arr: np.ndarray) -> None:
        ptr = arr.ctypes.data
        for i in self._groups[root]:
            self._slots[i] = ptr

    # ------------------------------------------------------------------ run
    def _check_inputs(self, inputs: Sequence[Any] | Mapping[str, Any]) -> list[np.ndarray]:
        if isinstance(inputs, Mapping):
            unknown = sorted(set(inputs) - set(self.input_names))
            if unknown:
                raise KilnError(
                    f"{self.name}: unknown input(s) {unknown}; the model takes {self.input_names}"
                )
            missing = [n for n in self.input_names if n not in inputs]
            if missing:
                raise KilnError(f"{self.name}: missing input(s) {missing}")
            values = [inputs[n] for n in self.input_names]
        else:
            values = list(inputs)
            if len(values) != len(self.inputs):
                raise KilnError(
                    f"{self.name}: expected {len(self.inputs)} input(s) {self.input_names}, got {len(values)}"
                )
        out = []
        for name, i, v in zip(self.input_names, self.inputs, values):
            spec = self.by_id[i]
            arr = np.asarray(v)
            want = to_numpy(spec.dtype)
            if arr.dtype != want or arr.shape != spec.shape:
                expected, got = _describe(want, spec.shape), _describe(arr.dtype, arr.shape)
                raise KilnError(f"input {name!r}: expected {expected}, got {got}")
            out.append(np.ascontiguousarray(arr))
        return out

    def _bind(
        self, inputs: Sequence[Any] | Mapping[str, Any], out: Sequence[np.ndarray] | None
    ) -> list[np.ndarray]:
        arrays = self._check_inputs(inputs)
        for i, arr in zip(self.inputs, arrays):
            self._bind_root(self.roots[i], arr)
        if out is not None and len(out) != len(self.outputs):
            raise KilnError(
                f"{self.name}: out= has {len(out)} arrays, the model has {len(self.outputs)} outputs"
            )
        results = []
        for k, o in enumerate(self.outputs):
            spec, r = self.by_id[o], self.roots[o]
            own = self._owned.get(o)
            if out is None:
                if own is not None:
                    self._bind_root(o, own)
                results.append(own if own is not None else np.empty(spec.shape, to_numpy(spec.dtype)))
                continue
            dst = out[k]
            want = to_numpy(spec.dtype)
            if not isinstance(dst, np.ndarray) or dst.dtype != want or dst.shape != spec.shape:
                got = _describe(dst.dtype, dst.shape) if isinstance(dst, np.ndarray) else type(dst).__name__
                raise KilnError(
                    f"out[{k}] ({spec.name!r}): expected {_describe(want, spec.shape)}, got {got}"
                )
            if not (dst.flags.c_contiguous and dst.flags.writeable):
                raise KilnError(f"out[{k}] ({spec.name!r}) must be a writeable C-contiguous array")
            if any(np.may_share_memory(dst, a) for a in arrays):
                raise KilnError(f"out[{k}] ({spec.name!r}) overlaps an input")
            if r == o:
                self._bind_root(o, dst)
            results.append(dst)
        return results

    def _finish(self, results: list[np.ndarray]) -> None:
        """Outputs that are views of another buffer (an input, a param, a pinned intermediate) are copied."""
        for o, dst in zip(self.outputs, results):
            r = self.roots[o]
            if r == o:
                continue
            src_ptr = self._slots[o]
            spec = self.by_id[o]
            src = np.ctypeslib.as_array(ctypes.cast(src_ptr, ctypes.POINTER(ctypes.c_uint8)), (spec.nbytes,))
            dst.reshape(-1).view(np.uint8)[:] = src

    def run(
        self,
        inputs: Sequence[Any] | Mapping[str, Any],
        out: Sequence[np.ndarray] | None = None,
        copy: bool = True,
    ) -> list[np.ndarray]:
        """Run the model on ``inputs`` (a list in input order, or a dict by name); see the module doc."""
        fn = self._ensure_built()
        results = self._bind(inputs, out)
        fn(self._slots)
        self._finish(results)
        if out is None and copy:
            return [r.copy() for r in results]
        return results

    __call__ = run

    def timeit(
        self, inputs: Sequence[Any] | Mapping[str, Any], repeats: int = 10, warmup: int = 2
    ) -> dict[str, Any]:
        """Time ``kiln_run`` with the buffers already bound; microseconds (median and every sample)."""
        fn = self._ensure_built()
        self._bind(inputs, None)
        slots = self._slots
        for _ in range(warmup):
            fn(slots)
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter_ns()
            fn(slots)
            samples.append((time.perf_counter_ns() - t0) / 1e3)
        return {
            "median_us": statistics.median(samples),
            "min_us": min(samples),
            "mean_us": statistics.fmean(samples),
            "samples_us": samples,
            "repeats": repeats,
            "warmup": warmup,
            "threads": self.num_threads,
        }

    # ----------------------------------------------------------- save / load
    def save(self, directory: str | Path) -> Path:
        """Write the model to ``directory`` (manifest.json, model.c, model.so, params.npz)."""
        from compiler.runtime.artifact import save

        return save(self, Path(directory))

    @staticmethod
    def load(directory: str | Path, num_threads: int | None = None) -> CompiledModel:
        """Load a saved model; recompiles from the saved C source when the shared object cannot be used."""
        from compiler.runtime.artifact import load

        return load(Path(directory), num_threads)
