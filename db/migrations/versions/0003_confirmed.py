"""Confirmed records: the best candidate of a task and its default re-measured in interleaved rounds.

``kiln_confirmations`` holds, per (workload, target), the confirmations made at the end of tuning: which
sketch config was confirmed against which default config, the per-round medians of both (JSON lists, one
entry per round; rounds alternate which of the two runs first), their medians, the speed-up (median of the
per-round ratios default / best) and its spread (half the range of those ratios, relative to the speed-up),
the run that made it, and a fingerprint (sha256 of its identity) so import and merge skip duplicates.

Revision ID: 0003_confirmed
Revises: 0002
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_confirmed"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "kiln_confirmations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("target_id", sa.Integer(), nullable=False),
        sa.Column("sketch", sa.String(64), nullable=False),
        sa.Column("sketch_version", sa.Integer(), nullable=False),
        sa.Column("config", sa.Text(), nullable=False),
        sa.Column("default_config", sa.Text(), nullable=False),
        sa.Column("best_rounds", sa.Text(), nullable=False),
        sa.Column("default_rounds", sa.Text(), nullable=False),
        sa.Column("best_us", sa.Double(), nullable=False),
        sa.Column("default_us", sa.Double(), nullable=False),
        sa.Column("speedup", sa.Double(), nullable=False),
        sa.Column("spread", sa.Double(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column("kiln_version", sa.String(32), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.ForeignKeyConstraint(
            ["workload_id"],
            ["kiln_workloads.id"],
            name=op.f("fk_kiln_confirmations_workload_id_kiln_workloads"),
        ),
        sa.ForeignKeyConstraint(
            ["target_id"], ["kiln_targets.id"], name=op.f("fk_kiln_confirmations_target_id_kiln_targets")
        ),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["kiln_runs.id"],
            name=op.f("fk_kiln_confirmations_run_id_kiln_runs"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_kiln_confirmations")),
    )
    op.create_index(
        "ix_kiln_confirmations_latest",
        "kiln_confirmations",
        ["workload_id", "target_id", "created_at", "id"],
    )
    op.create_index(op.f("ix_kiln_confirmations_fingerprint"), "kiln_confirmations", ["fingerprint"])


def downgrade() -> None:
    op.drop_index(op.f("ix_kiln_confirmations_fingerprint"), table_name="kiln_confirmations")
    op.drop_index("ix_kiln_confirmations_latest", table_name="kiln_confirmations")
    op.drop_table("kiln_confirmations")
