"""Throughput and accuracy of Kiln's float32 math prelude vs numpy/scipy, and gcc build latency.

    python scripts/bench_math.py                 # sampled accuracy (every 97th float32 + dense ranges)
    python scripts/bench_math.py --exhaustive    # accuracy over all 2^32 float32 values (a few minutes)

Throughput is single-threaded, float32 arrays of --n elements (L2-resident by default so that compute, not
DRAM, is measured): the explicit 16-lane form, the scalar form in a loop gcc auto-vectorizes, and numpy's
(scipy's for erf and sigmoid) float32 function. Accuracy is against float64 references (scipy for erf).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import tempfile
import time

import numpy as np
from scipy import special

from compiler.backends.cpu import gcc as cbuild
from compiler.backends.cpu.kiln_math import MATH_FUNCS, full_prelude

REFS = {"exp": np.exp, "exp_le0": np.exp, "log": np.log, "tanh": np.tanh, "sigmoid": special.expit,
        "erf": special.erf}  # fmt: skip
NONPOSITIVE = {"exp_le0"}  # defined for x <= 0 only: measured there


def runner_source() -> str:
    src = [full_prelude()]
    for f in MATH_FUNCS:
        src.append(
            f"void scalar_{f}(const float* restrict x, float* restrict y, long n) {{\n"
            f"  for (long i = 0; i < n; ++i) y[i] = kiln_{f}f(x[i]);\n}}\n"
            f"void vec_{f}(const float* restrict x, float* restrict y, long n) {{\n"
            f"  long i = 0;\n"
            f"  for (; i + 16 <= n; i += 16)\n"
            f"    kiln_store_f32x16(y + i, kiln_{f}_f32x16(kiln_load_f32x16(x + i)));\n"
            f"  for (; i < n; ++i) y[i] = kiln_{f}f(x[i]);\n}}\n"
        )
    return "\n".join(src)


def fn(lib: cbuild.KernelLibrary, name: str):
    f = lib.function(name)
    f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
    return lambda x, y: f(x.ctypes.data, y.ctypes.data, x.size)


def best_of(call, repeats: int) -> float:
    call()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return min(times)


def ulp_error(y: np.ndarray, ref: np.ndarray) -> tuple[float, float, int]:
    """(max ulp error, max abs error, number of wrong special values)."""
    y64 = y.astype(np.float64)
    with np.errstate(all="ignore"):
        r32 = ref.astype(np.float32).astype(np.float64)
    special_ = ~np.isfinite(r32)
    wrong = int((special_ & ~((y64 == r32) | (np.isnan(y64) & np.isnan(r32)))).sum())
    fin = special_ == 0
    if not fin.any():
        return 0.0, 0.0, wrong
    _, e = np.frexp(np.abs(ref[fin]))
    ulp = np.maximum(np.ldexp(1.0, e - 24), 2.0**-149)
    diff = np.abs(y64[fin] - ref[fin])
    return float(np.max(diff / ulp)), float(np.max(diff)), wrong


def accuracy(lib: cbuild.KernelLibrary, exhaustive: bool) -> None:
    print("accuracy vs float64 (max ulp / max abs error / wrong special values), scalar and x16 forms")
    if exhaustive:
        chunks = (
            np.arange(s, min(s + 2**26, 2**32), dtype=np.uint64).astype(np.uint32)
            for s in range(0, 2**32, 2**26)
        )
    else:
        bits = np.arange(0, 2**32, 97, dtype=np.uint64).astype(np.uint32)
        dense = np.linspace(-20, 20, 2_000_001).astype(np.float32).view(np.uint32)
        chunks = iter([bits, dense])
    stats = {(f, k): [0.0, 0.0, 0] for f in MATH_FUNCS for k in ("scalar", "vec")}
    for chunk in chunks:
        x = chunk.view(np.float32)
        for f in MATH_FUNCS:
            xf = x[~(x > 0)] if f in NONPOSITIVE else x
            yf = np.empty_like(xf)
            with np.errstate(all="ignore"):
                ref = REFS[f](xf.astype(np.float64))
            for kind in ("scalar", "vec"):
                fn(lib, f"{kind}_{f}")(xf, yf)
                u, a, w = ulp_error(yf, ref)
                s = stats[(f, kind)]
                relative = f in ("exp", "exp_le0")  # abs error of exp is meaningless
                s[0], s[1], s[2] = max(s[0], u), max(s[1], 0.0 if relative else a), s[2] + w
    for f in MATH_FUNCS:
        sc, ve = stats[(f, "scalar")], stats[(f, "vec")]
        print(
            f"  {f:8s} scalar {sc[0]:5.2f} ulp {sc[1]:.2e} abs {sc[2]} bad"
            f" | x16 {ve[0]:5.2f} ulp {ve[1]:.2e} abs {ve[2]} bad"
        )


def throughput(lib: cbuild.KernelLibrary, n: int, repeats: int) -> None:
    rng = np.random.default_rng(0)
    print(f"throughput, 1 thread, {n} float32 elements (Gelem/s; speedup vs numpy/scipy float32)")
    for f in MATH_FUNCS:
        x = rng.standard_normal(n).astype(np.float32) * 4
        if f == "log":
            x = np.abs(x) + 1e-3
        if f in NONPOSITIVE:
            x = -np.abs(x)
        y = np.empty_like(x)
        ref = REFS[f]
        t_np = best_of(lambda ref=ref, x=x, y=y: ref(x, out=y), repeats)
        t_vec = best_of(lambda f=f, x=x, y=y: fn(lib, f"vec_{f}")(x, y), repeats)
        t_sc = best_of(lambda f=f, x=x, y=y: fn(lib, f"scalar_{f}")(x, y), repeats)
        g = lambda t: n / t / 1e9  # noqa: E731
        print(
            f"  {f:8s} x16 {g(t_vec):6.2f}  scalar-loop {g(t_sc):6.2f}  numpy {g(t_np):6.2f}"
            f"   x16/numpy {t_np / t_vec:6.1f}x"
        )


def build_latency() -> None:
    small = (
        "void k_{tag}(const float* restrict x, float* restrict y) {{\n"
        "  for (int i = 0; i < 1024; ++i) y[i] = x[i] * 2;\n}}\n"
    )
    from compiler.backends.cpu.codegen import generate_c
    from compiler.loopir.expr import Load, Var, call
    from compiler.loopir.stmt import Buffer, BufferStore, For, PrimFunc
    from compiler.target import Target

    x, y = Buffer("x", (4096,), "float32"), Buffer("y", (4096,), "float32")
    i, v = Var("i"), Var("v")
    body = For(
        i, 256, For(v, 16, BufferStore(y, (i * 16 + v,), call("exp", Load(x, (i * 16 + v,)))), "vectorized")
    )
    exp_src = generate_c([PrimFunc("k_exp", [x, y], body, 1)], Target.host())
    with tempfile.TemporaryDirectory() as d:
        os.environ["KILN_CACHE_DIR"] = d
        for label, make in (
            ("tiny kernel", lambda t: small.format(tag=t)),
            ("exp kernel", lambda t: exp_src + f"// {t}"),
        ):
            cold = []
            for t in range(5):
                t0 = time.perf_counter()
                cbuild.compile_source(make(f"c{t}"))
                cold.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for _ in range(20):
                cbuild.compile_source(make("c0"))
            cached = (time.perf_counter() - t0) / 20
            print(
                f"build latency, {label}: cold median {1e3 * sorted(cold)[2]:.0f} ms,"
                f" cached {1e6 * cached:.0f} us"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1 << 16)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--exhaustive", action="store_true")
    args = ap.parse_args()
    lib = cbuild.build(runner_source())
    lib.set_num_threads(1) if hasattr(lib.lib, "kiln_set_num_threads") else None
    throughput(lib, args.n, args.repeats)
    accuracy(lib, args.exhaustive)
    build_latency()


if __name__ == "__main__":
    main()
