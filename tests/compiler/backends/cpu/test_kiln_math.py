"""Accuracy of the float32 math prelude against float64 references, scalar and vector forms."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from scipy import special

from compiler.backends.cpu import gcc as cbuild
from compiler.backends.cpu.kiln_math import MATH_FUNCS, full_prelude

WIDTHS = (1, 4, 8, 16)
REFS = {"exp": np.exp, "exp_le0": np.exp, "log": np.log, "tanh": np.tanh, "sigmoid": special.expit,
        "erf": special.erf}  # fmt: skip
MAX_ULP = {"exp": 3.0, "exp_le0": 3.0, "log": 3.0, "tanh": 3.0, "sigmoid": 3.0, "erf": 3.0}
EDGES = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 1e-45, -1e-45, 1.17549435e-38, 3.4028235e38,
         -3.4028235e38, 88.72283, 88.7229, 89.0, -87.33655, -103.97, -104.0, -150.0, 0.625, 0.62499994,
         0.99999994, 3.92, 4.0, 9.0, -9.0, 20.0]  # fmt: skip


@pytest.fixture(scope="module")
def lib() -> cbuild.KernelLibrary:
    src = [full_prelude()]
    for f in MATH_FUNCS:
        src.append(
            f"void run_{f}_1(const float* restrict x, float* restrict y, long n) "
            f"{{ for (long i = 0; i < n; ++i) y[i] = kiln_{f}f(x[i]); }}"
        )
        for w in WIDTHS[1:]:
            src.append(
                f"void run_{f}_{w}(const float* restrict x, float* restrict y, long n) {{\n"
                f"  long i = 0;\n"
                f"  for (; i + {w} <= n; i += {w})\n"
                f"    kiln_store_f32x{w}(y + i, kiln_{f}_f32x{w}(kiln_load_f32x{w}(x + i)));\n"
                f"  for (; i < n; ++i) y[i] = kiln_{f}f(x[i]);\n}}"
            )
    return cbuild.build("\n".join(src))


def evaluate(lib: cbuild.KernelLibrary, name: str, width: int, x: np.ndarray) -> np.ndarray:
    fn = lib.function(f"run_{name}_{width}")
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
    y = np.empty_like(x)
    fn(x.ctypes.data, y.ctypes.data, x.size)
    return y


def samples() -> np.ndarray:
    bits = np.arange(0, 2**32, 1021, dtype=np.uint64).astype(np.uint32)
    dense = np.concatenate([np.linspace(-12, 12, 200_001), np.linspace(-120, 100, 100_001)]).astype(
        np.float32
    )
    return np.concatenate([bits.view(np.float32), dense, np.float32(EDGES)])


def ulp_errors(y: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ulp error where the rounded reference is finite, mask of wrong special values)."""
    y64 = y.astype(np.float64)
    with np.errstate(all="ignore"):
        r32 = ref.astype(np.float32).astype(np.float64)
    special_ = ~np.isfinite(r32)
    wrong = special_ & ~((y64 == r32) | (np.isnan(y64) & np.isnan(r32)))
    fin = ~special_
    _, e = np.frexp(np.abs(ref[fin]))
    ulp = np.maximum(np.ldexp(1.0, e - 24), 2.0**-149)
    err = np.abs(y64[fin] - ref[fin]) / ulp
    err[~np.isfinite(y64[fin])] = np.inf
    return err, wrong


@pytest.mark.parametrize("name", MATH_FUNCS)
def test_accuracy_over_the_float_range(lib: cbuild.KernelLibrary, name: str):
    x = samples()
    if name == "exp_le0":  # defined for x <= 0 (and nan) only
        x = x[~(x > 0)]
    with np.errstate(all="ignore"):
        ref = REFS[name](x.astype(np.float64))
    for w in WIDTHS:
        y = evaluate(lib, name, w, x)
        err, wrong = ulp_errors(y, ref)
        assert not wrong.any(), f"{name} x{w}: wrong special values at {x[wrong][:8]}"
        assert err.max() <= MAX_ULP[name], f"{name} x{w}: {err.max():.2f} ulp"
        if name == "erf":
            assert np.nanmax(np.abs(y.astype(np.float64) - ref)) <= 2e-7


