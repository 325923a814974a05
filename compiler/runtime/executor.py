"""CompiledModel: the executor core every backend shares.

A compiled model is one translation unit of generated source holding every kernel, the buffers of the
model (inputs, params, outputs, intermediates, views), the launch list and the static memory plan
(:mod:`compiler.runtime.memory_plan`). This class owns everything that does not depend on the target:
construction and validation (buffer roles, params present and of the right shape, launches), the memory
plan, ``input_specs``/``output_specs``, checking the inputs and ``out=`` arrays of a call, the timing
summary, metadata, and saving/loading (:mod:`compiler.runtime.artifact`; ``CompiledModel.load`` reads the
manifest's format and hands the directory to the backend that wrote it).

The backend's subclass (``Backend.compiled_model_class()``: ``compiler.backends.cpu.executor`` for the
CPU, ``compiler.backends.cuda.executor`` for CUDA) supplies the launch step: building or loading the
module, allocating host or device buffers, binding the checked inputs, launching the kernels
(:meth:`CompiledModel._execute`) and timing them (:meth:`CompiledModel._time`).

Calling conventions, the same on every backend:

* ``run(inputs)`` takes a list in input order or a dict by name and returns numpy arrays that are never
  overwritten by a later call. The last kernels write straight into them (no copy pass): they come from an
  :class:`OutputPool`, which hands back an array of an earlier call only once nothing outside the pool
  refers to it any more (the caller dropped it and every view of it), so a loop ``y = model.run(x)``
  allocates nothing after its first calls and never touches an array the caller still holds.
* ``run(inputs, out=[...])`` writes into caller arrays and returns them (binding output arrays: the same
  arrays passed again cost no new allocation); ``run(inputs, copy=False)`` may return the model's own
  output arrays (valid until the next call).
* ``bind(inputs, out=None)`` binds the arrays once and returns a call without arguments that runs the model
  on them (the least overhead per call: on the CPU a single ctypes call).
* ``timeit(inputs, repeats, warmup)`` returns microseconds: median, min, mean and every sample.
* ``CompiledModel.from_funcs(...)`` and ``CompiledModel.load(dir)`` called on this class pick the
  backend's subclass from the target (default: the host CPU) or the saved manifest.
"""

from __future__ import annotations

import math
import statistics
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from compiler.backends import get_backend
from compiler.dtypes import to_numpy
from compiler.errors import KilnError
from compiler.runtime import artifact
from compiler.runtime.memory_plan import BufferSpec, Launch, check_fits, plan_memory
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


def describe(dtype: Any, shape: Sequence[int]) -> str:
    """``float32[4, 8]``: how errors name an array's type."""
    return f"{np.dtype(dtype).name}[{', '.join(str(int(d)) for d in shape)}]"


Inputs = Sequence[Any] | Mapping[str, Any]


ALIGN = 64  # bytes: a cache line, and the alignment full-width AVX-512 (streaming) stores need


def aligned_empty(shape: Sequence[int], dtype: Any) -> np.ndarray:
    """An uninitialized C-contiguous array whose data starts on a 64-byte boundary (numpy's own
    allocations are 16-byte aligned); its ``base`` is the raw byte buffer."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + ALIGN, np.uint8)
    off = (-raw.ctypes.data) % ALIGN
    return raw[off : off + nbytes].view(dtype).reshape(shape)


def _refs(entry: list[Any]) -> tuple[int, int]:
    """Reference counts of a pool entry's array and of its memory (``base``): views of a view refer to the
    memory's owner, not to the view, so both are looked at."""
    return sys.getrefcount(entry[0]), sys.getrefcount(entry[0].base)


