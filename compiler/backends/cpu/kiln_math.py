"""The C prelude of generated CPU code: vector types and accurate, vectorizable float32 math.

Every function exists in a scalar form (``kiln_expf``) written branch-free, so gcc auto-vectorizes loops
that call it, and in GCC-vector-extension forms for 4, 8 and 16 lanes (``kiln_exp_f32x16``). One template
per function is rendered for each width: in the scalar form ``SEL`` is a C ternary and bit casts go through
``memcpy``; in the vector forms comparisons give lane masks and ``SEL`` is a bitwise blend.

Accuracy (vs a float64 reference over the whole float32 range; tests/compiler/backends/cpu/test_kiln_math.py):
exp, log, tanh, sigmoid within 3 ulp; erf within 2e-7 absolute. Overflow gives +inf, underflow 0 (subnormal
results are rounded once), log(0) = -inf, log(x<0) = nan, nan in gives nan out, erf/tanh saturate to +-1.
No -ffast-math is needed or wanted. Coefficients come from scripts/fit_math.py.
"""

from __future__ import annotations

WIDTHS = (4, 8, 16)
MATH_FUNCS = ("exp", "exp_le0", "log", "tanh", "sigmoid", "erf")
_DEPS = {"tanh": ("exp",), "sigmoid": ("exp",), "erf": ("exp",)}

_HEADER = """\
#include <stdint.h>
#include <stdbool.h>
#include <stddef.h>

extern void* aligned_alloc(size_t, size_t);
extern void free(void*);
extern void abort(void);

static inline uint32_t kiln_bits_f32(float x) { uint32_t u; __builtin_memcpy(&u, &x, 4); return u; }
static inline void kiln_sfence(void) {
#if defined(__SSE__)
  __builtin_ia32_sfence();
#endif
}
static inline float kiln_f32_bits(uint32_t u) { float x; __builtin_memcpy(&x, &u, 4); return x; }
/* a branch-free select for the scalar math forms: a ternary lets gcc sink work into branches, which then
   blocks auto-vectorization of loops calling these functions */
static inline float kiln_sel_f32(int32_t c, float a, float b) {
  uint32_t m = -(uint32_t)(c != 0);
  return kiln_f32_bits((kiln_bits_f32(a) & m) | (kiln_bits_f32(b) & ~m));
}
"""

# scalar helpers for each C type: min/max (a > b ? a : b: vectorizes to maxps; NaN in `a` is not
# propagated), floor division/modulo (Python/numpy semantics) for ints and floats.
_SCALAR_TYPES = {"f32": "float", "f64": "double", "f16": "_Float16", "i32": "int32_t", "i64": "int64_t",
                 "i8": "int8_t", "u8": "uint8_t"}  # fmt: skip

_MINMAX = """\
static inline {T} kiln_max_{s}({T} a, {T} b) {{ return a > b ? a : b; }}
static inline {T} kiln_min_{s}({T} a, {T} b) {{ return a < b ? a : b; }}
"""

_FLOORDIV_INT = """\
static inline {T} kiln_floordiv_{s}({T} a, {T} b) {{
  {T} q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}}
static inline {T} kiln_floormod_{s}({T} a, {T} b) {{
  {T} r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}}
"""

_FLOORDIV_FLOAT = """\
static inline {T} kiln_floordiv_{s}({T} a, {T} b) {{ return __builtin_floor{sfx}(a / b); }}
static inline {T} kiln_floormod_{s}({T} a, {T} b) {{
  {T} r = __builtin_fmod{sfx}(a, b);
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}}
"""

