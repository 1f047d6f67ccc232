"""The same enqueue for synchronous code, on psycopg (3): the statements of ``sql`` run as
they are (a raw cursor takes PostgreSQL's own ``$1`` placeholders), the jobs are put
together by the same functions as the async path."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import RawCursor
from psycopg.rows import dict_row

from pgq._store import sql
from pgq._store.codec import NewJob
from pgq._store.jobs import (
    assemble,
    by_copy,
    chain_after,
    copied_jobs,
    copy_plan,
    copy_records,
    dependent_job,
    fill_duplicates,
    group_after,
    insert_statement,
)
from pgq._store.revision import SHARED_IDS, read_revision, require_current
from pgq.errors import ConfigError
from pgq.job import Job

#: psycopg errors that mean the server is not there (or went away), not that it refused.
CONNECTION_ERRORS: tuple[type[Exception], ...] = (psycopg.OperationalError, OSError)


def cursor(conn: psycopg.Connection[Any]) -> RawCursor[dict[str, Any]]:
    """A cursor that takes pgq's statements as they are (``$1`` placeholders) and returns
    rows read by column name."""
    return RawCursor(conn, row_factory=dict_row)


def check_schema(conn: psycopg.Connection[Any]) -> None:
    """Raise :class:`~pgq.SchemaMismatch` unless the database is at pgq's revision."""
    with cursor(conn) as cur:
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


def write(conn: psycopg.Connection[Any], rows: list[NewJob], *, own_connection: bool) -> list[Job]:
    """Enqueue ``rows`` on ``conn`` by COPY or INSERT (see ``jobs.by_copy``)."""
    if by_copy(rows, own_connection):
        return copy(conn, rows)
    return insert(conn, rows)


def insert(conn: psycopg.Connection[Any], rows: list[NewJob]) -> list[Job]:
    """Enqueue ``rows`` with one INSERT, in the connection's transaction (see
    ``jobs.insert``)."""
    if any(r.depends_on is not None for r in rows):
        with conn.transaction():
            return [_insert_one(conn, r) for r in rows]
    statement, params = insert_statement(rows)
    with cursor(conn) as cur:
        jobs, duplicates = assemble(rows, cur.execute(statement, params).fetchall())
        if duplicates:
            holders = cur.execute(sql.EXISTING_UNIQUE, [[k for _, k in duplicates]]).fetchall()
            fill_duplicates(rows, jobs, duplicates, holders)
    return [j for j in jobs if j is not None]


def _insert_one(conn: psycopg.Connection[Any], row: NewJob) -> Job:
    if row.depends_on is None:
        (job,) = insert(conn, [row])
        return job
    with cursor(conn) as cur:
        params = [*row.values(), list(row.depends_on), row.on_parent_failure]
        rec = cur.execute(sql.ENQUEUE_DEPENDENT, params).fetchone()
        assert rec is not None  # one row, always
        holder = None
        if rec["id"] is None and rec["found"] == len(row.depends_on):
            holder = cur.execute(sql.EXISTING_UNIQUE, [[row.unique_key]]).fetchone()
    return dependent_job(row, rec, holder)


def insert_chain(conn: psycopg.Connection[Any], rows: list[NewJob]) -> list[Job]:
    """Enqueue ``rows``, each depending on the one before (see ``jobs.insert_chain``)."""
    jobs: list[Job] = []
    with conn.transaction():
        for row in rows:
            if jobs:
                chain_after(row, jobs[-1])
            jobs.append(_insert_one(conn, row))
    return jobs


def insert_group(
    conn: psycopg.Connection[Any], members: list[NewJob], callback: NewJob
) -> tuple[list[Job], Job]:
    """Enqueue ``members`` and ``callback`` after them (see ``jobs.insert_group``)."""
    if not members:
        raise ConfigError("a group needs at least one member")
    with conn.transaction():
        jobs = insert(conn, members)
        group_after(callback, jobs)
        return jobs, _insert_one(conn, callback)


def copy(conn: psycopg.Connection[Any], rows: list[NewJob]) -> list[Job]:
    """Enqueue keyless ``rows`` with COPY, in a transaction of its own (see ``jobs.copy``)."""
    plain, due = copy_plan(rows)
    with conn.transaction(), cursor(conn) as cur:
        allocated = cur.execute(
            sql.ALLOCATE_JOBS, [len(rows), list(due), list(due.values())]
        ).fetchone()
        assert allocated is not None
        ids, now = allocated["ids"], allocated["now"]
        jobs = copied_jobs(rows, ids, now, plain)
        with cur.copy(sql.COPY_JOBS_PLAIN if plain else sql.COPY_JOBS_FULL) as copier:
            for record in copy_records(rows, ids, now, plain):
                copier.write_row(record)
    return jobs


def caller_connection_sync(connection: Any) -> psycopg.Connection[Any]:
    """The psycopg connection behind ``connection`` (psycopg's, or a SQLAlchemy Connection
    or Session on the psycopg driver), inside the caller's transaction."""
    if isinstance(connection, psycopg.Connection):
        return connection
    try:
        from sqlalchemy.engine import Connection as SAConnection
        from sqlalchemy.orm import Session
    except ImportError:  # pragma: no cover - sqlalchemy is a dependency
        raise ConfigError("connection= takes a psycopg or SQLAlchemy connection") from None
    if isinstance(connection, Session):
        connection = connection.connection()  # begins the session's transaction
    if not isinstance(connection, SAConnection):
        raise ConfigError(
            "connection= takes a psycopg connection, or a SQLAlchemy Connection or Session, "
            f"not {type(connection).__name__}"
        )
    if not connection.in_transaction():
        connection.exec_driver_sql("SELECT 1")  # autobegin, so the job joins the transaction
    driver = connection.connection.driver_connection
    if not isinstance(driver, psycopg.Connection):
        raise ConfigError(
            "pgq's SyncClient needs SQLAlchemy's psycopg (3) driver for connection=: create "
            "the engine with a postgresql+psycopg:// URL"
        )
    return driver
