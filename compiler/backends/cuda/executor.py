"""CudaCompiledModel: a whole model as one CUDA module, run over CuPy arrays.

The same buffers, launches and memory plan as the CPU :class:`~compiler.runtime.executor.CompiledModel`
(``compiler.runtime.memory_plan``): intermediates live in one device arena, params are uploaded once,
outputs are allocated once and reused. Each launch of a kernel group runs its ``__global__`` kernels
(usually one) with the grid and block its loop bindings give (``func.attrs["launch"]``).

* ``run(inputs)`` takes numpy or CuPy arrays and returns numpy copies of the outputs (``out=`` fills
  caller host arrays); ``run_device(inputs)`` returns the model's own CuPy output arrays (overwritten by
  the next call) without a host copy.
* ``cuda_graph=True`` captures the whole launch list once into a CUDA Graph (inputs are staged into
  model-owned device buffers so the graph's pointers stay valid) and replays it.
* ``timeit`` measures with CUDA events (optionally flushing L2 between runs).
* Nothing touches CuPy before the first run, so a model compiles and saves on a machine without a GPU;
  running there raises CudaUnavailable with the install hint.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from compiler.dtypes import to_numpy
from compiler.errors import KilnError
from compiler.runtime.executor import KernelInfo
from compiler.runtime.memory_plan import BufferSpec, Launch, plan_memory
from compiler.target import Target

FORMAT = "kiln-cuda-model"
FORMAT_VERSION = 1
L2_FLUSH_BYTES = 256 << 20


class CudaCompiledModel:
    """A compiled model for the cuda target; see the module docstring."""

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
        kernel_launches: Mapping[str, list[dict[str, Any]]],
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        self.name, self.target, self.source = name, target, source
        self.meta: dict[str, Any] = dict(meta or {})
        self.kernels = list(kernels)
        self.buffers = list(buffers)
        self.launches = [a if isinstance(a, Launch) else Launch(a.kernel, a.args) for a in launches]
        self.inputs, self.input_names, self.outputs = list(inputs), list(input_names), list(outputs)
        self.kernel_launches = {k: [dict(x) for x in v] for k, v in kernel_launches.items()}
        for launch in self.launches:
            if launch.kernel not in self.kernel_launches:
                raise KilnError(f"launch of unknown kernel {launch.kernel!r}")
        self.by_id = {b.id: b for b in self.buffers}
        self.plan = plan_memory(self.buffers, self.launches)
        self.roots = self.plan.roots
        self.params = {}
        for b in self.buffers:
            if b.role == "param" and b.alias_of is None:
                if b.id not in params:
                    raise KilnError(f"param {b.name!r} (id {b.id}) has no array")
                self.params[b.id] = np.ascontiguousarray(params[b.id], dtype=to_numpy(b.dtype))
        self._ready = False
        self._graph = None

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
        meta: Mapping[str, Any] | None = None,
        **_: Any,
    ) -> CudaCompiledModel:
        """Generate the CUDA source of lowered ``funcs`` and wrap it (nothing is built yet)."""
        from compiler.backends.cuda.codegen import generate_cuda, kernel_launches

        target = target or Target.cuda()
        source = generate_cuda(list(funcs), target)
        per_func = {f.name: kernel_launches(f) for f in funcs}
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
            per_func,
            meta,
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
    def _ensure_ready(self) -> Any:
        from compiler.backends.cuda import nvrtc as cuda
        from compiler.backends.cuda.device import device_arch, require_cupy

        cp = require_cupy()
        if self._ready:
            return cp
        self.module = cuda.build(self.source, device_arch(self.target))
        self._calls: list[list[tuple[Any, dict[str, Any]]]] = []
        for launch in self.launches:
            parts = []
            for info in self.kernel_launches[launch.kernel]:
                fn = self.module.function(info["name"])
                cuda.prepare_kernel(fn, info["name"], info)
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

    def _bind(self, cp: Any, inputs: Sequence[Any] | Mapping[str, Any], staged: bool) -> dict[int, Any]:
        if isinstance(inputs, Mapping):
            unknown = sorted(set(inputs) - set(self.input_names))
            missing = [n for n in self.input_names if n not in inputs]
            if unknown or missing:
                raise KilnError(
                    f"{self.name}: inputs do not match the model "
                    f"(unknown {unknown or 'none'}, missing {missing or 'none'})"
                )
            values = [inputs[n] for n in self.input_names]
        else:
            values = list(inputs)
            if len(values) != len(self.inputs):
                raise KilnError(
                    f"{self.name}: expected {len(self.inputs)} input(s) {self.input_names}, got {len(values)}"
                )
        bound: dict[int, Any] = {}
        for name, i, v in zip(self.input_names, self.inputs, values):
            spec = self.by_id[i]
            want = to_numpy(spec.dtype)
            if tuple(v.shape) != spec.shape or np.dtype(v.dtype) != want:
                raise KilnError(
                    f"input {name!r}: expected {want.name}{list(spec.shape)}, "
                    f"got {np.dtype(v.dtype).name}{list(v.shape)}"
                )
            on_device = isinstance(v, cp.ndarray)
            if on_device and not staged and v.flags.c_contiguous and v.data.ptr % 16 == 0:
                bound[self.roots[i]] = v
            else:
                dst = self._staged[i]
                if on_device:
                    dst[...] = v
                else:
                    dst.set(np.ascontiguousarray(v))
                bound[self.roots[i]] = dst
        return bound

    def _enqueue(self, cp: Any, bound: dict[int, Any]) -> None:
        """Launch every kernel in order on the current stream."""
        from compiler.backends.cuda import nvrtc as cuda

        for launch, parts in zip(self.launches, self._calls):
            args = tuple(self._array(cp, bound, a) for a in launch.args)
            for fn, info in parts:
                cuda.launch(fn, info, args)

    def _outputs(self, cp: Any) -> list[Any]:
        # an output is its own array, or a view of a pinned intermediate (assemble copies inputs/params)
        return [self._array(cp, {}, o) for o in self.outputs]

    # ------------------------------------------------------------------ run
    def run_device(self, inputs: Sequence[Any] | Mapping[str, Any], cuda_graph: bool = False) -> list[Any]:
        """Run on the current stream; returns the model's own CuPy output arrays (reused by later calls)."""
        cp = self._ensure_ready()
        if cuda_graph:
            self._bind(cp, inputs, staged=True)
            self._replay(cp)
        else:
            self._enqueue(cp, self._bind(cp, inputs, staged=False))
        return self._outputs(cp)

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
        graph, stream = self._graph_of(cp)
        cp.cuda.get_current_stream().synchronize()  # staged inputs were written on the current stream
        graph.launch(stream)
        stream.synchronize()

    def run(
        self,
        inputs: Sequence[Any] | Mapping[str, Any],
        out: Sequence[np.ndarray] | None = None,
        copy: bool = True,
        cuda_graph: bool = False,
    ) -> list[np.ndarray]:
        """Run the model; returns host (numpy) copies of the outputs, or fills ``out``."""
        outs = self.run_device(inputs, cuda_graph=cuda_graph)
        if out is not None:
            if len(out) != len(outs):
                raise KilnError(f"{self.name}: out= has {len(out)} arrays, the model has {len(outs)} outputs")
            for k, (dst, src) in enumerate(zip(out, outs)):
                if not isinstance(dst, np.ndarray) or dst.shape != src.shape or dst.dtype != src.dtype:
                    raise KilnError(f"out[{k}]: expected {src.dtype}{list(src.shape)}")
                src.get(out=dst)
            return list(out)
        return [o.get() for o in outs]

    __call__ = run

    def timeit(
        self,
        inputs: Sequence[Any] | Mapping[str, Any],
        repeats: int = 10,
        warmup: int = 2,
        cuda_graph: bool = False,
        flush_l2: bool = False,
    ) -> dict[str, Any]:
        """Median/min/mean of ``repeats`` timed runs in microseconds (CUDA events), inputs bound once."""
        cp = self._ensure_ready()
        bound = self._bind(cp, inputs, staged=cuda_graph)
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
        return {
            "median_us": statistics.median(samples),
            "min_us": min(samples),
            "mean_us": statistics.fmean(samples),
            "samples_us": samples,
            "repeats": repeats,
            "warmup": warmup,
            "cuda_graph": cuda_graph,
            "flush_l2": flush_l2,
        }

    # ----------------------------------------------------------- save / load
    def save(self, directory: str | Path) -> Path:
        """Write ``manifest.json``, ``model.cu`` and ``params.npz`` (building is not needed to save)."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        source = self.source.encode()
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "name": self.name,
            "target": self.target.to_json(),
            "source": "model.cu",
            "source_sha256": hashlib.sha256(source).hexdigest(),
            "params": "params.npz",
            "kernels": [k.to_json() for k in self.kernels],
            "kernel_launches": self.kernel_launches,
            "buffers": [b.to_json() for b in self.buffers],
            "launches": [launch.to_json() for launch in self.launches],
            "inputs": self.inputs,
            "input_names": self.input_names,
            "outputs": self.outputs,
            "memory_plan": self.plan.summary(),
            "meta": self.meta,
        }
        _write(d / "model.cu", source)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".params-", suffix=".npz")
        os.close(fd)
        np.savez(tmp, **{f"p{i}": a for i, a in self.params.items()})
        os.replace(tmp, d / "params.npz")
        _write(d / "manifest.json", json.dumps(manifest, indent=2, sort_keys=True).encode())
        return d / "manifest.json"

    @staticmethod
    def load(directory: str | Path) -> CudaCompiledModel:
        d = Path(directory)
        manifest = _manifest(d)
        if manifest.get("format") != FORMAT:
            raise KilnError(f"{d} is not a Kiln CUDA model (format {manifest.get('format')!r})")
        if manifest.get("format_version") != FORMAT_VERSION:
            raise KilnError(f"{d} has format version {manifest.get('format_version')!r}; recompile the model")
        source_bytes = (d / manifest["source"]).read_bytes()
        if hashlib.sha256(source_bytes).hexdigest() != manifest["source_sha256"]:
            raise KilnError(f"{d / manifest['source']} does not match its manifest (edited or corrupted)")
        with np.load(d / manifest["params"], allow_pickle=False) as npz:
            params = {int(k[1:]): npz[k] for k in npz.files}
        return CudaCompiledModel(
            manifest["name"],
            Target.from_json(manifest["target"]),
            source_bytes.decode(),
            [KernelInfo.from_json(k) for k in manifest["kernels"]],
            [BufferSpec.from_json(b) for b in manifest["buffers"]],
            [Launch(x["kernel"], x["args"]) for x in manifest["launches"]],
            params,
            manifest["inputs"],
            manifest["input_names"],
            manifest["outputs"],
            manifest["kernel_launches"],
            manifest.get("meta") or {},
        )


def _write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _manifest(d: Path) -> dict[str, Any]:
    path = d / "manifest.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise KilnError(f"cannot read compiled model manifest {path}: {exc}") from exc


def load_compiled(directory: str | Path) -> Any:
    """Load a compiled model directory of either target (CPU ``CompiledModel`` or CUDA)."""
    d = Path(directory)
    if _manifest(d).get("format") == FORMAT:
        return CudaCompiledModel.load(d)
    from compiler.runtime.executor import CompiledModel

    return CompiledModel.load(d)
