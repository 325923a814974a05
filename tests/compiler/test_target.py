"""Target.from_cpuinfo on sample /proc/cpuinfo texts (AVX-512 and AVX2 x86, aarch64), KILN_HOST_ISA
narrowing, the gcc flags of a narrowed host, and target keys."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from compiler.errors import KilnError
from compiler.target import DEFAULT_CUDA_SMS, HOST_ISA_ENV, Target
from tests.targets import PINNED_TARGETS

X86_COMMON = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht "
    "syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl pni pclmulqdq ssse3 cx16 "
    "sse4_1 sse4_2 movbe popcnt aes xsave avx f16c rdrand hypervisor lahf_lm abm"
)
AVX512_CPUINFO = f"""processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC 9654 96-Core Processor
flags\t\t: {X86_COMMON} fma bmi1 avx2 bmi2 avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16 gfni
bogomips\t: 4792.81

processor\t: 1
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9654 96-Core Processor
flags\t\t: {X86_COMMON} fma bmi1 avx2 bmi2 avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16 gfni
"""
AVX2_CPUINFO = f"""processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 158
model name\t: Intel(R) Core(TM) i7-8700 CPU @ 3.20GHz
flags\t\t: {X86_COMMON} fma bmi1 avx2 bmi2 erms invpcid
"""
SSE_CPUINFO = f"""processor\t: 0
model name\t: Intel(R) Xeon(R) CPU E5-2670 0 @ 2.60GHz
flags\t\t: {X86_COMMON}
"""
# an AWS Graviton2: no "model name", the CPU is named by its implementer and part ids
AARCH64_CPUINFO = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x3
CPU part\t: 0xd0c
CPU revision\t: 1

processor\t: 1
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x3
CPU part\t: 0xd0c
CPU revision\t: 1
"""


def test_avx512_x86():
    t = Target.from_cpuinfo(AVX512_CPUINFO, "x86_64", cores=4)
    assert (t.kind, t.arch, t.device, t.cores) == ("cpu", "x86_64", "AMD EPYC 9654 96-Core Processor", 4)
    assert t.vector_bytes == 64 and t.vector_lanes_f32 == 16
    assert t.features == ("avx512f", "avx512bw", "avx512vl", "avx2", "fma", "avx512_bf16")
    assert t.key == "cpu/x86_64/AMD EPYC 9654 96-Core Processor/avx512/4"
    assert t.cflags() == ("-march=native",)


def test_avx2_x86():
    t = Target.from_cpuinfo(AVX2_CPUINFO, "x86_64", cores=2)
    assert t.device == "Intel(R) Core(TM) i7-8700 CPU @ 3.20GHz"
    assert t.vector_bytes == 32 and t.vector_lanes_f32 == 8
    assert t.features == ("avx2", "fma")
    assert t.key == "cpu/x86_64/Intel(R) Core(TM) i7-8700 CPU @ 3.20GHz/avx2/2"
    assert t.cflags() == ("-march=native",)


def test_sse_only_x86():
    t = Target.from_cpuinfo(SSE_CPUINFO, "x86_64")
    assert t.vector_bytes == 16 and t.features == ()


def test_aarch64_reads_features_and_names_the_cpu_from_its_ids():
    t = Target.from_cpuinfo(AARCH64_CPUINFO, "aarch64", cores=2)
    assert (t.arch, t.device, t.vector_bytes) == ("aarch64", "ARM Neoverse-N1", 16)
    assert "neon" in t.features and "asimddp" in t.features and "avx2" not in t.features
    assert t.key == "cpu/aarch64/ARM Neoverse-N1/neon/2"
    assert t.cflags() == ("-march=native",)


def test_aarch64_unknown_ids_and_missing_ids():
    text = AARCH64_CPUINFO.replace("0xd0c", "0xfff").replace("0x41", "0x99")
    assert Target.from_cpuinfo(text, "aarch64").device == "implementer 0x99 part 0xfff"
    assert Target.from_cpuinfo("Features\t: fp asimd\n", "aarch64").device == "unknown cpu"
    assert Target.from_cpuinfo("Features\t: fp asimd\n", "arm64").arch == "aarch64"


