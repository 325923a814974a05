"""Build generated CUDA with NVRTC (through CuPy) or check it with nvcc; launch kernels.

* :func:`build` compiles a translation unit for the target's ``sm_XY`` with NVRTC and returns a
  :class:`CudaModule`. Modules are cached in memory (per process) and cubins on disk in the shared
  :class:`~compiler.runtime.module_cache.ModuleCache` under ``cuda/`` (``$KILN_CACHE_DIR/cuda``, default
  ``~/.cache/kiln/cuda``), keyed by the source, the options, the arch and ``CODEGEN_VERSION``; files are
  written atomically (temp file, ``os.replace``).
  When CuPy's low-level NVRTC binding is not available the module is compiled by ``cupy.RawModule``
  (which keeps its own disk cache).
* A compile failure is a CompileError naming the kernel(s) the compiler complained about and quoting
  its own lines.
* :func:`nvcc_check` compiles with ``nvcc -cubin -arch=sm_XY -Xptxas -v`` and returns each kernel's
  registers, spills and shared memory: the check CI runs without a GPU.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compiler.backends.cuda.codegen import CODEGEN_VERSION
from compiler.backends.cuda.device import nvrtc_load_error, require_cupy
from compiler.errors import CompileError
from compiler.runtime import module_cache

NVRTC_OPTIONS = ("--std=c++17",)
NVCC = os.environ.get("KILN_NVCC", "nvcc")

KERNEL_PATTERN = r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\("  # a kernel's first line
ERROR_PATTERN = r"\((\d+)\): (?:catastrophic )?error"  # NVRTC and nvcc: ``kiln.cu(12): error: ...``
CACHE = module_cache.ModuleCache("cuda")

_modules: dict[str, CudaModule] = {}


def cache_key(source: str, arch: str, options: tuple[str, ...] = NVRTC_OPTIONS) -> str:
    """The cache key of ``source`` compiled for ``arch`` with ``options``."""
    return module_cache.cache_key(source, options, arch, CODEGEN_VERSION)


# ------------------------------------------------------------------ errors
def kernel_spans(source: str) -> list[tuple[int, str]]:
    """(first line, name) of every ``__global__`` kernel in ``source``."""
    return module_cache.kernel_spans(source, KERNEL_PATTERN)


def error_message(tool: str, source: str, log: str, arch: str) -> str:
    """``tool failed to compile kernel(s) A, B (sm_90):`` followed by the compiler's error lines."""
    return module_cache.compile_error_message(
        tool, source, log, kernel_pattern=KERNEL_PATTERN, error_pattern=ERROR_PATTERN, where=f" ({arch})"
    )


# ------------------------------------------------------------------- NVRTC
class CudaModule:
    """A loaded CUDA module; ``function(name)`` is a ``cupy.RawKernel``."""

    def __init__(self, raw: Any, key: str) -> None:
        self.raw = raw
        self.key = key
        self._fns: dict[str, Any] = {}

    def function(self, name: str) -> Any:
        fn = self._fns.get(name)
        if fn is None:
            try:
                fn = self.raw.get_function(name)
            except Exception as exc:
                raise CompileError(f"kernel {name!r} is not in the built CUDA module: {exc}") from exc
            self._fns[name] = fn
        return fn


def build(source: str, arch: str, options: tuple[str, ...] = NVRTC_OPTIONS) -> CudaModule:
    """Compile ``source`` for ``arch`` (``sm_90``) with NVRTC, or fetch it from the caches."""
    cp = require_cupy("building CUDA kernels")
    key = cache_key(source, arch, options)
    mod = _modules.get(key)
    if mod is not None:
        return mod
    path = CACHE.get(key, ".cubin")
    if path is None:
        cubin = _nvrtc_cubin(source, arch, options)
        if cubin is not None:
            path = CACHE.put(key, ".cubin", cubin)
    if path is not None:
        raw = cp.RawModule(path=str(path))
    else:  # no low-level NVRTC binding: let CuPy compile (and cache) the source
        raw = cp.RawModule(code=source, options=(*options, f"-arch={arch}"), backend="nvrtc")
        try:
            raw.compile()
        except Exception as exc:
            unavailable = nvrtc_load_error(exc)
            if unavailable is not None:
                raise unavailable from None
            raise CompileError(error_message("NVRTC", source, str(exc), arch)) from None
    mod = _modules[key] = CudaModule(raw, key)
    return mod


