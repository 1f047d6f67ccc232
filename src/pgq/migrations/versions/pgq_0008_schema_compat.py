"""The rolling-upgrade rule: the schema records the oldest code revision it still serves
(``pgq_schema_compat.min_code_revision``). Code at or above it runs on the schema even at a
revision it does not know; older code refuses it. The first revision that carries the rule,
so its minimum is itself: older code checks for its own revision only.

A later revision that is additive (docs/migrations.md) leaves the row alone; a breaking one
sets it to its own id: ``UPDATE pgq_schema_compat SET min_code_revision = 'pgq_00NN'``.

Revision ID: pgq_0008
Revises: pgq_0007
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "pgq_0008"
down_revision: str | None = "pgq_0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "pgq_schema_compat",
        sa.Column("one_row", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column("min_code_revision", sa.Text(), nullable=False),
        sa.CheckConstraint("one_row", name=op.f("pgq_schema_compat_one_row_check")),
        sa.PrimaryKeyConstraint("one_row", name=op.f("pgq_schema_compat_pkey")),
    )
    op.execute("INSERT INTO pgq_schema_compat (min_code_revision) VALUES ('pgq_0008')")


def downgrade() -> None:
    op.drop_table("pgq_schema_compat")
