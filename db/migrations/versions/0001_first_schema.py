"""First schema: workloads, targets, runs, records, model tasks, fusion plans.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "kiln_workloads",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(128), nullable=False),
        sa.Column("canonical", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("flops", sa.Double(), nullable=False),
        sa.Column("bytes", sa.Double(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_kiln_workloads")),
        sa.UniqueConstraint("key", name=op.f("uq_kiln_workloads_key")),
    )
    op.create_table(
        "kiln_targets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("info", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_kiln_targets")),
        sa.UniqueConstraint("key", name=op.f("uq_kiln_targets_key")),
    )
    op.create_table(
        "kiln_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model_name", sa.String(255), nullable=False),
        sa.Column("model_hash", sa.String(128), nullable=False),
        sa.Column("target_id", sa.Integer(), nullable=False),
        sa.Column("budget", sa.Text(), nullable=False),
        sa.Column("command_line", sa.Text(), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("kiln_version", sa.String(32), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["target_id"], ["kiln_targets.id"], name=op.f("fk_kiln_runs_target_id_kiln_targets")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_kiln_runs")),
    )
    op.create_table(
        "kiln_records",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("target_id", sa.Integer(), nullable=False),
        sa.Column("sketch", sa.String(64), nullable=False),
        sa.Column("sketch_version", sa.Integer(), nullable=False),
        sa.Column("config", sa.Text(), nullable=False),
        sa.Column("latencies", sa.Text(), nullable=True),
        sa.Column("median_us", sa.Double(), nullable=True),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("kiln_version", sa.String(32), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["workload_id"], ["kiln_workloads.id"], name=op.f("fk_kiln_records_workload_id_kiln_workloads")
        ),
        sa.ForeignKeyConstraint(
            ["target_id"], ["kiln_targets.id"], name=op.f("fk_kiln_records_target_id_kiln_targets")
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["kiln_runs.id"], name=op.f("fk_kiln_records_run_id_kiln_runs"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_kiln_records")),
    )
    op.create_index(
        "ix_kiln_records_best",
        "kiln_records",
        ["workload_id", "target_id", "status", "median_us", "created_at", "id"],
    )
    op.create_table(
        "kiln_model_tasks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model_name", sa.String(255), nullable=False),
        sa.Column("model_hash", sa.String(128), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("weight", sa.Double(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["workload_id"],
            ["kiln_workloads.id"],
            name=op.f("fk_kiln_model_tasks_workload_id_kiln_workloads"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_kiln_model_tasks")),
        sa.UniqueConstraint(
            "model_name",
            "model_hash",
            "workload_id",
            name=op.f("uq_kiln_model_tasks_model_name_model_hash_workload_id"),
        ),
    )
    op.create_index("ix_kiln_model_tasks_model", "kiln_model_tasks", ["model_name", "created_at"])
    op.create_table(
        "kiln_fusion_plans",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("region_key", sa.String(128), nullable=False),
        sa.Column("target_id", sa.Integer(), nullable=False),
        sa.Column("plan", sa.Text(), nullable=False),
        sa.Column("latency_us", sa.Double(), nullable=False),
        sa.Column("kiln_version", sa.String(32), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["target_id"], ["kiln_targets.id"], name=op.f("fk_kiln_fusion_plans_target_id_kiln_targets")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_kiln_fusion_plans")),
    )
    op.create_index(
        "ix_kiln_fusion_plans_best",
        "kiln_fusion_plans",
        ["region_key", "target_id", "latency_us", "created_at", "id"],
    )


def downgrade() -> None:
    op.drop_index("ix_kiln_fusion_plans_best", table_name="kiln_fusion_plans")
    op.drop_table("kiln_fusion_plans")
    op.drop_index("ix_kiln_model_tasks_model", table_name="kiln_model_tasks")
    op.drop_table("kiln_model_tasks")
    op.drop_index("ix_kiln_records_best", table_name="kiln_records")
    op.drop_table("kiln_records")
    op.drop_table("kiln_runs")
    op.drop_table("kiln_targets")
    op.drop_table("kiln_workloads")
