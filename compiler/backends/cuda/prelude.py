"""The CUDA prelude: fixed-width integer types for NVRTC, floor division helpers, float16 conversions
(inline PTX ``cvt``, so neither NVRTC nor nvcc needs cuda_fp16.h), bfloat16 conversions (bit arithmetic,
round to nearest even, on every architecture; no cuda_bf16.h), warp all-reduce helpers; only the parts
a translation unit uses (names recorded by the printer in ``helpers``)."""

from __future__ import annotations

from typing import NamedTuple


class Narrow(NamedTuple):
    """How a 16-bit float dtype is printed: its bits type in memory, the float <-> bits conversions, the
    rounding of a float to the nearest representable value, and the prelude helper defining them."""

    bits: str
    widen: str
    narrow: str
    round: str
    helper: str


NARROW = {
    "float16": Narrow("kiln_half", "kiln_h2f", "kiln_f2h", "kiln_h", "half"),
    "bfloat16": Narrow("kiln_bf16", "kiln_b2f", "kiln_f2b", "kiln_b", "bf16"),
}

_HEADER = """\
#if defined(__CUDACC_RTC__)
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef int int32_t;
typedef long long int64_t;
#else
#include <cstdint>
#endif
"""

_FLOOR = {
    "floordiv": """\
__device__ __forceinline__ {T} kiln_floordiv_{s}({T} a, {T} b) {{
  const {T} q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}}
""",
    "floormod": """\
__device__ __forceinline__ {T} kiln_floormod_{s}({T} a, {T} b) {{
  const {T} r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}}
""",
}

_HALF = """\
typedef unsigned short kiln_half;  // IEEE binary16 bits in memory; registers hold floats
__device__ __forceinline__ float kiln_h2f(kiln_half h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ kiln_half kiln_f2h(float f) {
  kiln_half h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
__device__ __forceinline__ float kiln_h(float f) {  // f rounded to the nearest binary16 value
  return kiln_h2f(kiln_f2h(f));
}
"""

_BF16 = """\
typedef unsigned short kiln_bf16;  // bfloat16 bits in memory; registers hold floats
__device__ __forceinline__ float kiln_b2f(kiln_bf16 b) { return __uint_as_float(((unsigned)b) << 16); }
__device__ __forceinline__ kiln_bf16 kiln_f2b(float f) {  // round to nearest even; NaN stays a quiet NaN
  const unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (kiln_bf16)((u >> 16) | 0x40u);
  return (kiln_bf16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ float kiln_b(float f) {  // f rounded to the nearest bfloat16 value
  return kiln_b2f(kiln_f2b(f));
}
"""

_PACK16 = """\
__device__ __forceinline__ unsigned kiln_pack16(unsigned short lo, unsigned short hi) {
  return (unsigned)lo | ((unsigned)hi << 16);  // two 16-bit floats in one word, lo at the lower address
}
"""

_LANE_MASK = """\
__device__ __forceinline__ unsigned kiln_group_mask(int width) {
  // lanes of the aligned group of `width` lanes this thread belongs to (linear thread index % 32)
  const unsigned lane = (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) & 31u;
  return width >= 32 ? 0xffffffffu : (((1u << width) - 1u) << (lane & ~(unsigned)(width - 1)));
}
"""

_WARP = """\
__device__ __forceinline__ {T} kiln_warp_reduce_{comb}_{s}({T} v, int width) {{
  const unsigned mask = kiln_group_mask(width);
#pragma unroll
  for (int off = width >> 1; off > 0; off >>= 1) {{
    const {T} o = __shfl_xor_sync(mask, v, off, width);
    {step};
  }}
  return v;
}}
"""


def render_prelude(helpers: set[str]) -> str:
    """The prelude text for the helpers used (``floordiv_i32``, ``warp_sum_f32`` ...)."""
    parts = [_HEADER]
    for h in sorted(helpers):
        kind, _, s = h.rpartition("_")
        if kind in ("floordiv", "floormod"):
            t = "int32_t" if s == "i32" else "int64_t"
            parts.append(_FLOOR[kind].format(T=t, s=s))
    if "half" in helpers:
        parts.append(_HALF)
    if "bf16" in helpers:
        parts.append(_BF16)
    if "pack16" in helpers:
        parts.append(_PACK16)
    warps = sorted(h for h in helpers if h.startswith("warp_"))
    if warps:
        parts.append(_LANE_MASK)
    for h in warps:
        _, comb, s = h.split("_")
        t = {"f32": "float", "f64": "double", "i32": "int32_t", "f16": "float", "bf16": "float"}[s]
        fmax = {"f32": "fmaxf", "f64": "fmax", "i32": "max", "f16": "fmaxf", "bf16": "fmaxf"}[s]
        fmin = {"f32": "fminf", "f64": "fmin", "i32": "min", "f16": "fminf", "bf16": "fminf"}[s]
        # the 16-bit floats: each step rounded to the dtype
        add = {"f16": "v = kiln_h(v + o)", "bf16": "v = kiln_b(v + o)"}.get(s, "v += o")
        step = {"sum": add, "max": f"v = {fmax}(v, o)", "min": f"v = {fmin}(v, o)"}[comb]
        parts.append(_WARP.format(T=t, comb=comb, s=s, step=step))
    return "\n".join(parts)
