"""SQLAlchemy ORM tables of the tuning database (the schema at the head migration).

Every table is prefixed ``kiln_`` so that other tables (e.g. Optuna's RDB storage, with its own
``alembic_version``, in databases written by earlier Kiln versions) can live in the same database.
JSON columns hold canonical JSON text (``json.dumps(sort_keys=True, separators=(",", ":"))``) so that
equality is exact on every backend; they are read back with ``json.loads`` only. Timestamps are naive UTC.

The schema is created and changed only through the alembic migrations in ``db/migrations``; a test checks
that the migrations at head produce exactly these tables.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    CheckConstraint,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from db.status import Status

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

STATUS_VALUES = tuple(s.value for s in Status)


class Base(DeclarativeBase):
    """Declarative base of Kiln's tables (its metadata holds only ``kiln_*`` tables)."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class WorkloadRow(Base):
    """A unique kernel workload: the hash of a canonical fused group, and that canonical JSON."""

    __tablename__ = "kiln_workloads"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(128), unique=True)
    canonical: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(String(64))
    flops: Mapped[float] = mapped_column(Double)
    bytes: Mapped[float] = mapped_column(Double)
    created_at: Mapped[datetime] = mapped_column(DateTime)


class TargetRow(Base):
    """A measurement target (``cuda/sm_90/<device>``, ``cpu/x86_64/<cpu>/<cores>``) and its description."""

    __tablename__ = "kiln_targets"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(255), unique=True)
    info: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime)


class RunRow(Base):
    """One ``kiln tune`` invocation: which model, on which target, with which budget and command line."""

    __tablename__ = "kiln_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_name: Mapped[str] = mapped_column(String(255))
    model_hash: Mapped[str] = mapped_column(String(128))
    target_id: Mapped[int] = mapped_column(ForeignKey("kiln_targets.id"))
    budget: Mapped[str] = mapped_column(Text)
    command_line: Mapped[str] = mapped_column(Text)
    host: Mapped[str] = mapped_column(String(255))
    kiln_version: Mapped[str] = mapped_column(String(32))
    started_at: Mapped[datetime] = mapped_column(DateTime)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)


