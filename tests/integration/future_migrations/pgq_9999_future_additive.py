"""A revision of a future pgq, shipped only with the tests: additive (a nullable column, a
table, an index), so it declares that code at the current revision still runs on it.

It always extends the current head, so it stays the next release's revision as pgq grows.

Revision ID: pgq_9999
Revises: (the current head)
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from pgq._db.revision import SCHEMA_REVISION

revision: str = "pgq_9999"
down_revision: str | None = SCHEMA_REVISION
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("pgq_jobs", sa.Column("future_note", sa.Text(), nullable=True))
    op.create_index(
        "pgq_jobs_future_note_idx",
        "pgq_jobs",
        ["future_note"],
        postgresql_where=sa.text("future_note IS NOT NULL"),
    )
    op.create_table(
        "pgq_future",
        sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
        sa.Column("note", sa.Text(), nullable=False),
    )
    op.execute(f"UPDATE pgq_schema_compat SET min_code_revision = '{SCHEMA_REVISION}'")


def downgrade() -> None:
    op.drop_table("pgq_future")
    op.drop_index("pgq_jobs_future_note_idx", table_name="pgq_jobs")
    op.drop_column("pgq_jobs", "future_note")
