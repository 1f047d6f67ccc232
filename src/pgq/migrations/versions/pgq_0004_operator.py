"""What the operator surface shows: the worker that ran each attempt, each producer's
liveness bounds, the leader's periodic schedules, and finished jobs per minute, recorded so
a dashboard without the App can show them.

Revision ID: pgq_0004
Revises: pgq_0003
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "pgq_0004"
down_revision: str | None = "pgq_0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable without defaults: adding them rewrites nothing, whatever the table's size.
    op.add_column("pgq_jobs", sa.Column("attempted_by", sa.Text(), nullable=True))
    op.add_column("pgq_periodic", sa.Column("task", sa.Text(), nullable=True))
    op.add_column("pgq_periodic", sa.Column("queue", sa.Text(), nullable=True))
    op.add_column("pgq_periodic", sa.Column("schedule", sa.Text(), nullable=True))
    op.add_column(
        "pgq_periodic", sa.Column("next_slot", postgresql.TIMESTAMP(timezone=True), nullable=True)
    )
    op.add_column("pgq_periodic", sa.Column("recorded_by", sa.Text(), nullable=True))
    op.add_column("pgq_producers", sa.Column("fence_after_s", sa.Float(), nullable=True))
    op.add_column("pgq_producers", sa.Column("stale_after_s", sa.Float(), nullable=True))
    op.create_table(
        "pgq_throughput",
        sa.Column("minute", postgresql.TIMESTAMP(timezone=True), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("completed", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("discarded", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("cancelled", sa.BigInteger(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("minute", "queue", name=op.f("pgq_throughput_pkey")),
    )


def downgrade() -> None:
    op.drop_table("pgq_throughput")
    op.drop_column("pgq_producers", "stale_after_s")
    op.drop_column("pgq_producers", "fence_after_s")
    op.drop_column("pgq_periodic", "recorded_by")
    op.drop_column("pgq_periodic", "next_slot")
    op.drop_column("pgq_periodic", "schedule")
    op.drop_column("pgq_periodic", "queue")
    op.drop_column("pgq_periodic", "task")
    op.drop_column("pgq_jobs", "attempted_by")
