"""Job lifecycle: unique jobs, cancel requests, periodic schedules.

Revision ID: pgq_0002
Revises: pgq_0001
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "pgq_0002"
down_revision: str | None = "pgq_0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


# Frozen copy of pgq.schema.UNIQUE_ACTIVE_FUNCTION as of this revision.
UNIQUE_ACTIVE_FUNCTION = """
CREATE FUNCTION pgq_unique_active(state pgq_job_state, mask integer) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (mask & (CASE state
        WHEN 'scheduled' THEN 1 WHEN 'available' THEN 2 WHEN 'running' THEN 4
        WHEN 'retryable' THEN 8 WHEN 'completed' THEN 16 WHEN 'discarded' THEN 32
        WHEN 'cancelled' THEN 64 END)) <> 0
$$
"""


def upgrade() -> None:
    op.add_column("pgq_jobs", sa.Column("unique_key", sa.Text(), nullable=True))
    op.add_column("pgq_jobs", sa.Column("unique_states", sa.Integer(), nullable=True))
    op.add_column(
        "pgq_jobs",
        sa.Column("cancel_requested_at", postgresql.TIMESTAMP(timezone=True), nullable=True),
    )
    op.execute(UNIQUE_ACTIVE_FUNCTION)
    op.create_index(
        "pgq_jobs_unique_idx",
        "pgq_jobs",
        ["unique_key"],
        unique=True,
        postgresql_where=sa.text(
            "unique_key IS NOT NULL AND pgq_unique_active(state, unique_states)"
        ),
    )
    op.create_table(
        "pgq_periodic",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("last_slot", postgresql.TIMESTAMP(timezone=True), nullable=False),
        sa.Column(
            "updated_at",
            postgresql.TIMESTAMP(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pgq_periodic_pkey")),
    )


def downgrade() -> None:
    op.drop_table("pgq_periodic")
    op.drop_index("pgq_jobs_unique_idx", table_name="pgq_jobs")
    op.execute("DROP FUNCTION pgq_unique_active")
    op.drop_column("pgq_jobs", "cancel_requested_at")
    op.drop_column("pgq_jobs", "unique_states")
    op.drop_column("pgq_jobs", "unique_key")