_VECTOR = """\
typedef float kiln_f32x{W} __attribute__((vector_size({B})));
typedef int32_t kiln_i32x{W} __attribute__((vector_size({B})));
typedef uint32_t kiln_u32x{W} __attribute__((vector_size({B})));
static inline kiln_f32x{W} kiln_sel_f32x{W}(kiln_i32x{W} m, kiln_f32x{W} a, kiln_f32x{W} b) {{
  return (kiln_f32x{W})(((kiln_u32x{W})m & (kiln_u32x{W})a) | (~(kiln_u32x{W})m & (kiln_u32x{W})b));
}}
static inline kiln_i32x{W} kiln_sel_i32x{W}(kiln_i32x{W} m, kiln_i32x{W} a, kiln_i32x{W} b) {{
  return (m & a) | (~m & b);
}}
static inline kiln_f32x{W} kiln_splat_f32x{W}(float s) {{ return (kiln_f32x{W}){{{splat}}}; }}
static inline kiln_i32x{W} kiln_splat_i32x{W}(int32_t s) {{ return (kiln_i32x{W}){{{splat}}}; }}
static inline kiln_f32x{W} kiln_load_f32x{W}(const float* p) {{
  kiln_f32x{W} v; __builtin_memcpy(&v, p, {B}); return v;
}}
static inline kiln_i32x{W} kiln_load_i32x{W}(const int32_t* p) {{
  kiln_i32x{W} v; __builtin_memcpy(&v, p, {B}); return v;
}}
static inline void kiln_store_f32x{W}(float* p, kiln_f32x{W} v) {{ __builtin_memcpy(p, &v, {B}); }}
/* a non-temporal (streaming) store where the ISA has one and p is aligned: the line is written without
   being read first and without evicting cached data (kernels that use it end with kiln_sfence) */
static inline void kiln_stream_f32x{W}(float* p, kiln_f32x{W} v) {{
{streambody}
}}
/* a streaming store where s holds, an ordinary one elsewhere (a branch taken the same way for whole rows) */
static inline void kiln_stream_if_f32x{W}(float* p, kiln_f32x{W} v, int s) {{
  if (s) kiln_stream_f32x{W}(p, v); else kiln_store_f32x{W}(p, v);
}}
static inline void kiln_store_i32x{W}(int32_t* p, kiln_i32x{W} v) {{ __builtin_memcpy(p, &v, {B}); }}
/* max(a, b) = a > b ? a : b and min(a, b) = a < b ? a : b: exactly x86 maxps/minps (a NaN in either
   gives b), so one instruction where the ISA has it, a compare and a blend elsewhere */
static inline kiln_f32x{W} kiln_max_f32x{W}(kiln_f32x{W} a, kiln_f32x{W} b) {{
{maxbody}
}}
static inline kiln_f32x{W} kiln_min_f32x{W}(kiln_f32x{W} a, kiln_f32x{W} b) {{
{minbody}
}}
static inline kiln_i32x{W} kiln_max_i32x{W}(kiln_i32x{W} a, kiln_i32x{W} b) {{
  return kiln_sel_i32x{W}(a > b, a, b);
}}
static inline kiln_i32x{W} kiln_min_i32x{W}(kiln_i32x{W} a, kiln_i32x{W} b) {{
  return kiln_sel_i32x{W}(a < b, a, b);
}}
static inline kiln_f32x{W} kiln_abs_f32x{W}(kiln_f32x{W} x) {{
  return (kiln_f32x{W})((kiln_u32x{W})x & 0x7fffffffu);
}}
static inline kiln_i32x{W} kiln_abs_i32x{W}(kiln_i32x{W} x) {{ return kiln_sel_i32x{W}(x < 0, -x, x); }}
static inline kiln_f32x{W} kiln_sqrt_f32x{W}(kiln_f32x{W} x) {{
  kiln_f32x{W} r;
  for (int l = 0; l < {W}; ++l) r[l] = __builtin_sqrtf(x[l]);
  return r;
}}
static inline kiln_f32x{W} kiln_pow_f32x{W}(kiln_f32x{W} x, kiln_f32x{W} y) {{
  kiln_f32x{W} r;
  for (int l = 0; l < {W}; ++l) r[l] = __builtin_powf(x[l], y[l]);
  return r;
}}
static inline kiln_i32x{W} kiln_iota_i32x{W}(void) {{ return (kiln_i32x{W}){{{iota}}}; }}
/* the lane mask m (bit k: lane k) as a vector select mask: -1 in the lanes whose bit is set, 0 elsewhere */
static inline kiln_i32x{W} kiln_lanemask_i32x{W}(uint32_t m) {{
  return -((kiln_splat_i32x{W}((int32_t)m) >> kiln_iota_i32x{W}()) & 1);
}}
/* the W floats at p with the lanes whose bit of m is clear set to zero (m a constant lane mask; every lane
   of p[0..W-1] is readable): a zero-masking load where the ISA has one */
static inline kiln_f32x{W} kiln_maskz_load_f32x{W}(const float* p, uint32_t m) {{
{maskzbody}
}}
/* c + a * b in the lanes whose bit of m is set, c in the others (m a constant lane mask): a merge-masked
   FMA where the ISA has one (a stays an FMA's memory operand, no register for a masked load) */
static inline kiln_f32x{W} kiln_fma_mask_f32x{W}(kiln_f32x{W} c, kiln_f32x{W} a, kiln_f32x{W} b,
                                                 uint32_t m) {{
{fmamaskbody}
}}
"""

