"""Compilation targets and their stable keys.

A target key names the kind, architecture, device and what changes the generated code: for a CPU
``cpu/<arch>/<model name>/<ISA level>/<cores>``, e.g. ``cpu/x86_64/AMD EPYC 9B14/avx512/2`` (the ISA
level is ``avx512``, ``avx2`` or ``sse`` on x86_64, ``neon`` on aarch64: the widest vectors the code may
use); for a GPU ``cuda/<compute capability>/<device name>``, e.g. ``cuda/sm_90/NVIDIA H100 80GB HBM3``.
Records measured on one target are never applied to another, so records tuned on an AVX-512 machine never
reach an AVX2 one. Keys of
older Kilns (``cpu/<arch>/<model name>/<cores>``, without the ISA level) still parse, as a 16-byte-vector
target that matches no host.

``Target.host()`` describes the CPU this process runs on, parsed from ``/proc/cpuinfo`` by the pure
function ``Target.from_cpuinfo`` (x86: ``flags`` and ``model name``; aarch64: ``Features`` and the
``CPU implementer`` / ``CPU part`` ids, no ``model name``).

The environment variable ``KILN_HOST_ISA`` narrows what ``Target.host()`` reports, so a developer on an
AVX-512 machine can run everything (the tests included) as an AVX2 machine would:

* x86_64: ``avx512`` (64-byte vectors), ``avx2`` (32-byte vectors, AVX2 and FMA, no AVX-512) or ``sse``
  (16-byte vectors, no AVX at all);
* aarch64: ``neon`` (16-byte vectors, the only level).

It never widens: asking for an ISA the CPU lacks is a KilnError naming the variable and the CPU's
features. A narrowed host has its own key (its ISA level, e.g. ``cpu/x86_64/AMD EPYC 9B14/avx2/2``), so its
records never mix with the full host's, and
``Target.cflags()`` adds the gcc flags that keep ``-march=native`` code within that ISA
(``-mno-avx512f``, ``-mno-avx``). Asking for the CPU's own level changes nothing.

``Target.host()`` also reads the data cache sizes (L1d, L2, L3) of the CPU from
``/sys/devices/system/cpu/cpu0/cache`` (``cache_sizes``; defaults where sysfs says nothing), and a CPU target
says how many vector registers its ISA has (``vector_registers``: 32 with AVX-512 or on aarch64, 16 with
AVX2/SSE) and how many FMA pipes to keep busy (``fma_units``): the CPU sketches size register tiles and
cache blocks from them.

A CUDA target's SM count (``sm_count``, stored in ``cores``) is the current GPU's when CuPy can ask it, else
the device's in the table ``CUDA_SM_COUNTS``, else 132 (an H100 SXM). It is not part of the key (the device
name fixes it), so records of older Kilns stay valid; the split-K fusion edges are decided from it.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from compiler.errors import KilnError


@dataclass(frozen=True)
class Target:
    kind: str  # "cpu" | "cuda"
    arch: str  # "x86_64" | "aarch64" | "sm_90" ...
    device: str  # CPU model name or GPU name
    cores: int = 1  # CPU threads available, or SM count on a GPU (see sm_count)
    vector_bytes: int = 16  # widest SIMD register (64 with AVX-512)
    features: tuple[str, ...] = ()
    isa_flags: tuple[str, ...] = ()  # gcc flags narrowing -march=native to KILN_HOST_ISA (see cflags)
    max_threads_per_block: int = 1024
    max_shared_bytes: int = 48 * 1024  # per block, without opt-in
    max_shared_bytes_optin: int = 48 * 1024
    max_registers_per_thread: int = 255
    warp_size: int = 32
    l1_bytes: int = 32 * 1024
    l2_bytes: int = 1024 * 1024
    l3_bytes: int = 32 * 1024 * 1024  # shared last-level cache (CPU targets)
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def key(self) -> str:
        """The stable identity records are stored under (see the module docstring)."""
        if self.kind == "cpu":
            return f"cpu/{self.arch}/{self.device}/{self.isa}/{self.cores}"
        return f"{self.kind}/{self.arch}/{self.device}" + ("/tf32" if self.tf32 else "")

    @property
    def tf32(self) -> bool:
        """Whether float32 matmuls may run on TF32 tensor cores (opt-in: ``with_tf32()``, ``--tf32``; part
        of the key, so TF32 records never apply to an exact-fp32 compile)."""
        return "tf32" in self.features

    def with_tf32(self, on: bool = True) -> Target:
        """This CUDA target with the TF32 math mode on (or off)."""
        if self.kind != "cuda" and on:
            raise KilnError(f"TF32 is a CUDA math mode; target {self.key} is {self.kind}")
        rest = tuple(f for f in self.features if f != "tf32")
        return replace(self, features=rest + (("tf32",) if on else ()))

    @property
    def sm_count(self) -> int | None:
        """A CUDA target's streaming multiprocessors (the ``cores`` field: CuPy's ``multiProcessorCount`` for
        the current GPU, else :data:`CUDA_SM_COUNTS` by device name, else :data:`DEFAULT_CUDA_SMS`); None for
        other kinds. What the split-K fusion edges are decided from (:mod:`compiler.passes.split_k`)."""
        return self.cores if self.kind == "cuda" else None

    @property
    def isa(self) -> str:
        """A CPU's ISA level, named by the widest vectors its code may use (``avx512``, ``avx2``, ``sse``,
        ``neon``; ``v<bits>`` for a width with no name); empty for other kinds."""
        if self.kind != "cpu":
            return ""
        for name, width in ISA_LEVELS.get(self.arch, {}).items():
            if width == self.vector_bytes:
                return name
        return f"v{self.vector_bytes * 8}"

    @property
    def vector_lanes_f32(self) -> int:
        return max(1, self.vector_bytes // 4)

    @property
    def vector_registers(self) -> int:
        """Architectural SIMD registers: 32 on AVX-512 (zmm0-31) and aarch64 (v0-31), 16 on AVX2/SSE."""
        if self.kind != "cpu":
            return 0
        return 32 if self.arch == "aarch64" or self.vector_bytes >= 64 else 16

    @property
    def fma_units(self) -> int:
        """Vector FMA pipes per core (2 on every x86 core Kiln targets since Haswell/Zen, and on Neoverse
        cores): with an FMA latency of ~4 cycles, a micro-kernel needs ~4 x this many independent
        accumulators to keep them busy."""
        return 2 if self.kind == "cpu" and ("fma" in self.features or self.arch == "aarch64") else 1

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["features"] = list(self.features)
        data["isa_flags"] = list(self.isa_flags)
        data["key"] = self.key
        return data

    @staticmethod
    def from_json(data: dict[str, Any]) -> Target:
        fields = {k: v for k, v in data.items() if k in Target.__dataclass_fields__}
        fields["features"] = tuple(fields.get("features", ()))
        fields["isa_flags"] = tuple(fields.get("isa_flags", ()))
        return Target(**fields)

    def cflags(self) -> tuple[str, ...]:
        """gcc's ISA flags for code that runs on this CPU target when built on this machine:
        ``-march=native``, narrowed to the target's ISA when ``KILN_HOST_ISA`` asked for less."""
        if self.kind != "cpu":
            raise KilnError(f"target {self.key!r} is not a CPU target: it has no gcc flags")
        return ("-march=native", *self.isa_flags)

    # ---------------------------------------------------------- constructors
    @staticmethod
    @functools.cache
    def host() -> Target:
        """The CPU this process runs on, narrowed by ``$KILN_HOST_ISA`` when set."""
        try:
            with open("/proc/cpuinfo") as f:
                text = f.read()
        except OSError:
            text = f"model name : {platform.processor() or 'unknown cpu'}\n"
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        target = Target.from_cpuinfo(text, platform.machine(), cores, os.environ.get(HOST_ISA_ENV) or None)
        return replace(target, **cache_sizes())

    @staticmethod
    def from_cpuinfo(text: str, machine: str, cores: int = 1, isa: str | None = None) -> Target:
        """The CPU target described by the text of ``/proc/cpuinfo`` on a ``machine`` (``platform.machine()``)
        with ``cores`` threads; ``isa`` (a ``KILN_HOST_ISA`` value) narrows its vector ISA."""
        info = _cpuinfo_fields(text)
        arch = {"arm64": "aarch64", "amd64": "x86_64"}.get(machine.lower(), machine) or "unknown"
        if arch == "aarch64" or ("Features" in info and "flags" not in info):
            flags = set(info.get("Features", "").split())
            if flags & {"asimd", "neon"}:
                flags.add("neon")
            levels = ISA_LEVELS["aarch64"]
            native = "neon"
            device = info.get("model name") or _arm_cpu_name(info)
        else:
            flags = set(info.get("flags", "").split())
            levels = ISA_LEVELS["x86_64"]
            native = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "sse"
            device = info.get("model name") or "unknown cpu"
        features = [f for f in _FEATURES if f in flags]
        level, isa_flags = native, ()
        if isa is not None:
            level = isa.strip().lower()
            if level not in levels:
                raise KilnError(
                    f"{HOST_ISA_ENV}={isa!r} is not an ISA level of a {arch} CPU: use one of "
                    f"{', '.join(levels)}"
                )
            if levels[level] > levels[native]:
                have = " ".join(features) or "none of " + " ".join(_FEATURES)
                raise KilnError(
                    f"{HOST_ISA_ENV}={isa!r} asks for more than this CPU has ({device}: best level "
                    f"{native!r}, features {have}); it can only narrow what Target.host() reports"
                )
            if level != native:
                dropped = _ABOVE[level]
                features = [f for f in features if f not in dropped]
                isa_flags = ("-mno-avx",) if level == "sse" else ("-mno-avx512f",)
        return Target(
            kind="cpu",
            arch=arch,
            device=device.strip(),
            cores=cores,
            vector_bytes=levels[level],
            features=tuple(features),
            isa_flags=isa_flags,
            l1_bytes=32 * 1024,
            l2_bytes=1024 * 1024,
        )

    @staticmethod
    def cuda(arch: str = "sm_90", device: str = "NVIDIA H100 80GB HBM3", sms: int | None = None) -> Target:
        """A CUDA target; without a GPU this describes the device code is generated for. ``sms`` (the SM
        count) defaults to the device's in :data:`CUDA_SM_COUNTS`, else :data:`DEFAULT_CUDA_SMS`."""
        return Target(
            kind="cuda",
            arch=arch,
            device=device,
            cores=sms if sms is not None else CUDA_SM_COUNTS.get(device, DEFAULT_CUDA_SMS),
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
        """``cpu`` (this host), ``cuda`` (the current GPU, or sm_90 without one), ``cuda+tf32`` (the same
        with TF32 float32 matmuls), or a full key (a CUDA key ending ``/tf32`` has TF32 on)."""
        if isinstance(spec, Target):
            return spec
        if spec in (None, "cpu", "llvm", "c"):
            return Target.host()
        assert spec is not None
        if spec == "cuda":
            from compiler.backends.cuda.device import current_cuda_target  # device.py imports this module

            return current_cuda_target()
        parts = spec.split("/")
        if parts[0] == "cpu" and len(parts) >= 4 and parts[-1].isdigit():
            host = Target.host()
            if spec == host.key:
                return host
            levels = ISA_LEVELS.get(parts[1], {})
            if len(parts) >= 5 and parts[-2] in levels:  # cpu/<arch>/<model name>/<isa>/<cores>
                device, width = "/".join(parts[2:-2]), levels[parts[-2]]
            else:  # an older key without the ISA level
                device, width = "/".join(parts[2:-1]), 16
            return Target("cpu", parts[1], device, int(parts[-1]), vector_bytes=width)
        if spec == "cuda+tf32":
            return Target.parse("cuda").with_tf32()
        if parts[0] == "cuda" and len(parts) == 4 and parts[3] == "tf32":
            return Target.cuda(parts[1], parts[2]).with_tf32()
        if parts[0] == "cuda" and len(parts) == 3:
            return Target.cuda(parts[1], parts[2])
        raise KilnError(
            f"unknown target {spec!r}: use 'cpu', 'cuda' or a target key like {Target.host().key!r}"
        )


def tf32_spec(spec: str, on: bool) -> str:
    """A target spec (``cuda`` or a CUDA key, as the CLI's ``--target`` takes it) with TF32 math asked for
    when ``on`` (``--tf32``): ``cuda`` -> ``cuda+tf32``, a key -> the key ending ``/tf32``."""
    if not on or spec.endswith("/tf32") or spec == "cuda+tf32":
        return spec
    if spec == "cuda":
        return "cuda+tf32"
    if spec.startswith("cuda/"):
        return spec + "/tf32"
    raise KilnError(f"--tf32 is a CUDA math mode; target {spec!r} is not cuda")


_CACHE_FIELDS = {("1", "Data"): "l1_bytes", ("2", "Unified"): "l2_bytes", ("3", "Unified"): "l3_bytes"}


def parse_cache_size(text: str) -> int:
    """A sysfs cache ``size`` (``48K``, ``1024K``, ``32M``) in bytes; ValueError when it is not one."""
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * scale


def cache_sizes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> dict[str, int]:
    """``l1_bytes`` / ``l2_bytes`` / ``l3_bytes`` of the CPU that sysfs describes under ``root`` (only the
    levels it names; an unreadable or odd entry is left out, so the Target's defaults stay)."""
    found: dict[str, int] = {}
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        return found
    for entry in entries:
        try:
            with open(os.path.join(root, entry, "level")) as f:
                level = f.read().strip()
            with open(os.path.join(root, entry, "type")) as f:
                kind = f.read().strip()
            with open(os.path.join(root, entry, "size")) as f:
                size = parse_cache_size(f.read())
        except (OSError, ValueError):
            continue
        name = _CACHE_FIELDS.get((level, kind))
        if name and size > 0:
            found.setdefault(name, size)
    return found


def _cpuinfo_fields(text: str) -> dict[str, str]:
    """``key : value`` lines of /proc/cpuinfo; the first processor's value wins."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if ":" in line:
            k, _, v = line.partition(":")
            out.setdefault(k.strip(), v.strip())
    return out


def _arm_cpu_name(info: dict[str, str]) -> str:
    """A name for an Arm CPU from its implementer and part ids (what ``lscpu`` prints)."""
    impl, part = info.get("CPU implementer", "").lower(), info.get("CPU part", "").lower()
    if not impl:
        return info.get("Hardware") or info.get("Processor") or "unknown cpu"
    vendor, parts = _ARM_IDS.get(impl, (f"implementer {impl}", {}))
    return f"{vendor} {parts.get(part, f'part {part}' if part else '')}".strip()


HOST_ISA_ENV = "KILN_HOST_ISA"
# SMs of a CUDA device by the name CUDA reports (``cudaDeviceProp.name``), from NVIDIA's data sheets: what
# a target parsed from a key (no GPU to ask) gets. The SM count is not part of the key: the name fixes it.
CUDA_SM_COUNTS: dict[str, int] = {
    "NVIDIA H100 80GB HBM3": 132, "NVIDIA H100 NVL": 132, "NVIDIA H100 PCIe": 114, "NVIDIA H200": 132,
    "NVIDIA GH200 480GB": 132, "NVIDIA A100-SXM4-80GB": 108, "NVIDIA A100-SXM4-40GB": 108,
    "NVIDIA A100 80GB PCIe": 108, "NVIDIA A100-PCIE-40GB": 108, "NVIDIA A10": 72,
    "NVIDIA L4": 58, "NVIDIA L40S": 142, "NVIDIA GeForce RTX 4090": 128, "Tesla V100-SXM2-16GB": 80,
    "Tesla T4": 40,
}  # fmt: skip
DEFAULT_CUDA_SMS = 132  # an unknown device: an H100 SXM's SM count (the default CUDA target)
# ISA levels of each CPU architecture -> vector bytes (the level named in a CPU target key)
ISA_LEVELS: dict[str, dict[str, int]] = {
    "x86_64": {"sse": 16, "avx2": 32, "avx512": 64},
    "aarch64": {"neon": 16},
}
_FEATURES = (
    "avx512f", "avx512bw", "avx512vl", "avx2", "fma", "avx512_bf16", "avx512_fp16",
    "neon", "asimdhp", "asimddp", "sve", "sve2",
)  # fmt: skip
# the features a narrowed x86 level no longer has
_ABOVE = {
    "avx2": {"avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_fp16"},
    "sse": {"avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_fp16", "avx2", "fma"},
}
# CPU implementer id -> (vendor, {CPU part id -> core name}), after util-linux lscpu-arm.c
_ARM_IDS: dict[str, tuple[str, dict[str, str]]] = {
    "0x41": (
        "ARM",
        {
            "0xd03": "Cortex-A53", "0xd05": "Cortex-A55", "0xd07": "Cortex-A57", "0xd08": "Cortex-A72",
            "0xd0b": "Cortex-A76", "0xd0c": "Neoverse-N1", "0xd40": "Neoverse-V1", "0xd49": "Neoverse-N2",
            "0xd4f": "Neoverse-V2", "0xd84": "Neoverse-V3", "0xd8e": "Neoverse-N3",
        },
    ),
    "0x48": ("HiSilicon", {"0xd01": "TaiShan-v110", "0xd02": "TaiShan-v120"}),
    "0x4e": ("NVIDIA", {"0x004": "Carmel"}),
    "0x51": ("Qualcomm", {"0x001": "Oryon"}),
    "0x61": ("Apple", {}),
    "0xc0": ("Ampere", {"0xac3": "Ampere-1", "0xac4": "Ampere-1a"}),
}  # fmt: skip
