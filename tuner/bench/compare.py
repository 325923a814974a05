"""The regression gate: compare two bench runs workload by workload, contender by contender
(:func:`tuner.bench.stats.compare` gives each verdict)."""

from __future__ import annotations

from tuner.bench.results import OK, BenchRun
from tuner.bench.stats import NOT_COMPARED, REGRESSION, Verdict, compare


def compare_runs(
    baseline: BenchRun, new: BenchRun, *, threshold: float = 0.10, alpha: float = 0.05
) -> list[Verdict]:
    """One verdict per (workload, contender) of ``new``; pairs missing or not timed in one run are "not
    compared" with the reason."""
    out = []
    for r in new.results:
        b = baseline.result(r.workload, r.contender)
        if b is None:
            out.append(
                Verdict(
                    r.workload, r.contender, NOT_COMPARED, reason=f"not in run {baseline.id or 'baseline'}"
                )
            )
        elif r.status != OK or b.status != OK:
            why = f"baseline {b.status}, new {r.status}"
            out.append(Verdict(r.workload, r.contender, NOT_COMPARED, b.median_us, r.median_us, reason=why))
        else:
            out.append(
                compare(r.workload, r.contender, b.rounds_us, r.rounds_us, threshold=threshold, alpha=alpha)
            )
    return out


def has_regression(verdicts: list[Verdict]) -> bool:
    return any(v.verdict == REGRESSION for v in verdicts)
