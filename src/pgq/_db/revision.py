"""The schema revision this code runs on, and the check that the database serves it: at
that revision, or at a newer one whose oldest served code revision is at or below it (the
rolling-upgrade rule, docs/migrations.md).

Kept apart from the schema itself so that SQLAlchemy (needed only for migrations and for
``connection=`` with a SQLAlchemy session) stays out of the client's and worker's import.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pgq._db import sql
from pgq._db.connections import Db
from pgq.errors import SchemaMismatch

#: The alembic revision this code runs on; a test checks it is the migrations' head.
SCHEMA_REVISION = "pgq_0011"

#: Revisions any pgq release has shipped, oldest first; used to read a shared version table.
KNOWN_REVISIONS = (
    "pgq_0001",
    "pgq_0002",
    "pgq_0003",
    "pgq_0004",
    "pgq_0005",
    "pgq_0006",
    "pgq_0007",
    "pgq_0008",
    "pgq_0009",
    "pgq_0010",
    "pgq_0011",
)

#: The ids the first revisions had before they were prefixed (they collided with projects
#: that number their own revisions). A database stamped with one is at the same schema;
#: `pgq migrate` renames them.
OLD_REVISION_IDS = {"0001": "pgq_0001", "0002": "pgq_0002", "0003": "pgq_0003"}

#: pgq keeps its own alembic version table, so it never collides with the user's.
VERSION_TABLE = "pgq_alembic_version"


@dataclass(frozen=True, slots=True)
class Revision:
    """Where a database's pgq schema stands: its revision (None when pgq was never
    migrated there), whether it is recorded in the project's own alembic version table
    (pgq's revisions run from the project's alembic environment) rather than pgq's, and,
    read only when this code does not know the revision, the oldest code revision the
    schema still serves (``min_code``; None when the schema does not record one)."""

    revision: str | None
    shared: bool = False
    old_ids: bool = False
    min_code: str | None = None


async def schema_revision(db: Db) -> Revision:
    """The pgq revision the database is at."""
    tables = await db.fetchrow(sql.SCHEMA_VERSION_TABLES)
    assert tables is not None
    own = [r["version_num"] for r in await db.fetch(sql.PGQ_VERSION)] if tables["own"] else []
    shared = (
        [r["version_num"] for r in await db.fetch(sql.SHARED_VERSION, SHARED_IDS)]
        if tables["shared"] and not own
        else []
    )
    found = read_revision(own, shared, bool(tables["has_jobs"]))
    if is_unknown(found) and await db.fetchval(sql.SCHEMA_COMPAT_EXISTS):
        found = replace(found, min_code=await db.fetchval(sql.MIN_CODE_REVISION))
    return found


#: The ids of pgq's revisions to look for in a project's own version table.
SHARED_IDS = [*KNOWN_REVISIONS, *OLD_REVISION_IDS]


def read_revision(own: list[str], shared: list[str], has_jobs: bool) -> Revision:
    """Where the schema stands, from the rows of pgq's own version table and of pgq's
    revisions in the project's table (``sql.PGQ_VERSION``, ``sql.SHARED_VERSION``)."""
    if own:
        found = str(own[0])
        return Revision(OLD_REVISION_IDS.get(found, found), old_ids=found in OLD_REVISION_IDS)
    if shared:
        found = max(
            (str(r) for r in shared),
            key=lambda r: KNOWN_REVISIONS.index(OLD_REVISION_IDS.get(r, r)),
        )
        return Revision(
            OLD_REVISION_IDS.get(found, found), shared=True, old_ids=found in OLD_REVISION_IDS
        )
    if has_jobs:
        return Revision("unknown (tables exist, no version recorded)")
    return Revision(None)


def require_current(found: Revision) -> None:
    """Raise :class:`~pgq.SchemaMismatch` unless code at :data:`SCHEMA_REVISION` runs on
    ``found``: at that revision (an old id of it counts: it is the same schema), or at a
    newer one that still serves it (:func:`serves_this_code`). An older schema is refused
    with the advice to migrate; a newer one that no longer serves this code, with the advice
    to run a newer pgq."""
    if found.revision == SCHEMA_REVISION or serves_this_code(found):
        return
    raise SchemaMismatch(
        found.revision,
        SCHEMA_REVISION,
        shared=found.shared,
        newer=is_unknown(found),
        min_code=found.min_code,
    )


def serves_this_code(found: Revision) -> bool:
    """Whether a schema at a revision this code does not know (a newer release's) still
    serves it: the oldest code revision the schema records is one this code knows, at or
    below its own. A minimum this code does not know is newer than it."""
    return (
        is_unknown(found)
        and found.min_code in KNOWN_REVISIONS
        and KNOWN_REVISIONS.index(found.min_code) <= KNOWN_REVISIONS.index(SCHEMA_REVISION)
    )


def is_unknown(found: Revision) -> bool:
    """Whether the database records a revision no pgq release this one knows has shipped
    (a newer pgq's, most likely)."""
    return (
        found.revision is not None
        and found.revision not in KNOWN_REVISIONS
        and not found.revision.startswith("unknown")
    )


async def check_schema(db: Db) -> None:
    """Raise :class:`~pgq.SchemaMismatch` unless the database is at :data:`SCHEMA_REVISION`."""
    require_current(await schema_revision(db))
