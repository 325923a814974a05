"""Pinned CPU targets for tests that check generated text, one per vector width Kiln generates code for
(64-byte AVX-512, 32-byte AVX2, 16-byte NEON), so those tests give the same answer on every machine.

Tests that run code use ``Target.host()`` (narrowed by ``KILN_HOST_ISA``); ``same_width_as_host`` says
whether code generated for a pinned target is what the host would generate, so a test can run it there.
"""

from __future__ import annotations

from compiler.target import Target

AVX512 = Target(
    "cpu",
    "x86_64",
    "test avx512",
    cores=2,
    vector_bytes=64,
    features=("avx512f", "avx512bw", "avx512vl", "avx2", "fma"),
)
AVX2 = Target("cpu", "x86_64", "test avx2", cores=2, vector_bytes=32, features=("avx2", "fma"))
SSE = Target("cpu", "x86_64", "test sse", cores=2, vector_bytes=16)
NEON = Target("cpu", "aarch64", "test neon", cores=2, vector_bytes=16, features=("neon",))
PINNED_TARGETS = {"avx512": AVX512, "avx2": AVX2, "neon": NEON}
X86_TARGETS = {"avx512": AVX512, "avx2": AVX2, "sse": SSE}  # every x86 ISA level Kiln generates code for


def same_width_as_host(target: Target) -> bool:
    """Whether the host generates the same vector code as ``target`` (same kind and vector width)."""
    host = Target.host()
    return target.kind == host.kind and target.vector_bytes == host.vector_bytes