# Templates of the math functions. VF/VU: float / uint32 type; SFX: name suffix; SEL(mask, a, b);
# SPLAT(c): a constant of type VF; ASU / ASF: bit casts; CVTF: int32 -> float conversion.
_TEMPLATES = {
    "exp": """\
/* exp(x) = 2^n * e^r, n = round(x*log2(e)), r = x - n*ln2 (Cody-Waite). 2^n is applied in two halves
   so that overflow gives +inf and subnormal results are rounded once. */
static inline VF kiln_expSFX(VF x) {
FAST_BLOCK  VF xc = CLAMPHI(88.8f, x);
  xc = CLAMPLO(-104.0f, xc);
EXP_POLY(xc)SCALE_BLOCK}
""",
    "exp_le0": """\
/* exp(x) for x <= 0 (or nan), as in softmax's exp(x - max(x)); the result for x > 0 is unspecified. One
   clamp instead of two and a degree-5 polynomial, 5 FMAs instead of 6: within 3 ulp (2.04 measured, exp
   0.85); underflow and -inf (a mask) give 0, subnormal results are rounded once, as in exp. */
static inline VF kiln_exp_le0SFX(VF x) {
FAST_LE0_BLOCK  VF xc = x;
  xc = CLAMPLO(-104.0f, xc);
EXP5_POLY(xc)SCALE_BLOCK}
""",
    "log": """\
/* log(x) = e*ln2 + log1p(f), x = 2^e * (1 + f), 1 + f in [sqrt(1/2), sqrt(2)). */
static inline VF kiln_logSFX(VF x) {
  /* special cases are tested on the bits: integer compares cannot trap, so gcc if-converts the scalar form */
  VU u = ASU(x);
  VI sub = u < 0x00800000u;
  VF xm = x * 8388608.0f;
  VF xs = SEL(sub, xm, x);
  VU t = ASU(xs) - 0x3f3504f3u;
  VI e = ((VI)t) >> 23;
  VF f = ASF((t & 0x007fffffu) + 0x3f3504f3u) - 1.0f;
  VF ef = CVTF(e) + SEL(sub, SPLAT(-23.0f), SPLAT(0.0f));
  VF p = SPLAT(-7.645149529e-02f);
  p = p * f + 1.277835518e-01f;
  p = p * f + -1.316422820e-01f;
  p = p * f + 1.419983208e-01f;
  p = p * f + -1.662277430e-01f;
  p = p * f + 2.000128478e-01f;
  p = p * f + -2.500083745e-01f;
  p = p * f + 3.333333135e-01f;
  VF z = f * f;
  VF y = f * z * p;
  y = y + ef * -2.12194440e-04f;
  y = y - 0.5f * z;
  VF r = f + y;
  r = r + ef * 6.93359375e-01f;
  r = SEL(u == 0x7f800000u, x, r);
  r = SEL(u <= 0x7f800000u, r, SPLAT(__builtin_nanf("")));
  return SEL((u & 0x7fffffffu) == 0, SPLAT(-__builtin_inff()), r);
}
""",
    "tanh": """\
/* tanh: an odd polynomial below 0.625, else 1 - 2/(exp(2|x|) + 1) with the sign of x. */
static inline VF kiln_tanhSFX(VF x) {
  VF ax = ASF(ASU(x) & 0x7fffffffu);
  VF z = x * x;
  VF p = SPLAT(-5.663615186e-03f);
  p = p * z + 2.060323767e-02f;
  p = p * z + -5.372913182e-02f;
  p = p * z + 1.333132088e-01f;
  p = p * z + -3.333327770e-01f;
  VF small = ax + ax * z * p;
  VF e = kiln_expSFX(ax + ax);
  VF big = 1.0f - 2.0f / (e + 1.0f);
  VF r = SEL(ax < 0.625f, small, big);
  return ASF(ASU(r) | (ASU(x) & 0x80000000u));
}
""",
    "sigmoid": """\
/* sigmoid(x) = 1/(1+e) for x >= 0, e/(1+e) for x < 0, e = exp(-|x|): no overflow, exact tails. */
static inline VF kiln_sigmoidSFX(VF x) {
  VF e = kiln_expSFX(-ASF(ASU(x) & 0x7fffffffu));
  VF num = SEL(x >= 0.0f, SPLAT(1.0f), e);
  return num / (1.0f + e);
}
""",
    "erf": """\
/* erf: x + x*P(x^2) for |x| < 1; else 1 - exp(-x^2)*Q(|x|) with the sign of x (|x| clamped to 4, where
   erf is 1 in float32). */
static inline VF kiln_erfSFX(VF x) {
  VF ax = ASF(ASU(x) & 0x7fffffffu);
  VF z = x * x;
  VF p = SPLAT(7.806903159e-05f);
  p = p * z + -7.997853099e-04f;
  p = p * z + 5.187162198e-03f;
  p = p * z + -2.685334720e-02f;
  p = p * z + 1.128357872e-01f;
  p = p * z + -3.761262596e-01f;
  p = p * z + 1.283791661e-01f;
  VF small = ax + ax * p;
  VF a = SEL(ax > 4.0f, SPLAT(4.0f), ax);
  VF e = kiln_expSFX(-(a * a));
  VF u = a - 2.5f;
  VF q = SPLAT(1.093251194e-04f);
  q = q * u + 2.377274941e-04f;
  q = q * u + 5.666613579e-04f;
  q = q * u + -6.451981608e-04f;
  q = q * u + 2.299522981e-03f;
  q = q * u + -8.141292259e-03f;
  q = q * u + 2.491115034e-02f;
  q = q * u + -7.434227318e-02f;
  q = q * u + 2.108076960e-01f;
  VF big = 1.0f - e * q;
  VF r = SEL(ax < 1.0f, small, big);
  return ASF(ASU(r) | (ASU(x) & 0x80000000u));
}
""",
}


