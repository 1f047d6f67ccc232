"""The same enqueue for synchronous code, on psycopg (3): the statements of ``sql`` run as
they are (a raw cursor takes PostgreSQL's own ``$1`` placeholders), the jobs are put
together by the same functions as the async path."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import RawCursor
from psycopg.rows import dict_row

from pgq._store import sql
from pgq._store.jobs import (
    NewJob,
    assemble,
    copy_plan,
    copy_records,
    fill_duplicates,
    insert_statement,
)
from pgq._store.revision import SHARED_IDS, read_revision, require_current
from pgq.job import Job

#: psycopg errors that mean the server is not there (or went away), not that it refused.
CONNECTION_ERRORS: tuple[type[Exception], ...] = (psycopg.OperationalError, OSError)


def _cursor(conn: psycopg.Connection[Any]) -> RawCursor[dict[str, Any]]:
    return RawCursor(conn, row_factory=dict_row)


def check_schema(conn: psycopg.Connection[Any]) -> None:
    """Raise :class:`~pgq.SchemaMismatch` unless the database is at pgq's revision."""
    with _cursor(conn) as cur:
        tables = cur.execute(sql.SCHEMA_VERSION_TABLES).fetchone()
        assert tables is not None
        own = (
            [r["version_num"] for r in cur.execute(sql.PGQ_VERSION).fetchall()]
            if tables["own"]
            else []
        )
        shared = (
            [r["version_num"] for r in cur.execute(sql.SHARED_VERSION, [SHARED_IDS]).fetchall()]
            if tables["shared"] and not own
            else []
        )
    require_current(read_revision(own, shared, bool(tables["has_jobs"])))


def insert(conn: psycopg.Connection[Any], rows: list[NewJob]) -> list[Job]:
    """Enqueue ``rows`` with one INSERT, in the connection's transaction (see
    ``jobs.insert``)."""
    statement, params = insert_statement(rows)
    with _cursor(conn) as cur:
        jobs, duplicates = assemble(rows, cur.execute(statement, params).fetchall())
        if duplicates:
            holders = cur.execute(sql.EXISTING_UNIQUE, [[k for _, k in duplicates]]).fetchall()
            fill_duplicates(rows, jobs, duplicates, holders)
    return [j for j in jobs if j is not None]


def copy(conn: psycopg.Connection[Any], rows: list[NewJob]) -> list[Job]:
    """Enqueue keyless ``rows`` with COPY, in a transaction of its own (see ``jobs.copy``)."""
    plain, due = copy_plan(rows)
    with conn.transaction(), _cursor(conn) as cur:
        allocated = cur.execute(
            sql.ALLOCATE_JOBS, [len(rows), list(due), list(due.values())]
        ).fetchone()
        assert allocated is not None
        jobs, records = copy_records(rows, allocated["ids"], allocated["now"], plain)
        with cur.copy(sql.COPY_JOBS_PLAIN if plain else sql.COPY_JOBS_FULL) as copier:
            for record in records:
                copier.write_row(record)
    return jobs
