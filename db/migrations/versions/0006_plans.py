"""Fusion plans searched per region: the rules' plan latency beside each stored plan.

``kiln_fusion_plans.rule_latency_us``: the measured latency of the region under the rules' plan, scored the
same way as the stored plan (sum of its groups' best latencies), so compile applies a plan only when it
beats the rules and ``kiln query plans`` shows by how much. Nullable: plans stored before have none (compile
does not apply them).

Revision ID: 0006_plans
Revises: 0005_leases
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_plans"
down_revision = "0005_leases"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("kiln_fusion_plans") as batch_op:
        batch_op.add_column(sa.Column("rule_latency_us", sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("kiln_fusion_plans") as batch_op:
        batch_op.drop_column("rule_latency_us")
