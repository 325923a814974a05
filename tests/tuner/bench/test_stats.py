from __future__ import annotations

import numpy as np
import pytest

from tuner.bench.stats import IMPROVEMENT, NO_CHANGE, NOT_COMPARED, REGRESSION, compare, summarize


def _rounds(
    median_us: float, seed: int, rounds: int = 5, calls: int = 20, noise: float = 0.03
) -> list[list[float]]:
    rng = np.random.default_rng(seed)
    return [list(median_us * rng.lognormal(0.0, noise, calls)) for _ in range(rounds)]


def test_summary_median_and_spread() -> None:
    s = summarize([100.0, 110.0, 90.0, 100.0, 120.0], calls=50)
    assert s.median == 100.0 and s.low == 90.0 and s.high == 120.0 and s.calls == 50
    assert s.spread == pytest.approx((110 - 100) / 2 / 100)


def test_thirty_percent_slower_is_a_regression() -> None:
    v = compare("w", "c", _rounds(1000, 1), _rounds(1300, 2))
    assert v.verdict == REGRESSION and v.ratio == pytest.approx(1.3, rel=0.03)
    assert v.ci_low > 1.2 and v.p_value < 0.05 and "slower" in v.reason


def test_same_distribution_is_no_significant_change() -> None:
    for seed in range(5):
        v = compare("w", "c", _rounds(1000, seed), _rounds(1000, seed + 100))
        assert v.verdict == NO_CHANGE, v


def test_faster_is_an_improvement_and_threshold_counts() -> None:
    assert compare("w", "c", _rounds(1000, 1), _rounds(700, 2)).verdict == IMPROVEMENT
    small = compare("w", "c", _rounds(1000, 1, noise=0.005), _rounds(1050, 2, noise=0.005))
    assert small.p_value < 0.05 and small.verdict == NO_CHANGE  # significant but within the 10% threshold
    assert compare(
        "w", "c", _rounds(1000, 1, noise=0.005), _rounds(1050, 2, noise=0.005), threshold=0.02
    ).verdict == (REGRESSION)


def test_one_noisy_round_is_not_a_regression() -> None:
    base = _rounds(1000, 1)
    new = _rounds(1000, 2)
    new[2] = [x * 3 for x in new[2]]  # another job took the cores for one round
    assert compare("w", "c", base, new).verdict == NO_CHANGE


def test_too_few_rounds_are_not_compared() -> None:
    v = compare("w", "c", _rounds(1000, 1, rounds=3), _rounds(2000, 2, rounds=3))
    assert v.verdict == NOT_COMPARED and "at least 4" in v.reason and v.ratio == pytest.approx(2.0, rel=0.05)
