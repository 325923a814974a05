"""Build generated C with gcc into an on-disk kernel cache and load it with ctypes.

The cache key is sha256 of the source, the flags, gcc's version, the host CPU (``-march=native`` code is
only valid there) and ``CODEGEN_VERSION``. The cache lives in ``$KILN_CACHE_DIR`` or ``~/.cache/kiln``.
Writes are atomic (a temporary file in the cache directory, then ``os.replace``), so processes that build
the same kernel at the same time each get a complete library. A gcc failure raises CompileError naming the
kernel(s) whose lines gcc complained about and quoting gcc's error lines.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import subprocess
import tempfile
from pathlib import Path

from compiler.backends.cpu.codegen import CODEGEN_VERSION
from compiler.errors import CompileError
from compiler.target import Target

CC = os.environ.get("KILN_CC", "gcc")
# Target.cflags(): -march=native, narrowed by $KILN_HOST_ISA
FLAGS = (
    "-O3",
    *Target.host().cflags(),
    "-fopenmp",
    "-shared",
    "-fPIC",
    "-std=gnu11",
    "-fno-math-errno",
    "-pipe",
)
LIBS = ("-lm",)

_loaded: dict[str, KernelLibrary] = {}


def cache_dir() -> Path:
    """The kernel cache directory (created if missing)."""
    d = Path(os.environ.get("KILN_CACHE_DIR") or Path.home() / ".cache" / "kiln")
    d.mkdir(parents=True, exist_ok=True)
    return d


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


def cache_key(source: str, flags: tuple[str, ...] = FLAGS) -> str:
    h = hashlib.sha256()
    for part in (source, " ".join(flags), compiler_id(), _host_id(), CODEGEN_VERSION):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def compile_source(source: str, flags: tuple[str, ...] = FLAGS) -> Path:
    """The shared object built from ``source`` (from the cache when present)."""
    key = cache_key(source, flags)
    d = cache_dir()
    so = d / f"{key[:32]}.so"
    if so.exists():
        return so
    fd, tmp_c = tempfile.mkstemp(prefix=f".{key[:16]}-", suffix=".c", dir=d)
    tmp_so = tmp_c[:-2] + ".so"
    try:
        with os.fdopen(fd, "w") as f:
            f.write(source)
        proc = subprocess.run([CC, *flags, "-o", tmp_so, tmp_c, *LIBS], capture_output=True, text=True)
        if proc.returncode != 0:
            raise CompileError(_error_message(source, proc.stderr, tmp_c))
        os.replace(tmp_c, d / f"{key[:32]}.c")
        os.replace(tmp_so, so)
    finally:
        for p in (tmp_c, tmp_so):
            if os.path.exists(p):
                os.unlink(p)
    return so


def _kernel_spans(source: str) -> list[tuple[int, str]]:
    spans = []
    for i, line in enumerate(source.splitlines(), start=1):
        m = re.match(r"void (\w+)\(", line)
        if m:
            spans.append((i, m.group(1)))
    return spans


def _error_message(source: str, stderr: str, path: str) -> str:
    spans = _kernel_spans(source)
    names: list[str] = []
    errors: list[str] = []
    for line in stderr.splitlines():
        m = re.match(rf"{re.escape(path)}:(\d+):\d+: (fatal )?error", line)
        if m or " error" in line:
            errors.append(line.replace(path, "kernel.c"))
        if m:
            lineno = int(m.group(1))
            owner = [n for start, n in spans if start <= lineno]
            name = owner[-1] if owner else "prelude"
            if name not in names:
                names.append(name)
    quoted = "\n".join(errors[:20]) or stderr.strip()[-2000:]
    what = ", ".join(names) if names else "(unknown kernel)"
    return f"gcc failed to compile kernel(s) {what}:\n{quoted}"


class KernelLibrary:
    """A loaded shared object of generated kernels."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
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
        """OpenMP threads used by this library's parallel loops."""
        fn = self.lib.kiln_set_num_threads
        fn.argtypes = [ctypes.c_int]
        fn.restype = None
        fn(int(n))


def build(source: str, flags: tuple[str, ...] = FLAGS) -> KernelLibrary:
    """Compile (or fetch from the cache) and load ``source``."""
    path = compile_source(source, flags)
    lib = _loaded.get(str(path))
    if lib is None:
        lib = _loaded[str(path)] = KernelLibrary(path)
    return lib
