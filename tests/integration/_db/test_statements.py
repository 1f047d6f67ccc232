"""Every named statement is valid against a migrated database: the server parses, analyses
and types each one (``conn.prepare()``) without running it."""

from __future__ import annotations

import asyncpg
import pytest

from pgq._db import codec, sql

pytestmark = pytest.mark.anyio

#: Statements that cannot be prepared here, and why.
NOT_PREPARED = {
    # COPY ... FROM STDIN runs through the driver's copy protocol (psycopg's cursor.copy).
    "COPY_JOBS_PLAIN": "copy",
    "COPY_JOBS_FULL": "copy",
    # Run through SQLAlchemy (named parameters), and on alembic's shared table, which a
    # database migrated by pgq alone does not have.
    "RENAME_OWN_REVISION": "sqlalchemy",
    "RENAME_SHARED_REVISION": "sqlalchemy",
    "SHARED_VERSION": "alembic_version",
    # Schema: run by pgq.schema (create_all) and frozen in the migrations.
    "CLAIMED_JOB_TYPE": "schema",
    "LIMITED_CLAIM_FUNCTION": "schema",
    "RATE_STARTED_FUNCTION": "schema",
}


async def test_every_named_statement_prepares(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    assert NOT_PREPARED.keys() <= sql.STATEMENTS.keys()
    failed = {}
    for name, statement in sql.STATEMENTS.items():
        if name in NOT_PREPARED:
            continue
        try:
            await conn.prepare(statement)
        except asyncpg.PostgresError as e:
            failed[name] = f"{type(e).__name__}: {e}"
    assert failed == {}


async def test_job_rows_have_the_codec_columns(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    """Rows of whole jobs have Job's fields (but ``duplicate``, which no row holds) as
    columns, in order; claims have the codec's claim columns."""
    whole = tuple(f for f in codec.FIELDS if f != "duplicate")
    for name in codec.JOB_STATEMENTS:
        prepared = await conn.prepare(sql.STATEMENTS[name])
        assert tuple(a.name for a in prepared.get_attributes()) == whole, name
    prepared = await conn.prepare(sql.CLAIM_JOBS)
    assert tuple(a.name for a in prepared.get_attributes()) == codec.CLAIM_COLUMNS
    # The limited claim returns its jobs as an array of pgq_claimed_job, read the same way.
    claimed_job = await conn.fetchval(
        "SELECT array_agg(a.attname::text ORDER BY a.attnum) FROM pg_attribute a"
        " JOIN pg_type t ON t.typrelid = a.attrelid"
        " WHERE t.typname = 'pgq_claimed_job' AND a.attnum > 0"
    )
    assert tuple(claimed_job) == codec.CLAIM_COLUMNS