class OutputPool:
    """Output arrays for calls that return fresh arrays without copying: ``take()`` gives one array per
    output (shape and dtype from ``specs``, 64-byte aligned), reusing an array of an earlier call only when
    nothing but the pool refers to it or its memory (no caller variable, no view, no torch tensor sharing
    it), else allocating a new one. The pool keeps the ``depth`` most recent arrays of each output, so
    ``y = model.run(x)`` in a loop (the previous ``y`` is still alive during the call) cycles through two
    arrays per output. ``take()`` also returns each array's data address (``arr.ctypes.data`` costs ~1 us).
    """

    def __init__(self, specs: Sequence[tuple[tuple[int, ...], np.dtype]], depth: int = 2) -> None:
        self.specs = [(tuple(shape), np.dtype(dt)) for shape, dt in specs]
        self.depth = depth
        self._held: list[list[list[Any]]] = [[] for _ in self.specs]  # per output: [array, address]
        self._free = _refs([aligned_empty((1,), np.float32), 0])  # counts of an entry nobody else holds

    def take(self) -> tuple[list[np.ndarray], list[int]]:
        arrays, ptrs = [], []
        free = self._free
        for (shape, dt), held in zip(self.specs, self._held):
            found = None
            for entry in held:
                if _refs(entry) <= free:
                    found = entry
                    break
            if found is None:
                arr = aligned_empty(shape, dt)
                found = [arr, arr.ctypes.data]
                del arr
                if len(held) >= self.depth:
                    held.pop(0)
                held.append(found)
            arrays.append(found[0])
            ptrs.append(found[1])
        return arrays, ptrs


