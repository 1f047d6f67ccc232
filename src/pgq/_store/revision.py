"""The schema revision this code runs on, and the check that the database is at it.

Kept apart from the schema itself so that SQLAlchemy (needed only for migrations and for
``connection=`` with a SQLAlchemy session) stays out of the client's and worker's import.
"""

from __future__ import annotations

from pgq._store import sql
from pgq._store.connections import Db
from pgq.errors import SchemaMismatch

#: The alembic revision this code runs on; a test checks it is the migrations' head.
SCHEMA_REVISION = "0003"

#: Revisions any pgq release has shipped, oldest first; used to read a shared version table.
KNOWN_REVISIONS = ("0001", "0002", "0003")

#: pgq keeps its own alembic version table, so it never collides with the user's.
VERSION_TABLE = "pgq_alembic_version"


async def schema_revision(db: Db) -> str | None:
    """The pgq revision the database is at, or None when pgq was never migrated there."""
    tables = await db.fetchrow(sql.SCHEMA_VERSION_TABLES)
    assert tables is not None
    if tables["own"]:
        rows = await db.fetch(sql.PGQ_VERSION)
        if rows:
            return str(rows[0]["version_num"])
    if tables["shared"]:
        rows = await db.fetch(sql.SHARED_VERSION, list(KNOWN_REVISIONS))
        if rows:
            return max((str(r["version_num"]) for r in rows), key=KNOWN_REVISIONS.index)
    return "unknown (tables exist, no version recorded)" if tables["has_jobs"] else None


async def check_schema(db: Db) -> None:
    """Raise :class:`~pgq.SchemaMismatch` unless the database is at :data:`SCHEMA_REVISION`."""
    found = await schema_revision(db)
    if found != SCHEMA_REVISION:
        raise SchemaMismatch(found, SCHEMA_REVISION)
