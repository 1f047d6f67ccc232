"""A fencing token per attempt: written at claim time, never changed by re-registration.

Revision ID: pgq_0003
Revises: pgq_0002
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "pgq_0003"
down_revision: str | None = "pgq_0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable without a default: adding it rewrites nothing, whatever the table's size.
    op.add_column("pgq_jobs", sa.Column("attempt_token", postgresql.UUID(), nullable=True))


def downgrade() -> None:
    op.drop_column("pgq_jobs", "attempt_token")
