"""Summaries of timed samples and the regression verdict of `kiln bench compare` / `--baseline`.

A contender's figure is the median of its round medians; its spread is the interquartile range of the round
medians relative to that median (``±IQR/2``), and the min-max range is kept too.

The verdict for one (workload, contender) between a baseline run and a new run, in the manner of airspeed
velocity's ``asv compare``:

* ``ratio`` = new median / baseline median (above 1: slower);
* a two-sided Mann-Whitney U test on the two runs' round medians (rounds are the independent samples; the
  calls inside one round are not) gives ``p``;
* a 95% bootstrap interval (``scipy.stats.bootstrap``, percentile method, fixed seed) of that same ratio,
  resampling each run's round medians (the calls of a round are not independent: resampling them would
  give an interval far too narrow, and one that need not contain the ratio of the round medians);
* **regression** when ``p < alpha``, the interval lies above 1 and ``ratio > 1 + threshold``;
  **improvement** when ``p < alpha``, the interval lies below 1 and ``ratio < 1 / (1 + threshold)``;
  otherwise **no significant change** (a ratio past the threshold that the test does not support is
  reported as such, with its p and interval, but does not fail the gate).

With ``alpha`` 0.05 the test needs at least 4 rounds in each run (with 3 + 3 the smallest two-sided p is
0.1): :func:`compare` says "too few rounds" instead of a verdict then.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

REGRESSION = "regression"
IMPROVEMENT = "improvement"
NO_CHANGE = "no significant change"
NOT_COMPARED = "not compared"


@dataclass(frozen=True)
class Summary:
    """Median of the round medians, their quartiles, min and max (microseconds), and the call count."""

    median: float
    q1: float
    q3: float
    low: float
    high: float
    calls: int

    @property
    def spread(self) -> float:
        """Half the interquartile range of the round medians, relative to the median (0.05 = ±5%)."""
        return (self.q3 - self.q1) / 2 / self.median if self.median else 0.0


def summarize(round_medians: Sequence[float], calls: int) -> Summary:
    r = np.asarray(round_medians, dtype=float)
    q1, med, q3 = np.percentile(r, [25, 50, 75])
    return Summary(float(med), float(q1), float(q3), float(r.min()), float(r.max()), calls)


@dataclass(frozen=True)
class Verdict:
    """The comparison of one (workload, contender) between two runs."""

    workload: str
    contender: str
    verdict: str
    baseline_us: float | None = None
    new_us: float | None = None
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    p_value: float | None = None
    reason: str = ""

    def to_json(self) -> dict:
        return {
            "workload": self.workload,
            "contender": self.contender,
            "verdict": self.verdict,
            "baseline_us": self.baseline_us,
            "new_us": self.new_us,
            "ratio": self.ratio,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "p_value": self.p_value,
            "reason": self.reason,
        }


def ratio_interval(
    baseline: Sequence[float], new: Sequence[float], confidence: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """A bootstrap interval of median(new) / median(baseline) (percentile method, ``seed`` fixed)."""
    from scipy.stats import bootstrap

    def ratio(b: np.ndarray, n: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.median(n, axis=axis) / np.median(b, axis=axis)

    res = bootstrap(
        (np.asarray(baseline, float), np.asarray(new, float)),
        ratio,
        n_resamples=2000,
        confidence_level=confidence,
        method="percentile",
        vectorized=True,
        rng=np.random.default_rng(seed),
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def compare(
    workload: str,
    contender: str,
    baseline_rounds: Sequence[Sequence[float]],
    new_rounds: Sequence[Sequence[float]],
    *,
    threshold: float = 0.10,
    alpha: float = 0.05,
) -> Verdict:
    """The verdict between two runs' samples of one contender (see the module doc)."""
    from scipy.stats import mannwhitneyu

    base_med = [statistics.median(r) for r in baseline_rounds if r]
    new_med = [statistics.median(r) for r in new_rounds if r]
    if not base_med or not new_med:
        return Verdict(workload, contender, NOT_COMPARED, reason="no samples in one of the runs")
    b, n = statistics.median(base_med), statistics.median(new_med)
    ratio = n / b
    low, high = ratio_interval(base_med, new_med)
    if min(len(base_med), len(new_med)) < 4:
        return Verdict(
            workload, contender, NOT_COMPARED, b, n, ratio, low, high, None,
            f"too few rounds ({len(base_med)} and {len(new_med)}; the test needs at least 4 each)",
        )  # fmt: skip
    p = float(mannwhitneyu(new_med, base_med, alternative="two-sided").pvalue)
    if p < alpha and low > 1.0 and ratio > 1.0 + threshold:
        verdict = REGRESSION
        reason = f"{ratio:.2f}x slower (threshold {1 + threshold:.2f}x)"
    elif p < alpha and high < 1.0 and ratio < 1.0 / (1.0 + threshold):
        verdict, reason = IMPROVEMENT, f"{1 / ratio:.2f}x faster"
    else:
        verdict = NO_CHANGE
        if abs(ratio - 1.0) > threshold:
            reason = f"ratio {ratio:.2f} past the threshold but not significant (p={p:.3f})"
        else:
            reason = f"within ±{threshold:.0%}" if p < alpha else f"p={p:.3f}"
    return Verdict(workload, contender, verdict, b, n, ratio, low, high, p, reason)