# exp's argument reduction, shared by exp and exp_le0: x = n ln2 + r (t holds n in its low bits)
_EXP_REDUCE = """\
  VF t = XC * 1.44269502e+00f + 12582912.0f;
  VF n = t - 12582912.0f;
  VF r = XC - n * 6.93359375e-01f;
  r = r - n * -2.12194440e-04f;
"""

# exp's polynomial (p = e^r): e^r = 1 + r(1 + r P(r)) in Horner form, 6 FMAs (written 1 + r + r^2 P(r) it
# took 7 operations and was less accurate: 1.22 vs 0.85 ulp)
_EXP_POLY = (
    _EXP_REDUCE
    + """\
  VF p = SPLAT(1.382046845e-03f);
  p = p * r + 8.369250223e-03f;
  p = p * r + 4.166828468e-02f;
  p = p * r + 1.666651666e-01f;
  p = p * r + 4.999999404e-01f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
"""
)

# exp_le0's: e^r = 1 + r P(r), P of degree 4 (scripts/fit_math.py), in Horner form
_EXP5_POLY = (
    _EXP_REDUCE
    + """\
  VF p = SPLAT(8.290625177e-03f);
  p = p * r + 4.190231860e-02f;
  p = p * r + 1.666765064e-01f;
  p = p * r + 4.999911785e-01f;
  p = p * r + 9.999997020e-01f;
  p = p * r + 1.0f;
"""
)

