"""Second step: cached cost-model features, record fingerprints, a status check, an index on run ids.

What the first schema lacked:
- ``kiln_features``: cost-model features of a record, a float32 vector as raw little-endian bytes with its
  length and a feature version (never pickle);
- ``kiln_records.fingerprint``: sha256 of a record's identity, indexed, so import and merge skip duplicates
  with an index lookup; existing rows are backfilled here;
- a CHECK constraint that ``kiln_records.status`` is one of the six statuses;
- an index on ``kiln_records.run_id`` (records of a run).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

STATUSES = ("ok", "compile_error", "runtime_error", "timeout", "wrong_result", "invalid_config")
STATUS_CHECK = f"status IN ({', '.join(repr(s) for s in STATUSES)})"


def _fingerprint(workload, target, sketch, version, config, latencies, status, created_at) -> str:  # type: ignore[no-untyped-def]
    # Frozen copy of db.canonical.record_fingerprint as of this revision (migrations must not change when
    # the application code does); a test checks that both agree.
    if created_at.tzinfo is not None:
        created_at = created_at.astimezone(UTC).replace(tzinfo=None)
    identity = [
        workload,
        target,
        sketch,
        int(version),
        config,
        latencies,
        status,
        created_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    ]
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _backfill_fingerprints(conn: sa.engine.Connection) -> None:
    meta = sa.MetaData()
    records = sa.Table("kiln_records", meta, autoload_with=conn)
    workloads = sa.Table("kiln_workloads", meta, autoload_with=conn)
    targets = sa.Table("kiln_targets", meta, autoload_with=conn)
    bad = conn.execute(
        sa.select(records.c.status, sa.func.count())
        .where(records.c.status.not_in(STATUSES))
        .group_by(records.c.status)
    ).all()
    if bad:
        found = ", ".join(f"{s!r} ({n} records)" for s, n in bad)
        raise RuntimeError(f"kiln_records holds unknown statuses {found}; fix or delete them, then upgrade")
    query = (
        sa.select(
            records.c.id,
            workloads.c.key,
            targets.c.key,
            records.c.sketch,
            records.c.sketch_version,
            records.c.config,
            records.c.latencies,
            records.c.status,
            records.c.created_at,
        )
        .join(workloads, workloads.c.id == records.c.workload_id)
        .join(targets, targets.c.id == records.c.target_id)
        .order_by(records.c.id)
    )
    update = sa.text("UPDATE kiln_records SET fingerprint = :fp WHERE id = :rid")
    batch: list[dict] = []
    for row in conn.execute(query).all():
        rid, *identity = row
        batch.append({"fp": _fingerprint(*identity), "rid": rid})
        if len(batch) >= 5000:
            conn.execute(update, batch)
            batch = []
    if batch:
        conn.execute(update, batch)


def upgrade() -> None:
    with op.batch_alter_table("kiln_records") as batch_op:
        batch_op.add_column(sa.Column("fingerprint", sa.String(64), nullable=True))
    _backfill_fingerprints(op.get_bind())
    with op.batch_alter_table("kiln_records") as batch_op:
        batch_op.alter_column("fingerprint", existing_type=sa.String(64), nullable=False)
        batch_op.create_check_constraint(op.f("ck_kiln_records_status"), STATUS_CHECK)
        batch_op.create_index(op.f("ix_kiln_records_fingerprint"), ["fingerprint"])
        batch_op.create_index(op.f("ix_kiln_records_run_id"), ["run_id"])
    op.create_table(
        "kiln_features",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("record_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("length", sa.Integer(), nullable=False),
        sa.Column("vector", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["record_id"],
            ["kiln_records.id"],
            name=op.f("fk_kiln_features_record_id_kiln_records"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_kiln_features")),
        sa.UniqueConstraint("record_id", "version", name=op.f("uq_kiln_features_record_id_version")),
    )


def downgrade() -> None:
    op.drop_table("kiln_features")
    with op.batch_alter_table("kiln_records") as batch_op:
        batch_op.drop_index(op.f("ix_kiln_records_run_id"))
        batch_op.drop_index(op.f("ix_kiln_records_fingerprint"))
        batch_op.drop_constraint(op.f("ck_kiln_records_status"), type_="check")
        batch_op.drop_column("fingerprint")
