"""Build generated C with gcc into an on-disk kernel cache and load it with ctypes.

The cache is the shared :class:`~compiler.runtime.module_cache.ModuleCache` (``$KILN_CACHE_DIR`` or
``~/.cache/kiln``; atomic writes, so processes that build the same kernel at the same time each get a
complete library). The key covers the source, the flags, gcc's version, the host CPU (``-march=native``
code is only valid there) and ``CODEGEN_VERSION``; each entry is the library ``<key>.so`` and its source
``<key>.c``. :func:`compile_to` builds a source into a given path outside the cache, with a timeout (the
tuner's builder). A gcc failure raises CompileError naming the kernel(s) whose lines gcc complained about
and quoting gcc's error lines; :func:`errors_by_kernel` splits such a message by kernel.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import subprocess
from pathlib import Path

from compiler.backends.cpu import pool
from compiler.backends.cpu.codegen import CODEGEN_VERSION, OPENMP_MARK
from compiler.errors import CompileError
from compiler.runtime import module_cache
from compiler.target import Target

CC = os.environ.get("KILN_CC", "gcc")
# Target.cflags(): -march=native, narrowed by $KILN_HOST_ISA
FLAGS = (
    "-O3",
    *Target.host().cflags(),
    "-pthread",
    "-shared",
    "-fPIC",
    "-std=gnu11",
    "-fno-math-errno",
    "-pipe",
)
LIBS = ("-lm",)
OPENMP_FLAGS = ("-fopenmp",)  # only for sources generated with parallel="openmp"

KERNEL_PATTERN = r"^void (\w+)\("  # a kernel's first line in generated C
ERROR_PATTERN = r"kernel\.c:(\d+):\d+: (?:fatal )?error"  # gcc's error lines, the source named kernel.c
CACHE = module_cache.ModuleCache()

_loaded: dict[str, KernelLibrary] = {}


@functools.cache
def compiler_id() -> str:
    """gcc's full version and target triple, part of every cache key."""
    try:
        out = subprocess.run(
            [CC, "-dumpfullversion", "-dumpmachine"], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        raise CompileError(f"cannot run the C compiler {CC!r}: {exc}") from exc
    return " ".join(out.stdout.split())


@functools.cache
def _host_id() -> str:
    host = Target.host()
    return f"{host.key}|{','.join(host.features)}"


def flags_for(source: str) -> tuple[str, ...]:
    """:data:`FLAGS`, plus ``-fopenmp`` for a source generated with OpenMP parallel loops (``parallel=
    "openmp"``, or a model saved before the thread pool: its ``model.c`` has ``#pragma omp``)."""
    return FLAGS + OPENMP_FLAGS if OPENMP_MARK in source or "#pragma omp" in source else FLAGS


def cache_key(source: str, flags: tuple[str, ...] | None = None) -> str:
    """The cache key of ``source`` built with ``flags`` (default :func:`flags_for`) by this gcc for this
    CPU."""
    flags = flags_for(source) if flags is None else flags
    return module_cache.cache_key(source, flags, compiler_id(), _host_id(), CODEGEN_VERSION)


def compile_source(source: str, flags: tuple[str, ...] | None = None) -> Path:
    """The shared object built from ``source`` (from the cache when present)."""
    flags = flags_for(source) if flags is None else flags
    key = cache_key(source, flags)
    so = CACHE.get(key, ".so")
    if so is not None:
        return so
    with CACHE.stage(key, ".c", ".so") as (tmp_c, tmp_so):
        _gcc(source, tmp_c, tmp_so, flags)
    return CACHE.path(key, ".so")


def compile_to(
    source: str, so: str | Path, timeout: float | None = None, flags: tuple[str, ...] | None = None
) -> Path:
    """Compile ``source`` into the shared object ``so``, outside the cache (the source is written beside
    it, with suffix ``.c``); gcc is killed after ``timeout`` seconds. Raises CompileError: gcc's errors
    (:func:`error_message`), a timeout, or a C compiler that cannot run."""
    so = Path(so)
    _gcc(source, so.with_suffix(".c"), so, flags_for(source) if flags is None else flags, timeout)
    return so


def _gcc(source: str, c_path: Path, so: Path, flags: tuple[str, ...], timeout: float | None = None) -> None:
    c_path.write_text(source)
    try:
        # its own process group: on a timeout the driver AND what it started (cc1, as, ld) are killed; a
        # killed driver alone leaves cc1 compiling on, orphaned, taking a core from the timings that follow
        proc = subprocess.Popen(
            [CC, *flags, "-o", str(so), str(c_path), *LIBS],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
    except OSError as exc:
        raise CompileError(f"cannot run the C compiler {CC!r}: {exc}") from exc
    try:
        _, stderr = proc.communicate(timeout=timeout)
    except BaseException as exc:  # a timeout, or an interrupted build: nothing of gcc outlives it
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.kill()
        proc.communicate()
        if isinstance(exc, subprocess.TimeoutExpired):
            raise CompileError(f"gcc timed out after {timeout:.3g} s") from None
        raise
    if proc.returncode != 0:
        raise CompileError(error_message(source, stderr.replace(str(c_path), "kernel.c")))


def error_message(source: str, stderr: str) -> str:
    """gcc's error lines (for source file ``kernel.c``), with the kernels they fall in named."""
    return module_cache.compile_error_message(
        "gcc", source, stderr, kernel_pattern=KERNEL_PATTERN, error_pattern=ERROR_PATTERN
    )


def errors_by_kernel(source: str, message: str) -> dict[str, str]:
    """gcc's error ``message`` for ``source`` (:func:`error_message`) split by kernel: the name of each
    kernel that has error lines ("prelude" for lines before the first kernel) -> a message of its own."""
    owned = module_cache.errors_by_kernel(
        source, message, kernel_pattern=KERNEL_PATTERN, error_pattern=ERROR_PATTERN
    )
    return {name: error_message(source, "\n".join(lines)) for name, lines in owned.items()}


_runtimes: list[ctypes.CDLL] = []  # the loaded pool runtime, kept (never dlclosed)


@functools.cache
def load_pool_runtime() -> Path:
    """Build (or fetch from the cache) the thread pool's runtime library and load it ``RTLD_GLOBAL``, once
    per process: every library with parallel loops calls its :data:`~compiler.backends.cpu.pool.ENTRY`, so
    all of them share one pool (:mod:`compiler.backends.cpu.pool`). It is never unloaded. Returns its path
    (the tuner's measurement worker loads the same file itself, :func:`tuner.measure.cpu.run_worker.main`,
    without importing the compiler)."""
    path = pool_runtime_path()
    try:
        _runtimes.append(ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL))
    except OSError as exc:
        raise CompileError(f"cannot load the thread pool runtime {path}: {exc}") from exc
    return path


def pool_runtime_path() -> Path:
    """The pool runtime library, built into the cache (keyed by the pool's code) when missing."""
    return compile_source(pool.runtime_source())


class KernelLibrary:
    """A loaded shared object of generated kernels (the pool runtime is loaded before it)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        load_pool_runtime()
        try:
            self.lib = ctypes.CDLL(str(self.path))
        except OSError as exc:
            raise CompileError(f"cannot load kernel library {self.path}: {exc}") from exc
        self._fns: dict[str, ctypes._CFuncPtr] = {}  # type: ignore[name-defined]

    def function(self, name: str, nargs: int | None = None) -> ctypes._CFuncPtr:  # type: ignore[name-defined]
        """The kernel ``name``; every argument is a pointer (``c_void_p``)."""
        fn = self._fns.get(name)
        if fn is None:
            try:
                fn = getattr(self.lib, name)
            except AttributeError:
                raise CompileError(f"kernel {name!r} is not in {self.path.name}") from None
            fn.restype = None
            if nargs is not None:
                fn.argtypes = [ctypes.c_void_p] * nargs
            self._fns[name] = fn
        return fn

    def set_num_threads(self, n: int) -> None:
        """Threads (the calling one included) that this library's parallel loops use."""
        fn = self.lib.kiln_set_num_threads
        fn.argtypes = [ctypes.c_int]
        fn.restype = None
        fn(int(n))


def build(source: str, flags: tuple[str, ...] | None = None) -> KernelLibrary:
    """Compile (or fetch from the cache) and load ``source``."""
    path = compile_source(source, flags)
    lib = _loaded.get(str(path))
    if lib is None:
        lib = _loaded[str(path)] = KernelLibrary(path)
    return lib
