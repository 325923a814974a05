"""Fusion plans confirmed on the whole model: its latency and the rules' plan's beside each stored plan.

``kiln_fusion_plans.whole_us`` / ``rule_whole_us``: the model compiled under the stored plan and under the
rules' plan (the best measured schedules of their groups), timed end to end in interleaved rounds (medians
of the round medians). The sum of the groups' isolated latencies (``latency_us``) cannot see the
intermediates written and read back, the cache state between kernels or the extra calls; a plan replaces the
rules' on the CPU only when the whole model is faster. Nullable: plans stored before, and plans of targets
the whole model is not timed on (CUDA), have none.

Revision ID: 0007_plan_whole
Revises: 0006_plans
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_plan_whole"
down_revision = "0006_plans"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("kiln_fusion_plans") as batch_op:
        batch_op.add_column(sa.Column("whole_us", sa.Double(), nullable=True))
        batch_op.add_column(sa.Column("rule_whole_us", sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("kiln_fusion_plans") as batch_op:
        batch_op.drop_column("rule_whole_us")
        batch_op.drop_column("whole_us")
