"""pgq schema: jobs, producers, leader lease, queues.

Revision ID: pgq_0001
Revises:
Create Date: 2026-11-29 14:15:50.984958
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from pgq.migrate import require_removal_asked

revision: str = "pgq_0001"
down_revision: str | None = None
# The label lets a project run pgq's revisions inside its own alembic environment.
branch_labels: str | Sequence[str] | None = ("pgq",)
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "pgq_jobs",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("queue", sa.Text(), server_default="default", nullable=False),
        sa.Column("task", sa.Text(), nullable=False),
        sa.Column(
            "args",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column(
            "state",
            sa.Enum(
                "scheduled",
                "available",
                "running",
                "retryable",
                "completed",
                "discarded",
                "cancelled",
                name="pgq_job_state",
            ),
            server_default="available",
            nullable=False,
        ),
        sa.Column("priority", sa.Integer(), server_default="0", nullable=False),
        sa.Column("attempt", sa.Integer(), server_default="0", nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=True),
        sa.Column(
            "scheduled_at",
            postgresql.TIMESTAMP(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("attempted_at", postgresql.TIMESTAMP(timezone=True), nullable=True),
        sa.Column("finalized_at", postgresql.TIMESTAMP(timezone=True), nullable=True),
        sa.Column(
            "created_at",
            postgresql.TIMESTAMP(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("producer_id", sa.UUID(), nullable=True),
        sa.Column("deadline_at", postgresql.TIMESTAMP(timezone=True), nullable=True),
        sa.Column(
            "errors",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'[]'::jsonb"),
            nullable=False,
        ),
        sa.Column(
            "tags",
            postgresql.ARRAY(sa.Text()),
            server_default=sa.text("'{}'::text[]"),
            nullable=False,
        ),
        sa.Column(
            "metadata",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("result", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.CheckConstraint(
            "(finalized_at IS NOT NULL) = (state IN ('completed', 'discarded', 'cancelled'))",
            name=op.f("pgq_jobs_finalized_at_check"),
        ),
        sa.CheckConstraint(
            "jsonb_typeof(args) = 'object'", name=op.f("pgq_jobs_args_object_check")
        ),
        sa.CheckConstraint(
            "attempt >= 0 AND max_attempts >= 1", name=op.f("pgq_jobs_attempts_check")
        ),
        sa.CheckConstraint(
            "char_length(queue) BETWEEN 1 AND 128", name=op.f("pgq_jobs_queue_length_check")
        ),
        sa.CheckConstraint(
            "char_length(task) BETWEEN 1 AND 255", name=op.f("pgq_jobs_task_length_check")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pgq_jobs_pkey")),
    )
    op.create_index(
        "pgq_jobs_due_idx",
        "pgq_jobs",
        ["scheduled_at"],
        unique=False,
        postgresql_where=sa.text("state IN ('scheduled', 'retryable')"),
    )
    op.create_index(
        "pgq_jobs_fetch_idx",
        "pgq_jobs",
        ["queue", sa.literal_column("priority DESC"), "scheduled_at", "id"],
        unique=False,
        postgresql_where=sa.text("state = 'available'"),
    )
    op.create_index(
        "pgq_jobs_finalized_idx",
        "pgq_jobs",
        ["state", "finalized_at"],
        unique=False,
        postgresql_where=sa.text("finalized_at IS NOT NULL"),
    )
    op.create_index(
        "pgq_jobs_running_idx",
        "pgq_jobs",
        ["producer_id"],
        unique=False,
        postgresql_where=sa.text("state = 'running'"),
    )
    op.create_table(
        "pgq_leader",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("leader_id", sa.UUID(), nullable=False),
        sa.Column("worker_name", sa.Text(), nullable=False),
        sa.Column(
            "elected_at",
            postgresql.TIMESTAMP(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("expires_at", postgresql.TIMESTAMP(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pgq_leader_pkey")),
    )
    op.create_table(
        "pgq_producers",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("worker_id", sa.UUID(), nullable=False),
        sa.Column("worker_name", sa.Text(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column(
            "started_at",
            postgresql.TIMESTAMP(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "heartbeat_at",
            postgresql.TIMESTAMP(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("running", sa.Integer(), server_default="0", nullable=False),
        sa.Column("healthy", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column("claimed", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("completed", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("failed", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("rejected_outcomes", sa.BigInteger(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pgq_producers_pkey")),
    )
    op.create_table(
        "pgq_queues",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("paused_at", postgresql.TIMESTAMP(timezone=True), nullable=True),
        sa.Column(
            "created_at",
            postgresql.TIMESTAMP(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pgq_queues_pkey")),
    )


def downgrade() -> None:
    # Below this revision pgq is gone, jobs and all: only when asked, never as a side effect
    # of a project's `alembic downgrade base` (the older setup, docs/migrations.md).
    require_removal_asked(op.get_context())
    op.drop_table("pgq_queues")
    op.drop_table("pgq_producers")
    op.drop_table("pgq_leader")
    op.drop_index(
        "pgq_jobs_running_idx", table_name="pgq_jobs", postgresql_where=sa.text("state = 'running'")
    )
    op.drop_index(
        "pgq_jobs_finalized_idx",
        table_name="pgq_jobs",
        postgresql_where=sa.text("finalized_at IS NOT NULL"),
    )
    op.drop_index(
        "pgq_jobs_fetch_idx", table_name="pgq_jobs", postgresql_where=sa.text("state = 'available'")
    )
    op.drop_index(
        "pgq_jobs_due_idx",
        table_name="pgq_jobs",
        postgresql_where=sa.text("state IN ('scheduled', 'retryable')"),
    )
    op.drop_table("pgq_jobs")
    sa.Enum(name="pgq_job_state").drop(op.get_bind(), checkfirst=False)
