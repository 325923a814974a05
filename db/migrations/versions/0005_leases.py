"""Third step: ``kiln_leases``, the claims with heartbeats through which workers share a tuning.

Revision ID: 0005_leases
Revises: 0004_bench
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_leases"
down_revision = "0004_bench"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "kiln_leases",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_kiln_leases")),
        sa.UniqueConstraint("key", name=op.f("uq_kiln_leases_key")),
    )
    op.create_index("ix_kiln_leases_owner", "kiln_leases", ["owner"])
    op.create_index("ix_kiln_leases_run", "kiln_leases", ["run_id", "kind"])


def downgrade() -> None:
    op.drop_index("ix_kiln_leases_run", table_name="kiln_leases")
    op.drop_index("ix_kiln_leases_owner", table_name="kiln_leases")
    op.drop_table("kiln_leases")
