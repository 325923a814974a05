"""The environment fingerprint stored with every bench run: what the figures were measured on.

CPU model (name, family/model), the SIMD flags that change generated code, cores available to the process,
the Kiln target key (which honours ``KILN_HOST_ISA``), the GPU (CuPy's device name when a GPU is usable,
else why not), Python, Kiln's version and git commit (when running from a git checkout; ``+dirty`` when it
has uncommitted changes), and the versions of the libraries the contenders use.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

ISA_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_bf16",
    "amx_tile",
)
LIBRARIES = ("numpy", "scipy", "onnxruntime", "onnx", "torch", "cupy-cuda13x", "threadpoolctl")


def cpu_info() -> dict[str, Any]:
    """Model name, family/model and the SIMD flags of ``ISA_FLAGS`` this CPU has (from /proc/cpuinfo)."""
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    flags = set(info.get("flags", info.get("Features", "")).split())
    return {
        "model": info.get("model name") or platform.processor() or "unknown CPU",
        "family": info.get("cpu family"),
        "model_number": info.get("model"),
        "machine": platform.machine(),
        "isa": [f for f in ISA_FLAGS if f in flags],
        "threads": len(os.sched_getaffinity(0)),
    }


def gpu_info() -> dict[str, Any]:
    """The GPU a CUDA run would use, or why there is none."""
    try:
        from compiler.backends.cuda.device import current_cuda_target, why_unavailable

        reason = why_unavailable()
        if reason is not None:
            return {"device": None, "reason": reason}
        target = current_cuda_target()
        return {"device": target.device, "arch": target.arch, "key": target.key}
    except Exception as exc:  # a broken CUDA install must not stop a CPU benchmark
        return {"device": None, "reason": f"{type(exc).__name__}: {exc}"}


def git_commit(root: Path | None = None) -> str | None:
    """The git commit of the Kiln source tree (``+dirty`` with uncommitted changes), None outside git."""
    root = root or Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def library_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def blas_info() -> list[dict[str, Any]]:
    """numpy's BLAS as threadpoolctl sees it (library, version, the kernel architecture it picked)."""
    from threadpoolctl import threadpool_info

    keys = ("internal_api", "version", "architecture", "num_threads")
    return [{k: i.get(k) for k in keys} for i in threadpool_info() if i.get("user_api") == "blas"]


def fingerprint(target_key: str, with_gpu: bool) -> dict[str, Any]:
    """Everything above as plain JSON data."""
    from compiler import __version__

    return {
        "host": socket.gethostname(),
        "cpu": cpu_info(),
        "target": target_key,
        "gpu": gpu_info() if with_gpu else {"device": None, "reason": "not asked (--target cpu)"},
        "python": platform.python_version(),
        "kiln_version": __version__,
        "git_commit": git_commit(),
        "libraries": library_versions(),
        "blas": blas_info(),
        "env": {k: os.environ[k] for k in ("KILN_HOST_ISA", "OMP_WAIT_POLICY") if k in os.environ},
    }


def describe(env: dict[str, Any]) -> str:
    """One line: CPU model, family/model, ISA, threads (for report headers)."""
    cpu = env.get("cpu", {})
    isa = (
        "AVX-512"
        if "avx512f" in cpu.get("isa", [])
        else "AVX2"
        if "avx2" in cpu.get("isa", [])
        else "no AVX2"
    )
    fam = f"family {cpu.get('family')} model {cpu.get('model_number')}" if cpu.get("family") else ""
    parts = [cpu.get("model", "unknown CPU"), fam, isa, f"{cpu.get('threads')} threads"]
    gpu = env.get("gpu", {})
    if gpu.get("device"):
        parts.append(f"GPU {gpu['device']}")
    return ", ".join(p for p in parts if p)
