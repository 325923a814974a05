"""CudaCompiledModel: the CUDA launch step of :class:`~compiler.runtime.executor.CompiledModel`, over
CuPy arrays.

The same buffers, launches and memory plan as every compiled model (``compiler.runtime.memory_plan``):
intermediates live in one device arena, params are uploaded once, outputs are allocated once and reused.
Each launch of a kernel group runs its ``__global__`` kernels (usually one) with the grid and block its
loop bindings give (``kernel_launches``, from ``func.attrs["launch"]``; saved in the manifest).

* ``run(inputs)`` takes numpy or CuPy arrays and returns numpy copies of the outputs (``out=`` fills
  caller host arrays); ``run_device(inputs)`` returns the model's own CuPy output arrays (overwritten by
  the next call) without a host copy.
* ``cuda_graph=True`` captures the whole launch list once into a CUDA Graph (inputs are staged into
  model-owned device buffers so the graph's pointers stay valid) and replays it on the current stream,
  without host synchronisation; ``graph_inputs()`` hands out those buffers, and passing them back skips
  the staging copies.
* ``timeit`` measures with CUDA events (``flush_l2=True`` flushes L2 between runs).
* Nothing touches CuPy before the first run, so a model compiles and saves on a machine without a GPU;
  running there raises CudaUnavailable with the install hint.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from compiler.backends import get_backend
from compiler.backends.cuda import nvrtc
from compiler.backends.cuda.codegen import kernel_launches
from compiler.backends.cuda.device import cupy_or_none, require_cupy
from compiler.dtypes import to_numpy
from compiler.errors import KilnError
from compiler.runtime.artifact import SavedModel
from compiler.runtime.executor import CompiledModel, Inputs
from compiler.target import Target

L2_FLUSH_BYTES = 256 << 20


class CudaCompiledModel(CompiledModel):
    """A compiled model for the cuda target; see the module docstring."""

    backend: ClassVar[str] = "cuda"
    source_name: ClassVar[str] = "model.cu"

    def __init__(
        self, *args: Any, kernel_launches: Mapping[str, list[dict[str, Any]]], **kwargs: Any
    ) -> None:
        """The arguments of :class:`~compiler.runtime.executor.CompiledModel`, plus each kernel group's
        ``__global__`` kernels with their grid, block and dynamic shared memory."""
        super().__init__(*args, **kwargs)
        self.kernel_launches = {k: [dict(x) for x in v] for k, v in kernel_launches.items()}
        for launch in self.launches:
            if launch.kernel not in self.kernel_launches:
                raise KilnError(f"launch of unknown kernel {launch.kernel!r}")
        self._ready = False
        self._graph: tuple[Any, Any] | None = None

    @classmethod
    def default_target(cls) -> Target:
        return Target.cuda()

    @classmethod
    def _funcs_state(cls, funcs: Sequence[Any]) -> dict[str, Any]:
        return {"kernel_launches": {f.name: kernel_launches(f) for f in funcs}}

    # ---------------------------------------------------------------- setup
    def _ensure_ready(self) -> Any:
        cp = require_cupy()
        if self._ready:
            return cp
        self.module = get_backend(self.target).compile_module(self.source, self.target)
        self._calls: list[list[tuple[Any, dict[str, Any]]]] = []
        for launch in self.launches:
            parts = []
            for info in self.kernel_launches[launch.kernel]:
                fn = self.module.function(info["name"])
                nvrtc.prepare_kernel(fn, info["name"], info)
                parts.append((fn, info))
            self._calls.append(parts)
        self._arena = cp.empty(max(self.plan.peak_bytes, 1), dtype=cp.uint8)
        self._dev: dict[int, Any] = {}
        for b in self.buffers:
            r = self.roots[b.id]
            if r != b.id:
                continue
            if r in self.plan.offsets:
                off = self.plan.offsets[r]
                self._dev[r] = self._arena[off : off + b.nbytes].view(to_numpy(b.dtype)).reshape(b.shape)
            elif r in self.params:
                self._dev[r] = cp.asarray(self.params[r])
            elif b.role != "input":  # outputs and pinned intermediates
                self._dev[r] = cp.empty(b.shape, dtype=to_numpy(b.dtype))
        self._staged = {
            i: cp.empty(self.by_id[i].shape, dtype=to_numpy(self.by_id[i].dtype)) for i in self.inputs
        }
        self._ready = True
        return cp

    def _array(self, cp: Any, bound: dict[int, Any], i: int) -> Any:
        r = self.roots[i]
        base = bound.get(r)
        if base is None:
            base = self._dev[r]
        b = self.by_id[i]
        return base if base.shape == b.shape else base.reshape(b.shape)

    def _as_input(self, value: Any) -> Any:
        cp = cupy_or_none()
        if cp is not None and isinstance(value, cp.ndarray):
            return value  # already on the device
        return np.asarray(value)

    def _bind(self, cp: Any, values: list[Any], staged: bool) -> dict[int, Any]:
        """Root buffer id -> device array of each (checked) input: the caller's device array when it can
        be used as is, else the model's staging buffer filled from it."""
        bound: dict[int, Any] = {}
        for i, v in zip(self.inputs, values):
            on_device = isinstance(v, cp.ndarray)
            if on_device and not staged and v.flags.c_contiguous and v.data.ptr % 16 == 0:
                bound[self.roots[i]] = v
            else:
                dst = self._staged[i]
                if v is dst:  # the caller filled the staging buffer itself (graph_inputs)
                    pass
                elif on_device:
                    dst[...] = v
                else:
                    dst.set(np.ascontiguousarray(v))
                bound[self.roots[i]] = dst
        return bound

    def _enqueue(self, cp: Any, bound: dict[int, Any]) -> None:
        """Launch every kernel in order on the current stream."""
        for launch, parts in zip(self.launches, self._calls):
            args = tuple(self._array(cp, bound, a) for a in launch.args)
            for fn, info in parts:
                nvrtc.launch(fn, info, args)

    def _outputs(self, cp: Any) -> list[Any]:
        # an output is its own array, or a view of a pinned intermediate (assemble copies inputs/params)
        return [self._array(cp, {}, o) for o in self.outputs]

    def _graph_of(self, cp: Any) -> tuple[Any, Any]:
        """The CUDA Graph of the whole launch list (captured once, over the staged input buffers)."""
        if self._graph is None:
            stream = cp.cuda.Stream(non_blocking=True)
            bound = {self.roots[i]: self._staged[i] for i in self.inputs}
            cp.cuda.Device().synchronize()
            with stream:
                stream.begin_capture()
                self._enqueue(cp, bound)
                self._graph = (stream.end_capture(), stream)
        return self._graph

    def _replay(self, cp: Any) -> None:
        graph, _ = self._graph_of(cp)
        # on the current stream: after the staging copies enqueued there, before whatever reads the outputs
        # (no host synchronisation; captured on a side stream, a graph can be launched on any stream)
        graph.launch(cp.cuda.get_current_stream())

    def graph_inputs(self) -> dict[str, Any]:
        """The device buffers a CUDA Graph replay reads its inputs from, by input name: fill them in place
        and pass them back to ``run_device(..., cuda_graph=True)`` to replay without staging copies."""
        self._ensure_ready()
        return {name: self._staged[i] for name, i in zip(self.input_names, self.inputs)}

    # ---------------------------------------------------------- launch step
    def run_device(self, inputs: Inputs, cuda_graph: bool = False) -> list[Any]:
        """Run on the current stream; returns the model's own CuPy output arrays (reused by later calls)."""
        return self._run_on_device(self._check_inputs(inputs), cuda_graph)

    def _run_on_device(self, values: list[Any], cuda_graph: bool) -> list[Any]:
        cp = self._ensure_ready()
        if cuda_graph:
            self._bind(cp, values, staged=True)
            self._replay(cp)
        else:
            self._enqueue(cp, self._bind(cp, values, staged=False))
        return self._outputs(cp)

    def _execute(
        self, values: list[Any], out: list[np.ndarray] | None, copy: bool, cuda_graph: bool = False
    ) -> list[np.ndarray]:
        """Host copies of the outputs (always fresh arrays, whatever ``copy`` says), or ``out`` filled."""
        outs = self._run_on_device(values, cuda_graph)
        if out is None:
            return [o.get() for o in outs]
        for dst, src in zip(out, outs):
            src.get(out=dst)
        return out

    def _time(
        self,
        values: list[Any],
        repeats: int,
        warmup: int,
        cuda_graph: bool = False,
        flush_l2: bool = False,
    ) -> tuple[list[float], dict[str, Any]]:
        """CUDA events around each run, inputs bound once (``flush_l2``: L2 written over before each)."""
        cp = self._ensure_ready()
        bound = self._bind(cp, values, staged=cuda_graph)
        scratch = cp.empty(L2_FLUSH_BYTES, dtype=cp.uint8) if flush_l2 else None

        graph, stream = self._graph_of(cp) if cuda_graph else (None, cp.cuda.get_current_stream())

        def once() -> None:
            if graph is not None:
                graph.launch(stream)
            else:
                self._enqueue(cp, bound)

        for _ in range(warmup):
            once()
        cp.cuda.Device().synchronize()
        samples = []
        for _ in range(repeats):
            if scratch is not None:
                scratch.fill(0)
                cp.cuda.Device().synchronize()
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            once()
            end.record(stream)
            end.synchronize()
            samples.append(cp.cuda.get_elapsed_time(start, end) * 1e3)
        return samples, {"cuda_graph": cuda_graph, "flush_l2": flush_l2}

    # ----------------------------------------------------------- save / load
    def _saved_extra(self) -> tuple[dict[str, Any], dict[str, bytes]]:
        return {"kernel_launches": self.kernel_launches}, {}  # building is not needed to save

    @classmethod
    def _from_saved(cls, saved: SavedModel, fields: dict[str, Any]) -> CudaCompiledModel:
        return cls(**fields, kernel_launches=saved.manifest["kernel_launches"])