@pytest.mark.parametrize(
    "text, isa, vector_bytes, flags, features",
    [
        (AVX512_CPUINFO, "avx2", 32, ("-mno-avx512f",), ("avx2", "fma")),
        (AVX512_CPUINFO, "sse", 16, ("-mno-avx",), ()),
        (AVX2_CPUINFO, "sse", 16, ("-mno-avx",), ()),
    ],
)
def test_narrowing_reports_less_builds_for_less_and_changes_the_key(text, isa, vector_bytes, flags, features):
    full = Target.from_cpuinfo(text, "x86_64", cores=2)
    t = Target.from_cpuinfo(text, "x86_64", cores=2, isa=isa)
    assert t.vector_bytes == vector_bytes and t.features == features
    assert t.cflags() == ("-march=native", *flags)
    assert t.device == full.device
    assert t.key != full.key and t.key == f"cpu/x86_64/{full.device}/{isa}/2"
    assert Target.from_json(t.to_json()) == t


@pytest.mark.parametrize(
    "text, machine, isa",
    [
        (AVX512_CPUINFO, "x86_64", "avx512"),
        (AVX2_CPUINFO, "x86_64", "AVX2"),
        (AARCH64_CPUINFO, "aarch64", "neon"),
    ],
)
def test_asking_for_the_cpus_own_level_changes_nothing(text, machine, isa):
    assert Target.from_cpuinfo(text, machine, isa=isa) == Target.from_cpuinfo(text, machine)


def test_asking_for_more_than_the_cpu_has_is_a_clear_error():
    with pytest.raises(KilnError, match=r"KILN_HOST_ISA='avx512' asks for more.*avx2 fma"):
        Target.from_cpuinfo(AVX2_CPUINFO, "x86_64", isa="avx512")
    with pytest.raises(KilnError, match=r"KILN_HOST_ISA='neon' is not an ISA level of a x86_64 CPU"):
        Target.from_cpuinfo(AVX2_CPUINFO, "x86_64", isa="neon")
    with pytest.raises(KilnError, match=r"KILN_HOST_ISA='avx2' is not an ISA level of a aarch64 CPU.*neon"):
        Target.from_cpuinfo(AARCH64_CPUINFO, "aarch64", isa="avx2")


def test_the_host_key_parses_back_to_the_host():
    host = Target.host()
    assert Target.parse(host.key) is host and Target.parse("cpu") is host


@pytest.mark.parametrize("pinned", list(PINNED_TARGETS.values()), ids=list(PINNED_TARGETS))
def test_a_cpu_key_names_the_isa_level_and_parses_back(pinned):
    (name,) = [k for k, v in PINNED_TARGETS.items() if v is pinned]
    assert pinned.key.split("/")[-2] == pinned.isa == name
    back = Target.parse(pinned.key)
    assert (back.arch, back.device, back.cores, back.vector_bytes) == (
        pinned.arch, pinned.device, pinned.cores, pinned.vector_bytes,
    )  # fmt: skip


def test_an_older_key_without_the_isa_level_still_parses_and_matches_no_host():
    old = Target.parse("cpu/x86_64/AMD EPYC 9B14/2")
    assert (old.device, old.cores, old.vector_bytes) == ("AMD EPYC 9B14", 2, 16)
    assert old.key == "cpu/x86_64/AMD EPYC 9B14/sse/2" != Target.host().key


def test_cuda_keys_name_the_compute_capability_and_the_device():
    assert Target.cuda("sm_80", "NVIDIA A100-SXM4-40GB").key == "cuda/sm_80/NVIDIA A100-SXM4-40GB"
    assert Target.cuda("sm_80", "NVIDIA A100-SXM4-40GB").isa == ""


