"""Compilation targets and their stable keys.

A target key names the kind, architecture and device, e.g. ``cpu/x86_64/AMD EPYC/2`` (model name and
cores available to this process) or ``cuda/sm_90/NVIDIA H100 80GB HBM3``. Records measured on one target
are never applied to another.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import asdict, dataclass, field
from typing import Any

from compiler.errors import KilnError


@dataclass(frozen=True)
class Target:
    kind: str  # "cpu" | "cuda"
    arch: str  # "x86_64" | "aarch64" | "sm_90" ...
    device: str  # CPU model name or GPU name
    cores: int = 1  # CPU threads available, or SM count on a GPU
    vector_bytes: int = 16  # widest SIMD register (64 with AVX-512)
    features: tuple[str, ...] = ()
    max_threads_per_block: int = 1024
    max_shared_bytes: int = 48 * 1024  # per block, without opt-in
    max_shared_bytes_optin: int = 48 * 1024
    max_registers_per_thread: int = 255
    warp_size: int = 32
    l1_bytes: int = 32 * 1024
    l2_bytes: int = 1024 * 1024
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def key(self) -> str:
        if self.kind == "cpu":
            return f"cpu/{self.arch}/{self.device}/{self.cores}"
        return f"{self.kind}/{self.arch}/{self.device}"

    @property
    def vector_lanes_f32(self) -> int:
        return max(1, self.vector_bytes // 4)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["features"] = list(self.features)
        data["key"] = self.key
        return data

    @staticmethod
    def from_json(data: dict[str, Any]) -> Target:
        fields = {k: v for k, v in data.items() if k in Target.__dataclass_fields__}
        fields["features"] = tuple(fields.get("features", ()))
        return Target(**fields)

    # ---------------------------------------------------------- constructors
    @staticmethod
    @functools.cache
    def host() -> Target:
        """The CPU this process runs on."""
        info = _cpuinfo()
        flags = set(info.get("flags", "").split())
        vec = 64 if "avx512f" in flags else 32 if "avx2" in flags else 16
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        wanted = ("avx512f", "avx512bw", "avx512vl", "avx2", "fma", "avx512_bf16", "avx512_fp16", "neon")
        return Target(
            kind="cpu",
            arch=platform.machine() or "unknown",
            device=info.get("model name", "unknown cpu").strip(),
            cores=cores,
            vector_bytes=vec,
            features=tuple(f for f in wanted if f in flags),
            l1_bytes=32 * 1024,
            l2_bytes=1024 * 1024,
        )

    @staticmethod
    def cuda(arch: str = "sm_90", device: str = "NVIDIA H100 80GB HBM3", sms: int = 132) -> Target:
        """A CUDA target; without a GPU this describes the device code is generated for."""
        return Target(
            kind="cuda",
            arch=arch,
            device=device,
            cores=sms,
            vector_bytes=16,
            max_threads_per_block=1024,
            max_shared_bytes=48 * 1024,
            max_shared_bytes_optin=227 * 1024,
            max_registers_per_thread=255,
            warp_size=32,
            l2_bytes=50 * 1024 * 1024,
        )

    @staticmethod
    def parse(spec: str | Target | None) -> Target:
        """``cpu`` (this host), ``cuda`` (the current GPU, or sm_90 without one), or a full key."""
        if isinstance(spec, Target):
            return spec
        if spec in (None, "cpu", "llvm", "c"):
            return Target.host()
        assert spec is not None
        if spec == "cuda":
            from compiler.backends.cuda.device import current_cuda_target

            return current_cuda_target()
        parts = spec.split("/")
        if parts[0] == "cpu" and len(parts) == 4:
            host = Target.host()
            if spec == host.key:
                return host
            return Target("cpu", parts[1], parts[2], int(parts[3]))
        if parts[0] == "cuda" and len(parts) == 3:
            return Target.cuda(parts[1], parts[2])
        raise KilnError(
            f"unknown target {spec!r}: use 'cpu', 'cuda' or a target key like {Target.host().key!r}"
        )


def _cpuinfo() -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if ":" in line:
                    k, _, v = line.partition(":")
                    out.setdefault(k.strip(), v.strip())
    except OSError:
        out["model name"] = platform.processor() or "unknown cpu"
    return out