def test_special_values(lib: cbuild.KernelLibrary):
    x = np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, -1.0, 100.0, -200.0])
    exp, log = evaluate(lib, "exp", 16, np.resize(x, 16))[:8], evaluate(lib, "log", 1, x)
    np.testing.assert_array_equal(exp, np.float32([1, 1, np.inf, 0, np.nan, np.exp(-1.0), np.inf, 0]))
    np.testing.assert_array_equal(log[:6], np.float32([-np.inf, -np.inf, np.inf, np.nan, np.nan, np.nan]))
    tanh, erf, sig = (evaluate(lib, n, 4, x) for n in ("tanh", "erf", "sigmoid"))
    np.testing.assert_array_equal(tanh[[2, 3, 6, 7]], np.float32([1, -1, 1, -1]))
    np.testing.assert_array_equal(erf[[2, 3, 6, 7]], np.float32([1, -1, 1, -1]))
    np.testing.assert_array_equal(sig[[2, 3, 6, 7]], np.float32([1, 0, 1, 0]))
    for arr in (tanh, erf, sig):
        assert np.isnan(arr[4])
    assert np.signbit(tanh[1]) and np.signbit(erf[1])  # odd functions keep -0
    # subnormal results are produced, not flushed
    tiny = evaluate(lib, "exp", 8, np.full(8, -100.0, np.float32))
    assert tiny[0] > 0 and abs(tiny[0] - np.float32(np.exp(-100.0))) <= 2e-45
    assert evaluate(lib, "sigmoid", 1, np.float32([-100.0]))[0] > 0


@pytest.mark.parametrize("width", WIDTHS[1:])
def test_exp_fast_path_gives_the_bits_of_the_full_path(lib: cbuild.KernelLibrary, width: int):
    """Without vscalefps a vector whose lanes all have |x| < 86 takes a shorter path (no clamps, 2^n added
    to the exponent bits); one lane outside sends the whole vector through the full path."""
    x = np.linspace(-85.99, 85.99, 4 * width, dtype=np.float32)
    mixed = x.copy()
    mixed[width - 1 :: width] = np.float32([100.0, -100.0, np.nan, 86.0])[: len(mixed[width - 1 :: width])]
    fast, full = evaluate(lib, "exp", width, x), evaluate(lib, "exp", width, mixed)
    keep = np.ones(len(x), bool)
    keep[width - 1 :: width] = False
    np.testing.assert_array_equal(fast[keep], full[keep])
    np.testing.assert_array_equal(fast, evaluate(lib, "exp", 1, x))  # and the scalar form's bits


@pytest.mark.parametrize("width", WIDTHS)
def test_exp_le0_special_values(lib: cbuild.KernelLibrary, width: int):
    """softmax's exp(x - max(x)): 0 at a -inf mask and below the subnormals, subnormal results rounded
    once, nan kept."""
    x = np.float32([0.0, -0.0, -np.inf, np.nan, -1.0, -200.0, -3.4028235e38, -100.0])
    y = evaluate(lib, "exp_le0", width, np.resize(x, 16))[:8]
    np.testing.assert_array_equal(y[[0, 1, 2, 3, 5, 6]], np.float32([1, 1, 0, np.nan, 0, 0]))
    assert abs(float(y[4]) - np.exp(-1.0)) <= 3 * 2.0**-25  # 3 ulp
    assert y[7] > 0 and abs(y[7] - np.float32(np.exp(-100.0))) <= 2e-45


@pytest.mark.parametrize("width", WIDTHS[1:])
def test_exp_le0_fast_path_gives_the_bits_of_the_full_path(lib: cbuild.KernelLibrary, width: int):
    """Without vscalefps a vector whose lanes all have x > -86 takes the shorter path; one lane below sends
    the whole vector through the full path: the same bits either way."""
    x = np.linspace(-85.99, 0.0, 4 * width, dtype=np.float32)
    mixed = x.copy()
    mixed[width - 1 :: width] = np.float32([-100.0, -np.inf, np.nan, -86.0])[: len(mixed[width - 1 :: width])]
    fast, full = evaluate(lib, "exp_le0", width, x), evaluate(lib, "exp_le0", width, mixed)
    keep = np.ones(len(x), bool)
    keep[width - 1 :: width] = False
    np.testing.assert_array_equal(fast[keep], full[keep])
    np.testing.assert_array_equal(fast, evaluate(lib, "exp_le0", 1, x))