# Without vscalefps (AVX2, SSE): when every lane has |x| < 86 (n in [-124, 124], so p * 2^n is normal),
# skip the clamps and apply 2^n by adding n to p's exponent bits (t << 23 is n << 23: the magic constant's
# low bits vanish) -- the same bits as the two-halves scaling, in 2 operations instead of 9.
_EXP_FAST = {
    8: ("defined(__AVX__) && !defined(__AVX512VL__)", "__builtin_ia32_movmskps256", "0xff"),
    4: ("defined(__SSE__) && !defined(__AVX512VL__)", "__builtin_ia32_movmskps", "0xf"),
}


def _fast_block(
    width: int,
    in_range: str = "ASF(ASU(x) & 0x7fffffffu) < 86.0f",
    poly: str = _EXP_POLY,
) -> str:
    """The fast path of exp (``in_range``: every lane's x is in (-86, 86)) or of exp_le0 (x > -86)."""
    if width not in _EXP_FAST:
        return ""
    cond, movemask, full = _EXP_FAST[width]
    return (
        f"#if {cond}\n"
        f"  if ({movemask}((VF)({in_range})) == {full}) {{\n"
        + poly.replace("XC", "x").replace("\n  ", "\n    ").replace("  VF t", "    VF t", 1)
        + "    return ASF(ASU(p) + (ASU(t) << 23));\n  }\n#endif\n"
    )


# 2^n applied to p: in two halves (portable), or with AVX-512's vscalefps, which scales by a float exponent
# with correct overflow / subnormal rounding in one instruction.
_SCALE_PORTABLE = """\
  VI ni = (VI)(ASU(t) - 0x4b400000u);
  VI n1 = ni >> 1;
  VI n2 = ni - n1;
  VF s1 = ASF((VU)(n1 + 127) << 23);
  VF s2 = ASF((VU)(n2 + 127) << 23);
  return (p * s1) * s2;
"""
_SCALEF = {
    16: ("__AVX512F__", "__builtin_ia32_scalefps512_mask(p, n, p, (unsigned short)0xffff, 4)"),
    8: ("__AVX512VL__", "__builtin_ia32_scalefps256_mask(p, n, p, (unsigned char)0xff)"),
    4: ("__AVX512VL__", "__builtin_ia32_scalefps128_mask(p, n, p, (unsigned char)0xff)"),
}


def _scale_block(width: int) -> str:
    if width not in _SCALEF:
        return _SCALE_PORTABLE
    macro, call = _SCALEF[width]
    return f"#if defined({macro})\n  return {call};\n#else\n{_SCALE_PORTABLE}#endif\n"


_MINMAX_BUILTIN = {
    16: ("__AVX512F__", "__builtin_ia32_{op}ps512_mask(a, b, a, (unsigned short)0xffff, 4)"),
    8: ("__AVX__", "__builtin_ia32_{op}ps256(a, b)"),
    4: ("__SSE__", "__builtin_ia32_{op}ps(a, b)"),
}