def test_cuda_sm_count_comes_from_the_device_table_or_the_default_and_stays_out_of_the_key():
    a100 = Target.parse("cuda/sm_80/NVIDIA A100-SXM4-40GB")
    assert a100.sm_count == 108 and a100.key == "cuda/sm_80/NVIDIA A100-SXM4-40GB"
    assert Target.parse("cuda/sm_90/NVIDIA H100 PCIe").sm_count == 114
    assert Target.cuda("sm_89", "Some Future GPU").sm_count == DEFAULT_CUDA_SMS
    assert Target.cuda("sm_89", "Some Future GPU", sms=7).sm_count == 7  # what CuPy reports wins
    assert Target.from_json(a100.to_json()) == a100 and Target.host().sm_count is None


def test_cuda_targets_have_no_gcc_flags():
    with pytest.raises(KilnError, match="not a CPU target"):
        Target.cuda().cflags()


NARROW_SCRIPT = """
import json, subprocess
from compiler.backends.cpu import gcc
from compiler.target import Target
src = ("typedef float v16 __attribute__((vector_size(64)));"
       "void k(v16* a, const v16* b) { for (int i = 0; i < 64; ++i) a[i] = a[i] * b[i] + a[i]; }")
asm = subprocess.run(["objdump", "-d", str(gcc.compile_source(src))], capture_output=True, text=True).stdout
t = Target.host()
print(json.dumps({"key": t.key, "vector_bytes": t.vector_bytes, "flags": gcc.FLAGS, "asm": asm}))
"""


def test_the_environment_variable_narrows_the_host_and_the_code_gcc_generates(tmp_path):
    """In a fresh process (Target.host() and the gcc flags are fixed once per process): the narrowed host
    reports the narrower vectors, has its own key, and gcc uses no register wider than it."""
    host = Target.host()
    if host.arch != "x86_64" or host.vector_bytes <= 16:
        pytest.skip(f"the host {host.key} has one ISA level or nothing to narrow")
    isa, width, flag, wider, widest_allowed = (
        ("avx2", 32, "-mno-avx512f", "zmm", "ymm")
        if host.vector_bytes == 64
        else ("sse", 16, "-mno-avx", "ymm", "xmm")
    )
    env = {**os.environ, HOST_ISA_ENV: isa, "KILN_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", NARROW_SCRIPT], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["key"] != host.key and f"/{isa}/" in out["key"] and out["vector_bytes"] == width
    assert out["flags"][1:3] == ["-march=native", flag]
    if "Disassembly" in out["asm"]:  # objdump is there
        # no register wider than the narrowed ISA's, and its widest in use (gcc's choice between xmm and ymm
        # under AVX2 depends on the CPU it tunes for: a Rocket Lake tuning uses ymm alone)
        assert wider not in out["asm"] and widest_allowed in out["asm"]
    bad = subprocess.run(
        [sys.executable, "-c", NARROW_SCRIPT],
        capture_output=True,
        text=True,
        env={**env, HOST_ISA_ENV: "avx1024"},
    )
    assert bad.returncode != 0 and f"{HOST_ISA_ENV}='avx1024' is not an ISA level" in bad.stderr


def test_cache_sizes_come_from_sysfs(tmp_path):
    from compiler.target import cache_sizes, parse_cache_size

    entries = [("1", "Data", "48K"), ("1", "Instruction", "32K"), ("2", "Unified", "1024K")]
    for i, (level, kind, size) in enumerate([*entries, ("3", "Unified", "32M")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(level + "\n")
        (d / "type").write_text(kind + "\n")
        (d / "size").write_text(size + "\n")
    assert cache_sizes(str(tmp_path)) == {"l1_bytes": 48 << 10, "l2_bytes": 1 << 20, "l3_bytes": 32 << 20}
    (tmp_path / "index3" / "size").write_text("lots\n")  # an odd entry keeps the Target's default
    assert "l3_bytes" not in cache_sizes(str(tmp_path))
    assert cache_sizes(str(tmp_path / "missing")) == {}
    assert parse_cache_size("512") == 512
    host = Target.host()
    assert host.l1_bytes >= 16 << 10 and host.l2_bytes >= host.l1_bytes


def test_vector_registers_follow_the_isa():
    from tests.targets import AVX2, AVX512, NEON

    assert (AVX512.vector_registers, AVX2.vector_registers, NEON.vector_registers) == (32, 16, 32)
    assert AVX2.fma_units == 2 and Target.cuda().vector_registers == 0
