"""Flow control: a queue's global concurrency and rate limits, stored with the queue so
operators change them live, and the log of recent starts the rate limit counts.

Revision ID: pgq_0005
Revises: pgq_0004
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "pgq_0005"
down_revision: str | None = "pgq_0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("pgq_queues", sa.Column("concurrency", sa.Integer(), nullable=True))
    op.add_column("pgq_queues", sa.Column("rate_count", sa.Integer(), nullable=True))
    op.add_column("pgq_queues", sa.Column("rate_period_s", sa.Float(), nullable=True))
    op.create_table(
        "pgq_rate_log",
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("started_at", postgresql.TIMESTAMP(timezone=True), nullable=False),
    )
    op.create_index("pgq_rate_log_idx", "pgq_rate_log", ["queue", "started_at"])


def downgrade() -> None:
    op.drop_index("pgq_rate_log_idx", table_name="pgq_rate_log")
    op.drop_table("pgq_rate_log")
    op.drop_column("pgq_queues", "rate_period_s")
    op.drop_column("pgq_queues", "rate_count")
    op.drop_column("pgq_queues", "concurrency")