def _nvrtc_cubin(source: str, arch: str, options: tuple[str, ...]) -> bytes | None:
    """A cubin from CuPy's NVRTC binding; None when the binding is not there."""
    try:
        from cupy_backends.cuda.libs import nvrtc
    except Exception:
        return None
    if not all(hasattr(nvrtc, f) for f in ("createProgram", "compileProgram", "getCUBIN", "getProgramLog")):
        return None
    try:
        prog = nvrtc.createProgram(source, "kiln.cu", (), ())
    except Exception as exc:  # the binding loads libnvrtc at its first call
        unavailable = nvrtc_load_error(exc)
        if unavailable is not None:
            raise unavailable from None
        raise
    try:
        try:
            nvrtc.compileProgram(prog, [*options, f"--gpu-architecture={arch}"])
        except Exception as exc:
            unavailable = nvrtc_load_error(exc)
            if unavailable is not None:
                raise unavailable from None
            try:
                log = nvrtc.getProgramLog(prog)
            except Exception:
                log = str(exc)
            raise CompileError(error_message("NVRTC", source, log, arch)) from None
        return nvrtc.getCUBIN(prog)
    finally:
        with contextlib.suppress(Exception):
            nvrtc.destroyProgram(prog)


def launch(fn: Any, launch_info: dict[str, Any], args: tuple) -> None:
    """Launch one kernel on the current stream with the grid/block/shared memory of ``launch_info``."""
    dyn = int(launch_info.get("dynamic_shared_bytes", 0))
    fn(tuple(launch_info["grid"]), tuple(launch_info["block"]), args, shared_mem=dyn)


def prepare_kernel(fn: Any, name: str, launch_info: dict[str, Any]) -> None:
    """Opt a kernel into its dynamic shared memory (beyond 48 KiB) and check its resources."""
    dyn = int(launch_info.get("dynamic_shared_bytes", 0))
    if dyn:
        try:
            fn.max_dynamic_shared_size_bytes = dyn
        except Exception as exc:  # CUDA_ERROR_INVALID_VALUE: static + dynamic over the opt-in limit
            raise CompileError(
                f"kernel {name}: the driver refused {dyn} bytes of dynamic shared memory "
                f"({type(exc).__name__}: {exc})"
            ) from exc
    check_resources(fn, name, launch_info)


def check_resources(fn: Any, name: str, launch_info: dict[str, Any]) -> None:
    """The block size must fit what the compiled kernel allows (registers per thread x threads)."""
    try:
        attrs = fn.attributes
    except Exception:
        return
    threads = launch_info["block"][0] * launch_info["block"][1] * launch_info["block"][2]
    limit = int(attrs.get("max_threads_per_block", threads))
    if threads > limit:
        raise CompileError(
            f"kernel {name} uses {attrs.get('num_regs', '?')} registers per thread: "
            f"at most {limit} threads per "
            f"block, but it is launched with {threads}"
        )


# -------------------------------------------------------------------- nvcc
@dataclass
class KernelResources:
    name: str
    registers: int
    spill_stores: int
    spill_loads: int
    shared_bytes: int
    stack_bytes: int


def nvcc_available() -> bool:
    return shutil.which(NVCC) is not None


def nvcc_check(
    source: str, arch: str = "sm_90", workdir: str | Path | None = None
) -> dict[str, KernelResources]:
    """Compile ``source`` with ``nvcc -cubin`` and return each kernel's resource usage (ptxas -v)."""
    if not nvcc_available():
        raise CompileError(f"nvcc ({NVCC}) is not installed")
    with tempfile.TemporaryDirectory(dir=workdir) as d:
        cu = Path(d) / "kiln.cu"
        cu.write_text(source)
        proc = subprocess.run(
            [
                NVCC,
                "-cubin",
                f"-arch={arch}",
                "--std=c++17",
                "-Xptxas",
                "-v",
                "-o",
                str(Path(d) / "kiln.cubin"),
                str(cu),
            ],
            capture_output=True,
            text=True,
        )
    if proc.returncode != 0:
        raise CompileError(error_message("nvcc", source, proc.stderr.replace(str(cu), "kiln.cu"), arch))
    return parse_ptxas(proc.stderr)


def parse_ptxas(log: str) -> dict[str, KernelResources]:
    out: dict[str, KernelResources] = {}
    current = None
    spill = (0, 0, 0)
    for line in log.splitlines():
        m = re.search(r"Function properties for (\w+)", line) or re.search(
            r"Compiling entry function '(\w+)'", line
        )
        if m:
            current = m.group(1)
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            spill = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and current:
            smem = re.search(r"(\d+) bytes smem", line)
            out[current] = KernelResources(
                current, int(m.group(1)), spill[1], spill[2], int(smem.group(1)) if smem else 0, spill[0]
            )
            spill = (0, 0, 0)
    return out