class CompiledModel(ABC):
    """A compiled model; see the module docstring. Subclasses set ``backend`` (the ``Target.kind`` they
    run, which also names the save format) and ``source_name`` (the saved source file), and implement
    :meth:`_execute` and :meth:`_time`; they may add constructor arguments (keyword-only), derive them from
    the lowered functions (:meth:`_funcs_state`), and add manifest fields and files (:meth:`_saved_extra`,
    read back by :meth:`_from_saved`)."""

    backend: ClassVar[str] = ""
    source_name: ClassVar[str] = ""

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
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        if target.kind != self.backend:
            raise KilnError(f"{type(self).__name__} runs {self.backend} models, not target {target.key}")
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
        check_fits(name, self.plan.total_bytes(self.buffers))  # a one-line error, not numpy's MemoryError
        for ids, role in ((self.inputs, "input"), (self.outputs, "output")):
            for i in ids:
                if i not in self.by_id or self.by_id[i].role != role:
                    raise KilnError(f"buffer id {i} is not an {role} buffer")
        self._input_types = [
            (n, np.dtype(to_numpy(self.by_id[i].dtype)), tuple(self.by_id[i].shape))
            for n, i in zip(self.input_names, self.inputs)
        ]
        self.params: dict[int, np.ndarray] = {}
        for b in self.buffers:
            if b.role == "param" and b.alias_of is None:
                if b.id not in params:
                    raise KilnError(f"param {b.name!r} (id {b.id}) has no array")
                arr = np.ascontiguousarray(params[b.id], dtype=to_numpy(b.dtype))
                if arr.shape != b.shape:
                    raise KilnError(f"param {b.name!r}: expected shape {b.shape}, got {arr.shape}")
                self.params[b.id] = arr

    # ------------------------------------------------------------ factories
    @classmethod
    def default_target(cls) -> Target:
        """The target ``from_funcs`` compiles for when given none (the host CPU)."""
        return Target.host()

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
        **options: Any,
    ) -> CompiledModel:
        """Generate the source of lowered ``funcs`` with the target's backend and wrap it.

        Called on ``CompiledModel`` itself it returns the model class of ``target``'s backend;
        ``options`` go to that class (e.g. ``num_threads`` on the CPU). Nothing is built yet.
        """
        target = target or cls.default_target()
        backend = get_backend(target)
        impl = backend.compiled_model_class()
        if not issubclass(impl, cls):
            raise KilnError(f"{cls.__name__} cannot run target {target.key} (its model is {impl.__name__})")
        funcs = list(funcs)
        source = backend.codegen(funcs, target, launches)
        infos = list(kernels) if kernels is not None else [KernelInfo(f.name) for f in funcs]
        return impl(
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
            meta,
            **impl._funcs_state(funcs),
            **options,
        )

    @classmethod
    def _funcs_state(cls, funcs: Sequence[Any]) -> dict[str, Any]:
        """Backend constructor arguments derived from the lowered functions (none by default)."""
        return {}

    # ---------------------------------------------------------------- specs
    @property
    def input_specs(self) -> list[dict[str, Any]]:
        return [self._spec(n, i) for n, i in zip(self.input_names, self.inputs)]

    @property
    def output_specs(self) -> list[dict[str, Any]]:
        names = self.meta.get("output_names") or [self.by_id[i].name for i in self.outputs]
        return [self._spec(n, i) for n, i in zip(names, self.outputs)]

    def _spec(self, name: str, buffer_id: int) -> dict[str, Any]:
        b = self.by_id[buffer_id]
        return {"name": name, "shape": list(b.shape), "dtype": b.dtype}

    # ------------------------------------------------------ checking a call
    def _as_input(self, value: Any) -> Any:
        """An input value as the launch step takes it (a numpy array unless a backend keeps its own)."""
        return np.asarray(value)

    def _check_inputs(self, inputs: Inputs) -> list[Any]:
        """The inputs in model order, each of the right dtype and shape (KilnError naming what is wrong)."""
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
        checked = []
        for (name, want, shape), v in zip(self._input_types, values):
            arr = self._as_input(v)
            if arr.dtype != want or tuple(arr.shape) != shape:
                expected, got = describe(want, shape), describe(arr.dtype, arr.shape)
                raise KilnError(f"input {name!r}: expected {expected}, got {got}")
            checked.append(arr)
        return checked

    def _check_out(self, out: Sequence[np.ndarray]) -> list[np.ndarray]:
        """``out=`` arrays: one writeable C-contiguous numpy array of each output's dtype and shape."""
        if len(out) != len(self.outputs):
            raise KilnError(
                f"{self.name}: out= has {len(out)} arrays, the model has {len(self.outputs)} outputs"
            )
        for k, (o, dst) in enumerate(zip(self.outputs, out)):
            spec = self.by_id[o]
            want = to_numpy(spec.dtype)
            if not isinstance(dst, np.ndarray) or dst.dtype != want or dst.shape != spec.shape:
                got = describe(dst.dtype, dst.shape) if isinstance(dst, np.ndarray) else type(dst).__name__
                raise KilnError(f"out[{k}] ({spec.name!r}): expected {describe(want, spec.shape)}, got {got}")
            if not (dst.flags.c_contiguous and dst.flags.writeable):
                raise KilnError(f"out[{k}] ({spec.name!r}) must be a writeable C-contiguous array")
        return list(out)

    # ------------------------------------------------------------------ run
    def run(
        self,
        inputs: Inputs,
        out: Sequence[np.ndarray] | None = None,
        copy: bool = True,
        **options: Any,
    ) -> list[np.ndarray]:
        """Run the model on ``inputs`` (a list in input order, or a dict by name); see the module doc.
        ``options`` are the backend's (CUDA: ``cuda_graph``)."""
        values = self._check_inputs(inputs)
        checked_out = None if out is None else self._check_out(out)
        return self._execute(values, checked_out, copy, **options)

    __call__ = run

    def bind(self, inputs: Inputs, out: Sequence[np.ndarray] | None = None) -> Callable[[], list[np.ndarray]]:
        """Bind inputs and outputs once (like onnxruntime's IOBinding): returns a call without arguments
        that runs the model on those arrays and returns the outputs (``out``, or the model's own arrays,
        overwritten by the next call). The arrays are checked here, not per call; changing their contents
        between calls is the point. A backend makes the call as cheap as it can (the CPU: one ctypes call)."""
        values = self._check_inputs(inputs)
        checked_out = None if out is None else self._check_out(out)
        return self._bound(values, checked_out)

    def _bound(self, values: list[Any], out: list[np.ndarray] | None) -> Callable[[], list[np.ndarray]]:
        """The call :meth:`bind` returns; by default each call is a checked-once :meth:`_execute`."""
        return lambda: self._execute(values, out, False)

    def timeit(self, inputs: Inputs, repeats: int = 10, warmup: int = 2, **options: Any) -> dict[str, Any]:
        """Time ``repeats`` runs after ``warmup`` ones with the inputs bound once: microseconds (median, min,
        mean and every sample) plus what the backend reports. ``options`` are the backend's (CUDA:
        ``cuda_graph``, ``flush_l2``)."""
        samples, info = self._time(self._check_inputs(inputs), repeats, warmup, **options)
        return {
            "median_us": statistics.median(samples),
            "min_us": min(samples),
            "mean_us": statistics.fmean(samples),
            "samples_us": samples,
            "repeats": repeats,
            "warmup": warmup,
            **info,
        }

    @abstractmethod
    def _execute(
        self, values: list[Any], out: list[np.ndarray] | None, copy: bool, **options: Any
    ) -> list[np.ndarray]:
        """The launch step: run on checked inputs; fill ``out`` (checked) or return the outputs."""

    @abstractmethod
    def _time(
        self, values: list[Any], repeats: int, warmup: int, **options: Any
    ) -> tuple[list[float], dict[str, Any]]:
        """Timed runs on checked inputs: the samples in microseconds and extra fields for the summary."""

    # ----------------------------------------------------------- save / load
    def save(self, directory: str | Path) -> Path:
        """Write the model to ``directory`` (manifest.json, the source, params.npz and the backend's
        files); returns the manifest's path."""
        fields, files = self._saved_extra()
        manifest = {
            "name": self.name,
            "target": self.target.to_json(),
            "kernels": [k.to_json() for k in self.kernels],
            "buffers": [b.to_json() for b in self.buffers],
            "launches": [launch.to_json() for launch in self.launches],
            "inputs": self.inputs,
            "input_names": self.input_names,
            "outputs": self.outputs,
            "memory_plan": self.plan.summary(),
            "meta": self.meta,
            **fields,
        }
        return artifact.write_model(
            Path(directory), self.backend, manifest, self.source_name, self.source, self.params, files
        )

    def _saved_extra(self) -> tuple[dict[str, Any], dict[str, bytes]]:
        """The backend's manifest fields and extra files (name -> bytes) for :meth:`save`."""
        return {}, {}

    @classmethod
    def load(cls, directory: str | Path, **options: Any) -> CompiledModel:
        """Load a model saved by :meth:`save`, of whichever backend wrote it (``CompiledModel.load``) or of
        this class's backend; ``options`` go to the backend (e.g. ``num_threads`` on the CPU)."""
        saved = artifact.read_model(Path(directory))
        impl = get_backend(saved.backend).compiled_model_class()
        if not issubclass(impl, cls):
            raise KilnError(f"{directory} holds a {saved.backend} model, not a {cls.backend} one")
        m = saved.manifest
        try:
            fields = cls._saved_fields(saved)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise KilnError(
                f"{saved.directory / artifact.MANIFEST} is damaged ({type(exc).__name__}: {exc}); "
                + artifact.recompile_hint(saved.directory, m)
            ) from None
        return impl._from_saved(saved, fields, **options)

    @staticmethod
    def _saved_fields(saved: artifact.SavedModel) -> dict[str, Any]:
        """The constructor's shared arguments from a saved manifest (KeyError/TypeError when damaged)."""
        m = saved.manifest
        return {
            "name": m["name"],
            "target": Target.from_json(m["target"]),
            "source": saved.source,
            "kernels": [KernelInfo.from_json(k) for k in m["kernels"]],
            "buffers": [BufferSpec.from_json(b) for b in m["buffers"]],
            "launches": [Launch(x["kernel"], x["args"]) for x in m["launches"]],
            "params": saved.params,
            "inputs": m["inputs"],
            "input_names": m["input_names"],
            "outputs": m["outputs"],
            "meta": m.get("meta") or {},
        }

    @classmethod
    def _from_saved(cls, saved: artifact.SavedModel, fields: dict[str, Any], **options: Any) -> CompiledModel:
        """The model of a saved directory: ``fields`` are the constructor's shared arguments."""
        return cls(**fields, **options)