_STREAM_BUILTIN = {
    16: ("__AVX512F__", "__builtin_ia32_movntps512"),
    8: ("__AVX__", "__builtin_ia32_movntps256"),
    4: ("__SSE__", "__builtin_ia32_movntps"),
}


_MASKZ_PORTABLE = """\
  return kiln_sel_f32x{W}(kiln_lanemask_i32x{W}(m), kiln_load_f32x{W}(p), kiln_splat_f32x{W}(0.0f));
"""
_MASKZ_BUILTIN = {
    16: (("__AVX512F__", "__builtin_ia32_loadups512_mask(p, kiln_splat_f32x16(0.0f), (unsigned short)m)"),),
    8: (
        ("__AVX512VL__", "__builtin_ia32_loadups256_mask(p, kiln_splat_f32x8(0.0f), (unsigned char)m)"),
        (
            "__AVX__",
            "__builtin_ia32_maskloadps256((const kiln_f32x8*)p, kiln_lanemask_i32x8(m))",
        ),
    ),
    4: (("__AVX512VL__", "__builtin_ia32_loadups128_mask(p, kiln_splat_f32x4(0.0f), (unsigned char)m)"),),
}


def _maskz_body(width: int) -> str:
    """``kiln_maskz_load``: AVX-512's zero-masking load (``vmovups {z}``), AVX's ``vmaskmovps``, else a
    whole load and a select with the constant mask."""
    out = ""
    for k, (macro, call) in enumerate(_MASKZ_BUILTIN.get(width, ())):
        out += f"#{'el' if k else ''}if defined({macro})\n  return {call};\n"
    portable = _MASKZ_PORTABLE.format(W=width)
    return f"{out}#else\n{portable}#endif" if out else portable.rstrip("\n")


_FMA_MASK_PORTABLE = """\
  return c + kiln_sel_f32x{W}(kiln_lanemask_i32x{W}(m), a, kiln_splat_f32x{W}(0.0f)) * b;
"""
_FMA_MASK_BUILTIN = {
    16: ("__AVX512F__", "__builtin_ia32_vfmaddps512_mask3(a, b, c, (unsigned short)m, 4)"),
    8: ("__AVX512VL__", "__builtin_ia32_vfmaddps256_mask3(a, b, c, (unsigned char)m)"),
    4: ("__AVX512VL__", "__builtin_ia32_vfmaddps128_mask3(a, b, c, (unsigned char)m)"),
}


def _fma_mask_body(width: int) -> str:
    """``kiln_fma_mask``: AVX-512's merge-masked FMA, else a select and an FMA."""
    macro, call = _FMA_MASK_BUILTIN[width]
    return f"#if defined({macro})\n  return {call};\n#else\n{_FMA_MASK_PORTABLE.format(W=width)}#endif"


def _stream_body(width: int) -> str:
    macro, builtin = _STREAM_BUILTIN[width]
    return (
        f"#if defined({macro})\n  if (((uintptr_t)p & {4 * width - 1}) == 0) {{ {builtin}(p, v); return; }}\n"
        f"#endif\n  kiln_store_f32x{width}(p, v);"
    )


def _minmax_body(op: str, width: int) -> str:
    macro, call = _MINMAX_BUILTIN[width]
    cmp = ">" if op == "max" else "<"
    return (
        f"#if defined({macro})\n  return {call.format(op=op)};\n#else\n"
        f"  return kiln_sel_f32x{width}(a {cmp} b, a, b);\n#endif"
    )


