"""Plain data that crosses the database boundary: what callers commit and what queries return.

These are frozen dataclasses, never ORM objects, so a caller can keep them after the database is closed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from db.status import Status


@dataclass(frozen=True)
class RecordIn:
    """A measurement to commit. The database fills median, Kiln version, host and creation time.

    ``config`` is the sketch's knob config (plain JSON scalars); ``latencies_us`` are the measured
    repeats in microseconds (required for ``ok``, optional otherwise).
    """

    workload_key: str
    target_key: str
    sketch: str
    sketch_version: int
    config: dict[str, Any]
    latencies_us: list[float] | None
    status: Status | str
    error: str | None = None
    run_id: int | None = None


@dataclass(frozen=True)
class Record:
    """A stored measurement (plain data). ``created_at`` is an aware UTC datetime; ``median_us`` is None
    when there are no latencies."""

    workload_key: str
    target_key: str
    sketch: str
    sketch_version: int
    config: dict[str, Any]
    latencies_us: tuple[float, ...] | None
    median_us: float | None
    status: Status
    error: str | None
    kiln_version: str
    host: str
    run_id: int | None
    created_at: datetime
    id: int


@dataclass(frozen=True)
class ConfirmationIn:
    """A confirmation to commit: the best candidate of a task (``config``) and its default re-measured in
    interleaved rounds through the same measurer. ``best_rounds[i]`` and ``default_rounds[i]`` are the
    medians of round ``i`` (rounds alternate which of the two runs first). The database derives the
    medians, the speed-up and its spread (see :class:`Confirmation`)."""

    workload_key: str
    target_key: str
    sketch: str
    sketch_version: int
    config: dict[str, Any]
    default_config: dict[str, Any]
    best_rounds: list[float]
    default_rounds: list[float]
    run_id: int | None = None


@dataclass(frozen=True)
class Confirmation:
    """A stored confirmation. ``speedup`` is the median over rounds of default / best (the two measured
    back to back in each round); ``spread`` is half the range of those per-round ratios, relative to
    ``speedup`` (0.03: the rounds agree within +-3%). ``best_us`` and ``default_us`` are the medians of the
    per-round medians. The candidate is *confirmed better* than the default when ``speedup > 1`` and its
    fastest round beats the default's fastest round (``fastest_ratio > 1``): load only ever slows a kernel
    down, so each config's fastest round is its least disturbed timing, and on a loaded machine the paired
    median alone is a coin flip once most rounds of either config were disturbed (confirmations with a
    spread of 73-643% under load 7-9 on 2 cores called 1 of 5 candidates faster by the paired median while
    the fastest rounds put every one of the 5 slower than its default)."""

    workload_key: str
    target_key: str
    sketch: str
    sketch_version: int
    config: dict[str, Any]
    default_config: dict[str, Any]
    best_rounds: tuple[float, ...]
    default_rounds: tuple[float, ...]
    best_us: float
    default_us: float
    speedup: float
    spread: float
    run_id: int | None
    kiln_version: str
    host: str
    created_at: datetime
    id: int

    @property
    def fastest_ratio(self) -> float:
        """The default's fastest round over the candidate's fastest round (above 1: the candidate faster)."""
        if not self.best_rounds or not self.default_rounds or min(self.best_rounds) <= 0:
            return 0.0
        return min(self.default_rounds) / min(self.best_rounds)

    @property
    def better(self) -> bool:
        """Whether the confirmed candidate beat the default: the median of the paired ratios and the ratio of
        the fastest rounds both above 1."""
        return self.speedup > 1.0 and self.fastest_ratio > 1.0

    @property
    def rounds(self) -> int:
        return len(self.best_rounds)


@dataclass(frozen=True)
class ImportStats:
    """What an import or merge did: records added, records skipped as duplicates of stored ones, and bad
    rows skipped (``skipped_bad``; ``problems`` names the first of them: line or record, and why)."""

    added: int = 0
    skipped_duplicates: int = 0
    workloads_added: int = 0
    targets_added: int = 0
    runs_added: int = 0
    model_tasks_added: int = 0
    fusion_plans_added: int = 0
    skipped_bad: int = 0
    problems: tuple[str, ...] = ()
    confirmations_added: int = 0


@dataclass(frozen=True)
class PrunePlan:
    """What ``prune`` deletes (or, with a dry run, would delete).

    ``doomed`` are the records to delete: ok records ranked after the ``keep`` best *valid* ones of their
    (workload, target) and, without ``keep_errors``, records that are not ok. ``left_alone`` are ok records
    that fail validation (a malformed config, or one the sketch's knob space rejects) with the reason: they
    never count among the K kept, and prune never deletes them (nor lets them push a valid record out).
    """

    keep: int
    keep_errors: bool
    doomed: tuple[Record, ...] = ()
    kept: int = 0
    left_alone: tuple[tuple[int, str], ...] = ()


@dataclass(frozen=True)
class WorkloadInfo:
    """A workload and how many records it has (all statuses, and ok ones)."""

    key: str
    kind: str
    flops: float
    bytes: float
    n_records: int = 0
    n_ok: int = 0


@dataclass(frozen=True)
class RunInfo:
    """A tuning run (one ``kiln tune`` invocation)."""

    id: int
    model_name: str
    model_hash: str
    target_key: str
    budget: dict[str, Any]
    command_line: str
    host: str
    kiln_version: str
    started_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True)
class FusionPlanRecord:
    """A measured fusion plan of a graph region on a target."""

    region_key: str
    target_key: str
    plan: dict[str, Any]
    latency_us: float
    kiln_version: str
    host: str
    created_at: datetime
    id: int
    rule_latency_us: float | None = None  # the region under the rules' plan, measured the same way
    whole_us: float | None = None  # the whole model under this plan, timed end to end (None: not timed)
    rule_whole_us: float | None = None  # the whole model under the rules' plan, timed beside it


@dataclass(frozen=True)
class CoverageRow:
    """How far one task of a model is tuned on a target (see ``TuningDatabase.coverage``)."""

    workload_key: str
    kind: str
    weight: float
    tuned: bool
    best_median_us: float | None
    n_records: int
    by_status: dict[str, int] = field(default_factory=dict)
