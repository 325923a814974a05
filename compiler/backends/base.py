"""The Backend interface: everything that differs between compilation targets.

A backend is one folder under ``compiler/backends/`` (``cpu/``, ``cuda/``) whose ``backend.py`` defines a
:class:`Backend` subclass named in ``BACKEND``. Everything else in the compiler — graph, passes, fusion,
tensor expressions, loop IR and its primitives, memory planning, the executor core, save/load — is shared
and never asks which target it is compiling for; it asks the backend.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from compiler.errors import KilnError

if TYPE_CHECKING:
    from compiler.backends.sketch import Sketch
    from compiler.fusion import Group
    from compiler.loopir.stmt import PrimFunc
    from compiler.runtime.executor import CompiledModel
    from compiler.target import Target


class Backend(ABC):
    """One target kind (``Target.kind``): its sketches, lowering, code generation, module build and the
    compiled-model class that launches its kernels. (How candidates are measured on the target lives with
    the tuner: ``tuner/measure/<kind>/`` holds the target's ``LocalBuilder`` and ``LocalRunner``.)

    Contract:

    - ``name`` equals the ``Target.kind`` the backend compiles for. A sketch's identity in the tuning
      database is ``(backend name, sketch name, sketch version)``: the target key of a record names the
      backend, so changing one backend's sketches never invalidates another backend's records.
    - ``sketch_classes`` lists the backend's sketches in the order :meth:`sketch_for` tries them; names are
      unique within the backend. A group kind no sketch applies to cannot be compiled for the target
      (``sketch_for`` raises a KilnError naming the group; the CUDA backend has no sketch for opaque groups).
    - ``lower(func, unroll=True)`` turns a scheduled, block-structured ``PrimFunc`` into the block-free
      target loop IR that ``codegen`` prints and the interpreters run; ``func`` is left untouched.
      ``unroll=False`` keeps "unrolled" loops as loops (the form the cost model's features are read from).
    - ``codegen(funcs, target, launches)`` returns one translation unit of source text for lowered
      ``funcs``; with ``launches`` it also contains the whole-model entry point the compiled model calls.
    - ``compile_module(source, target)`` compiles a translation unit of this backend's ``codegen`` into a
      loaded module (gcc: :class:`~compiler.backends.cpu.gcc.KernelLibrary`; NVRTC:
      :class:`~compiler.backends.cuda.nvrtc.CudaModule`) whose ``function(name)`` is a kernel. Built modules
      are kept in the shared on-disk :class:`~compiler.runtime.module_cache.ModuleCache` (keyed by the
      source, the compiler options and everything else that changes the built code), so compiling the
      same source again only loads it. A compiler failure raises CompileError naming the kernel(s) and
      quoting the compiler's error lines (:func:`~compiler.runtime.module_cache.compile_error_message`).
    - ``copy_kernel(shape, dtype, name)`` returns a lowered kernel that copies a tensor (for graph outputs
      that no kernel produces).
    - ``compiled_model_class()`` is the :class:`~compiler.runtime.executor.CompiledModel` subclass that
      builds this backend's source and launches it.
    """

    name: str = "backend"
    sketch_classes: tuple[type[Sketch], ...] = ()  # in the order sketch_for tries them

    def __init__(self) -> None:
        self._sketches = tuple(cls() for cls in self.sketch_classes)

    def sketches(self) -> Sequence[Sketch]:
        """The backend's sketches (one instance of each of ``sketch_classes``)."""
        return self._sketches

    @abstractmethod
    def lower(self, func: PrimFunc, unroll: bool = True) -> PrimFunc: ...

    @abstractmethod
    def codegen(
        self, funcs: Sequence[PrimFunc], target: Target, launches: Sequence[Any] | None = None
    ) -> str: ...

    @abstractmethod
    def compile_module(self, source: str, target: Target) -> Any: ...

    @abstractmethod
    def copy_kernel(self, shape: tuple[int, ...], dtype: str, name: str) -> PrimFunc: ...

    @abstractmethod
    def compiled_model_class(self) -> type[CompiledModel]: ...

    # ------------------------------------------------------------------ sketches
    def sketch_for(self, group: Group, target: Target | None = None) -> Sketch:
        """The first sketch of this backend that schedules ``group`` (on ``target`` when given: some
        sketches apply only to some architectures or math modes)."""
        for s in self.sketches():
            if s.applies_to(group, target):
                return s
        raise KilnError(f"{self.name}: no sketch schedules group {group.name} of kind {group.kind}")

    def get_sketch(self, name: str) -> Sketch:
        """This backend's sketch called ``name`` (a stored record names its sketch)."""
        for s in self.sketches():
            if s.name == name:
                return s
        known = ", ".join(s.name for s in self.sketches())
        raise KilnError(f"unknown {self.name} sketch '{name}'; known: {known}")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"