class RecordRow(Base):
    """One measured candidate: a config of a sketch for a workload on a target, and what happened."""

    __tablename__ = "kiln_records"
    __table_args__ = (
        # "best ok record of (workload, target)": equality on the first three, index order on the rest.
        Index("ix_kiln_records_best", "workload_id", "target_id", "status", "median_us", "created_at", "id"),
        CheckConstraint(f"status IN ({', '.join(repr(v) for v in STATUS_VALUES)})", name="status"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("kiln_workloads.id"))
    target_id: Mapped[int] = mapped_column(ForeignKey("kiln_targets.id"))
    sketch: Mapped[str] = mapped_column(String(64))
    sketch_version: Mapped[int] = mapped_column(Integer)
    config: Mapped[str] = mapped_column(Text)
    latencies: Mapped[str | None] = mapped_column(Text, nullable=True)
    median_us: Mapped[float | None] = mapped_column(Double, nullable=True)
    status: Mapped[str] = mapped_column(String(32))
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    kiln_version: Mapped[str] = mapped_column(String(32))
    host: Mapped[str] = mapped_column(String(255))
    run_id: Mapped[int | None] = mapped_column(
        ForeignKey("kiln_runs.id", ondelete="SET NULL"), nullable=True, index=True
    )
    created_at: Mapped[datetime] = mapped_column(DateTime)
    # sha256 of the record's identity (see db.canonical.record_fingerprint); used to skip duplicates.
    fingerprint: Mapped[str] = mapped_column(String(64), index=True)


class ModelTaskRow(Base):
    """A task of a model: one of its workloads and how many times it occurs (its weight)."""

    __tablename__ = "kiln_model_tasks"
    __table_args__ = (
        UniqueConstraint("model_name", "model_hash", "workload_id"),
        Index("ix_kiln_model_tasks_model", "model_name", "created_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_name: Mapped[str] = mapped_column(String(255))
    model_hash: Mapped[str] = mapped_column(String(128))
    workload_id: Mapped[int] = mapped_column(ForeignKey("kiln_workloads.id"))
    weight: Mapped[float] = mapped_column(Double)
    created_at: Mapped[datetime] = mapped_column(DateTime)


class FusionPlanRow(Base):
    """The measured fusion plan of a graph region on a target (region-local edge id -> fuse), with the
    latency of the region under the rules' plan measured the same way (``rule_latency_us``; None for older
    rows): both sums of the groups' isolated latencies. ``whole_us`` / ``rule_whole_us``: the whole model
    compiled under this plan and under the rules' plan, timed end to end side by side (None where it was
    not: older rows, CUDA)."""

    __tablename__ = "kiln_fusion_plans"
    __table_args__ = (
        Index("ix_kiln_fusion_plans_best", "region_key", "target_id", "latency_us", "created_at", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    region_key: Mapped[str] = mapped_column(String(128))
    target_id: Mapped[int] = mapped_column(ForeignKey("kiln_targets.id"))
    plan: Mapped[str] = mapped_column(Text)
    latency_us: Mapped[float] = mapped_column(Double)
    kiln_version: Mapped[str] = mapped_column(String(32))
    host: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(DateTime)
    rule_latency_us: Mapped[float | None] = mapped_column(Double, nullable=True)
    whole_us: Mapped[float | None] = mapped_column(Double, nullable=True)
    rule_whole_us: Mapped[float | None] = mapped_column(Double, nullable=True)


class FeatureRow(Base):
    """Cached cost-model features of a record: a float32 vector as raw little-endian bytes (never pickle)."""

    __tablename__ = "kiln_features"
    __table_args__ = (UniqueConstraint("record_id", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    record_id: Mapped[int] = mapped_column(ForeignKey("kiln_records.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(Integer)
    length: Mapped[int] = mapped_column(Integer)
    vector: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(DateTime)


class ConfirmationRow(Base):
    """A confirmation: the best candidate of (workload, target) and its default re-measured in interleaved
    rounds (JSON lists of per-round medians), the speed-up (median of per-round ratios) and its spread."""

    __tablename__ = "kiln_confirmations"
    __table_args__ = (Index("ix_kiln_confirmations_latest", "workload_id", "target_id", "created_at", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("kiln_workloads.id"))
    target_id: Mapped[int] = mapped_column(ForeignKey("kiln_targets.id"))
    sketch: Mapped[str] = mapped_column(String(64))
    sketch_version: Mapped[int] = mapped_column(Integer)
    config: Mapped[str] = mapped_column(Text)
    default_config: Mapped[str] = mapped_column(Text)
    best_rounds: Mapped[str] = mapped_column(Text)
    default_rounds: Mapped[str] = mapped_column(Text)
    best_us: Mapped[float] = mapped_column(Double)
    default_us: Mapped[float] = mapped_column(Double)
    speedup: Mapped[float] = mapped_column(Double)
    spread: Mapped[float] = mapped_column(Double)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("kiln_runs.id", ondelete="SET NULL"), nullable=True)
    kiln_version: Mapped[str] = mapped_column(String(32))
    host: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(DateTime)
    fingerprint: Mapped[str] = mapped_column(String(64), index=True)


class BenchRunRow(Base):
    """One ``kiln bench`` run: a suite timed on a target, its settings, the environment it ran in (CPU model
    and ISA flags, GPU, Kiln version and git commit, library versions), the machine's load and the
    ceilings measured in the same run. ``environment``, ``settings`` and ``ceilings`` are canonical JSON."""

    __tablename__ = "kiln_bench_runs"
    __table_args__ = (Index("ix_kiln_bench_runs_suite", "suite", "target_key", "started_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    suite: Mapped[str] = mapped_column(String(255))
    target_key: Mapped[str] = mapped_column(String(255))
    command_line: Mapped[str] = mapped_column(Text)
    host: Mapped[str] = mapped_column(String(255))
    kiln_version: Mapped[str] = mapped_column(String(32))
    git_commit: Mapped[str | None] = mapped_column(String(64), nullable=True)
    environment: Mapped[str] = mapped_column(Text)
    settings: Mapped[str] = mapped_column(Text)
    ceilings: Mapped[str] = mapped_column(Text)
    load_before: Mapped[float | None] = mapped_column(Double, nullable=True)
    load_after: Mapped[float | None] = mapped_column(Double, nullable=True)
    started_at: Mapped[datetime] = mapped_column(DateTime)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)


class BenchResultRow(Base):
    """One contender on one workload of a bench run: every timed sample (microseconds, JSON), the median of
    each round, the check against the reference, and what the graph says the workload costs."""

    __tablename__ = "kiln_bench_results"
    __table_args__ = (
        UniqueConstraint("run_id", "workload", "contender"),
        Index("ix_kiln_bench_results_workload", "workload", "contender"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("kiln_bench_runs.id", ondelete="CASCADE"))
    workload: Mapped[str] = mapped_column(String(255))
    contender: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(32))
    median_us: Mapped[float | None] = mapped_column(Double, nullable=True)
    samples: Mapped[str] = mapped_column(Text)
    round_medians: Mapped[str] = mapped_column(Text)
    max_rel_err: Mapped[float | None] = mapped_column(Double, nullable=True)
    flops: Mapped[float] = mapped_column(Double)
    bytes: Mapped[float] = mapped_column(Double)
    note: Mapped[str] = mapped_column(Text)
    info: Mapped[str] = mapped_column(Text)


class LeaseRow(Base):
    """A claim on shared tuning work by one worker (``kiln tune`` process), valid until ``expires_at``.

    ``key`` is the sha256 of what is claimed (see :mod:`db.leases`): a task, one candidate config, a place
    among a run's workers, or a short mutex. The owner renews its leases (a heartbeat) while it lives; a
    lease past ``expires_at`` belongs to a dead worker and may be taken over. ``run_id`` names the run whose
    budget a config claim counts against.
    """

    __tablename__ = "kiln_leases"
    __table_args__ = (Index("ix_kiln_leases_owner", "owner"), Index("ix_kiln_leases_run", "run_id", "kind"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    kind: Mapped[str] = mapped_column(String(16))
    owner: Mapped[str] = mapped_column(String(128))
    run_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    expires_at: Mapped[datetime] = mapped_column(DateTime)
    created_at: Mapped[datetime] = mapped_column(DateTime)