def _render(template: str, width: int) -> str:
    template = template.replace("SCALE_BLOCK", _scale_block(width))
    template = template.replace("FAST_BLOCK", _fast_block(width))
    template = template.replace("FAST_LE0_BLOCK", _fast_block(width, "x > -86.0f", _EXP5_POLY))
    template = template.replace("EXP5_POLY(xc)", _EXP5_POLY.replace("XC", "xc"))
    template = template.replace("EXP_POLY(xc)", _EXP_POLY.replace("XC", "xc"))
    if width == 1:
        subs = {
            "VF": "float",
            "VU": "uint32_t",
            "VI": "int32_t",
            "SFX": "f",
            "SEL(": "kiln_sel_f32(",
            "CLAMPHI(88.8f, x)": "kiln_sel_f32(x > 88.8f, 88.8f, x)",
            "CLAMPLO(-104.0f, xc)": "kiln_sel_f32(xc < -104.0f, -104.0f, xc)",
            "SPLAT(": "(",
            "ASU(": "kiln_bits_f32(",
            "ASF(": "kiln_f32_bits(",
            "CVTF(e)": "(float)(e)",
        }
    else:
        w = str(width)
        subs = {
            "VF": f"kiln_f32x{w}",
            "VU": f"kiln_u32x{w}",
            "VI": f"kiln_i32x{w}",
            "SFX": f"_f32x{w}",
            "SEL(": f"kiln_sel_f32x{w}(",
            "CLAMPHI(88.8f, x)": f"kiln_min_f32x{w}(kiln_splat_f32x{w}(88.8f), x)",
            "CLAMPLO(-104.0f, xc)": f"kiln_max_f32x{w}(kiln_splat_f32x{w}(-104.0f), xc)",
            "SPLAT(": f"kiln_splat_f32x{w}(",
            "ASU(": f"(kiln_u32x{w})(",
            "ASF(": f"(kiln_f32x{w})(",
            "CVTF(e)": f"__builtin_convertvector(e, kiln_f32x{w})",
        }
    out = template
    for k, v in subs.items():
        out = out.replace(k, v)
    return out


class Prelude:
    """Collects what generated code uses and renders the prelude with only those parts."""

    def __init__(self) -> None:
        self.widths: set[int] = set()
        self.funcs: set[tuple[str, int]] = set()

    def use_width(self, width: int) -> None:
        if width not in WIDTHS:
            raise ValueError(f"unsupported vector width {width}")
        self.widths.add(width)

    def use_math(self, name: str, width: int = 1) -> str:
        """Record a use of math function ``name`` at ``width`` lanes; return the C function name."""
        if name not in MATH_FUNCS:
            raise ValueError(f"no prelude math function {name!r}")
        if width > 1:
            self.use_width(width)
        for dep in (*_DEPS.get(name, ()), name):
            self.funcs.add((dep, width))
        return f"kiln_{name}f" if width == 1 else f"kiln_{name}_f32x{width}"

    def render(self) -> str:
        parts = [_HEADER]
        for s, t in _SCALAR_TYPES.items():
            parts.append(_MINMAX.format(T=t, s=s))
            if s in ("f32", "f64"):
                parts.append(_FLOORDIV_FLOAT.format(T=t, s=s, sfx="f" if s == "f32" else ""))
            elif s != "f16":
                parts.append(_FLOORDIV_INT.format(T=t, s=s))
        for w in sorted(self.widths):
            lanes = ", ".join("s" for _ in range(w))
            iota = ", ".join(str(i) for i in range(w))
            parts.append(
                _VECTOR.format(
                    W=w,
                    B=4 * w,
                    splat=lanes,
                    iota=iota,
                    maxbody=_minmax_body("max", w),
                    minbody=_minmax_body("min", w),
                    streambody=_stream_body(w),
                    maskzbody=_maskz_body(w),
                    fmamaskbody=_fma_mask_body(w),
                )
            )
        for name in MATH_FUNCS:  # dependency order: exp first
            for w in (1, *WIDTHS):
                if (name, w) in self.funcs:
                    parts.append(_render(_TEMPLATES[name], w))
        return "\n".join(parts)


def full_prelude() -> str:
    """The prelude with every function at every width (benchmarks and tests)."""
    p = Prelude()
    for w in (1, *WIDTHS):
        for name in MATH_FUNCS:
            p.use_math(name, w)
    return p.render()
