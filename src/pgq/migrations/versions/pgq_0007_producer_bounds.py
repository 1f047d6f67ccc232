"""Each producer records the rest of what its peers judge it by: its job-timeout grace
(``rescue_grace_s``), and the task names it serves (``tasks``), so jobs of a task no live
producer of their queue serves can be reported. Both nullable: a row written by older code
has neither, and peers fall back to their own grace and never flag its queue.

Revision ID: pgq_0007
Revises: pgq_0006
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "pgq_0007"
down_revision: str | None = "pgq_0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("pgq_producers", sa.Column("rescue_grace_s", sa.Float(), nullable=True))
    op.add_column("pgq_producers", sa.Column("tasks", postgresql.ARRAY(sa.Text()), nullable=True))


def downgrade() -> None:
    op.drop_column("pgq_producers", "tasks")
    op.drop_column("pgq_producers", "rescue_grace_s")
