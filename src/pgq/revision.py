"""The schema revision this code runs on, apart from the schema itself.

The client and the worker check it at start-up; keeping it here keeps SQLAlchemy (needed
only for migrations and for ``connection=`` with a SQLAlchemy session) out of their import.
"""

from __future__ import annotations

#: The alembic revision this code runs on; a test checks it is the migrations' head.
SCHEMA_REVISION = "0003"

#: pgq keeps its own alembic version table, so it never collides with the user's.
VERSION_TABLE = "pgq_alembic_version"
