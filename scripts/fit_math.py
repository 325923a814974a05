"""Fit the polynomial coefficients of the float32 math prelude (``compiler/codegen/kiln_math.py``).

Each approximation is a weighted minimax fit found with Lawson's algorithm (iteratively reweighted least
squares) in float64; coefficients are then rounded to float32 one at a time, lowest order first, refitting
the remaining ones after each rounding so that the rounding error is absorbed by the higher terms.

    python scripts/fit_math.py          # prints every coefficient set and its fitted error

The printed numbers are what ``kiln_math.py`` holds; the measured accuracy of the finished C functions is
checked by ``tests/compiler/backends/cpu/test_kiln_math.py`` and ``scripts/bench_math.py``.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special


def lawson(basis: np.ndarray, target: np.ndarray, weight: np.ndarray, iters: int = 400) -> np.ndarray:
    """Coefficients c minimising max |weight * (target - basis @ c)| (approximately)."""
    n = len(target)
    lw = np.full(n, 1.0 / n)
    c = np.zeros(basis.shape[1])
    for _ in range(iters):
        s = np.sqrt(lw) * weight
        c, *_ = np.linalg.lstsq(basis * s[:, None], target * s, rcond=None)
        err = np.abs(weight * (target - basis @ c))
        lw = lw * (err + 1e-300)
        lw /= lw.sum()
    return c


def fit_rounded(
    x: np.ndarray, target: np.ndarray, weight: np.ndarray, powers: list[int]
) -> tuple[np.ndarray, float]:
    """Fit target ~ sum c_k x**p_k; round c to float32 lowest order first, refitting the rest."""
    basis = np.stack([x**p for p in powers], axis=1)
    fixed: list[float] = []
    resid = target.copy()
    for k in range(len(powers)):
        c = lawson(basis[:, k:], resid, weight)
        ck = float(np.float32(c[0]))
        fixed.append(ck)
        resid = resid - ck * basis[:, k]
    coeffs = np.array(fixed)
    err = float(np.max(np.abs(weight * (target - basis @ coeffs))))
    return coeffs, err


def cheb(lo: float, hi: float, n: int = 6000) -> np.ndarray:
    t = np.cos(np.pi * (np.arange(n) + 0.5) / n)
    return np.sort(0.5 * (lo + hi) + 0.5 * (hi - lo) * t)


def show(name: str, coeffs: np.ndarray, err: float, note: str) -> None:
    print(f"{name}: fitted max error {err:.3e} ({note})")
    for c in coeffs:
        print(f"    {np.float32(c):.9e}f")


def main() -> None:
    # exp(r) = 1 + r + r^2 * P(r), evaluated as 1 + r(1 + r P(r)); |r| <= ln2/2; relative error of exp(r)
    r = cheb(-math.log(2) / 2 * 1.01, math.log(2) / 2 * 1.01)
    target = (np.expm1(r) - r) / r**2
    c, e = fit_rounded(r, target, r**2 / np.exp(r), [0, 1, 2, 3, 4])
    show("exp P(r)", c, e, "relative, of exp(r)")

    # exp_le0 (softmax's exp, one degree less): exp(r) = 1 + r * P(r), P of degree 4, in Horner form
    rn = r[np.abs(r) > 1e-9]
    c, e = fit_rounded(rn, np.expm1(rn) / rn, rn / np.exp(rn), [0, 1, 2, 3, 4])
    show("exp_le0 P(r)", c, e, "relative, of exp(r)")

    # log1p(f) = f - f^2/2 + f^3 * P(f), f in [sqrt(1/2)-1, sqrt(2)-1]; relative error of log1p(f)
    f = cheb(math.sqrt(0.5) - 1 - 1e-3, math.sqrt(2) - 1 + 1e-3)
    f = f[np.abs(f) > 1e-6]
    target = (np.log1p(f) - f + f * f / 2) / f**3
    c, e = fit_rounded(f, target, np.abs(f**3 / np.log1p(f)), list(range(8)))
    show("log P(f)", c, e, "relative, of log1p(f)")

    # tanh(x) = x + x^3 * P(x^2), |x| <= 0.625; relative error of tanh(x)
    x = cheb(1e-4, 0.63)
    z = x * x
    target = (np.tanh(x) - x) / x**3
    c, e = fit_rounded(z, target, x**3 / np.tanh(x), [0, 1, 2, 3, 4])
    show("tanh P(z)", c, e, "relative, of tanh(x)")

    # erf(x) = x + x * P(x^2), |x| <= 1 (P(0) = 2/sqrt(pi) - 1: its rounding costs little); relative error
    x = cheb(1e-4, 1.0)
    z = x * x
    ratio = special.erf(x) / x
    c, e = fit_rounded(z, ratio - 1, 1 / ratio, list(range(7)))
    show("erf small P(z)", c, e, "relative, of erf(x)")

    # erfc(x) = exp(-x^2) * Q(x), 1 <= x <= 4; absolute error of erfc(x)
    x = cheb(0.99, 4.0)
    q = special.erfcx(x)
    c, e = fit_rounded(x - 2.5, q, np.exp(-x * x), list(range(9)))
    show("erfc Q(x - 2.5)", c, e, "absolute, of erfc(x)")


if __name__ == "__main__":
    main()
