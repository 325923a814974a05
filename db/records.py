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
class ImportStats:
    """What an import or merge did: records added and records skipped as duplicates of stored ones."""

    added: int = 0
    skipped_duplicates: int = 0
    workloads_added: int = 0
    targets_added: int = 0
    runs_added: int = 0
    model_tasks_added: int = 0
    fusion_plans_added: int = 0


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
