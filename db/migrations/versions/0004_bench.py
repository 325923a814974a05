"""Benchmark runs and results (`kiln bench`): ``kiln_bench_runs`` and ``kiln_bench_results``.

New tables only: a bench run (suite, target key, command line, host, Kiln version and git commit, the
environment fingerprint, settings and ceilings as canonical JSON, load averages, start and end) and one row
per (run, workload, contender) with every timed sample, the round medians, the check against the reference
and the graph's FLOPs and bytes.

Revision ID: 0004_bench
Revises: 0003_confirmed
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_bench"
down_revision = "0003_confirmed"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "kiln_bench_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("suite", sa.String(255), nullable=False),
        sa.Column("target_key", sa.String(255), nullable=False),
        sa.Column("command_line", sa.Text(), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("kiln_version", sa.String(32), nullable=False),
        sa.Column("git_commit", sa.String(64), nullable=True),
        sa.Column("environment", sa.Text(), nullable=False),
        sa.Column("settings", sa.Text(), nullable=False),
        sa.Column("ceilings", sa.Text(), nullable=False),
        sa.Column("load_before", sa.Double(), nullable=True),
        sa.Column("load_after", sa.Double(), nullable=True),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_kiln_bench_runs")),
    )
    op.create_index(
        "ix_kiln_bench_runs_suite", "kiln_bench_runs", ["suite", "target_key", "started_at"], unique=False
    )
    op.create_table(
        "kiln_bench_results",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("workload", sa.String(255), nullable=False),
        sa.Column("contender", sa.String(64), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("median_us", sa.Double(), nullable=True),
        sa.Column("samples", sa.Text(), nullable=False),
        sa.Column("round_medians", sa.Text(), nullable=False),
        sa.Column("max_rel_err", sa.Double(), nullable=True),
        sa.Column("flops", sa.Double(), nullable=False),
        sa.Column("bytes", sa.Double(), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.Column("info", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["kiln_bench_runs.id"],
            name=op.f("fk_kiln_bench_results_run_id_kiln_bench_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_kiln_bench_results")),
        sa.UniqueConstraint(
            "run_id", "workload", "contender", name=op.f("uq_kiln_bench_results_run_id_workload_contender")
        ),
    )
    op.create_index(
        "ix_kiln_bench_results_workload", "kiln_bench_results", ["workload", "contender"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_kiln_bench_results_workload", table_name="kiln_bench_results")
    op.drop_table("kiln_bench_results")
    op.drop_index("ix_kiln_bench_runs_suite", table_name="kiln_bench_runs")
    op.drop_table("kiln_bench_runs")
