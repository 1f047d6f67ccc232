"""psycopg (3) as a driver, both ways: the plans of ``enqueue`` run on a
:class:`PsycopgDriver` (a synchronous connection, for :class:`~pgq.SyncClient` and plain
``def`` tasks) or a :class:`PsycopgAsyncDriver` (a caller's ``AsyncConnection``), their
statements as they are (a raw cursor takes PostgreSQL's own ``$1`` placeholders), rows read
by column name, the jobs put together by the same functions as asyncpg's. For
:class:`~pgq.SyncClient` also the schema check, a caller's connection, the statements of
``jobs.py`` (read, cancel, retry) and a LISTEN for the jobs that finish.

Imported only where psycopg is used: psycopg is the ``sync`` extra's."""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import replace
from typing import Any

import psycopg
from psycopg import AsyncRawCursor, RawCursor
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row

from pgq._db import sql
from pgq._db.codec import job_from_row
from pgq._db.jobs import RETRY_TRIES, UNIQUE_INDEX
from pgq._db.revision import SHARED_IDS, is_unknown, read_revision, require_current
from pgq.errors import ConfigError
from pgq.job import Job, JobState

IDLE = TransactionStatus.IDLE

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
        found = read_revision(own, shared, bool(tables["has_jobs"]))
        compat = cur.execute(sql.SCHEMA_COMPAT_EXISTS).fetchone() if is_unknown(found) else None
        if compat and compat["present"]:
            row = cur.execute(sql.MIN_CODE_REVISION).fetchone()
            found = replace(found, min_code=row["min_code_revision"] if row else None)
    require_current(found)


class PsycopgDriver:
    """``drivers.SyncDriver`` over a psycopg connection (pgq's own, or a caller's)."""

    __slots__ = ("conn",)

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def fetch(self, statement: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        with cursor(self.conn) as cur:
            return cur.execute(statement, params).fetchall()

    def fetchrow(self, statement: str, params: Sequence[Any]) -> dict[str, Any] | None:
        with cursor(self.conn) as cur:
            return cur.execute(statement, params).fetchone()

    def copy_jobs(self, records: list[tuple[Any, ...]], plain: bool) -> None:
        # psycopg writes the rows in COPY's text format.
        with (
            cursor(self.conn) as cur,
            cur.copy(sql.COPY_JOBS_PLAIN if plain else sql.COPY_JOBS_FULL) as copier,
        ):
            for record in records:
                copier.write_row(record)

    def transaction(self) -> AbstractContextManager[Any]:
        return self.conn.transaction()


def caller_connection_sync(connection: Any) -> psycopg.Connection[Any]:
    """The psycopg connection behind ``connection`` (psycopg's, or a SQLAlchemy Connection
    or Session on the psycopg driver), inside the caller's transaction. An idle connection
    not in autocommit mode is begun (a no-op statement), as its next statement would begin
    it: psycopg's ``transaction()`` on an idle connection would commit a chain on its own."""
    if isinstance(connection, psycopg.Connection):
        if not connection.autocommit and connection.info.transaction_status == IDLE:
            connection.execute("SELECT 1")
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


# --------------------------------------------------------------------------- the async connection
# A caller's psycopg.AsyncConnection (connection= on pgq.Client, a task's in-transaction outcome).


def async_cursor(conn: psycopg.AsyncConnection[Any]) -> AsyncRawCursor[dict[str, Any]]:
    """A cursor that takes pgq's statements as they are and returns rows by name."""
    return AsyncRawCursor(conn, row_factory=dict_row)


class PsycopgAsyncDriver:
    """``drivers.AsyncDriver`` over a caller's psycopg ``AsyncConnection``."""

    __slots__ = ("conn",)

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn

    async def fetch(self, statement: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        async with async_cursor(self.conn) as cur:
            await cur.execute(statement, params)
            return await cur.fetchall()

    async def fetchrow(self, statement: str, params: Sequence[Any]) -> dict[str, Any] | None:
        async with async_cursor(self.conn) as cur:
            await cur.execute(statement, params)
            return await cur.fetchone()

    async def copy_jobs(self, records: list[tuple[Any, ...]], plain: bool) -> None:
        # psycopg writes the rows in COPY's text format.
        async with (
            async_cursor(self.conn) as cur,
            cur.copy(sql.COPY_JOBS_PLAIN if plain else sql.COPY_JOBS_FULL) as copier,
        ):
            for record in records:
                await copier.write_row(record)

    def transaction(self) -> AbstractAsyncContextManager[Any]:
        return self.conn.transaction()


async def joined(conn: psycopg.AsyncConnection[Any]) -> PsycopgAsyncDriver:
    """The driver for ``conn``, inside its transaction. A connection that is not in
    autocommit mode begins its transaction at its first statement; when it has not yet,
    a no-op statement begins it, so that pgq's writes commit or roll back with the
    caller's (psycopg's ``transaction()`` on an idle connection would commit them on its
    own)."""
    if not conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
        await conn.execute("SELECT 1")
    return PsycopgAsyncDriver(conn)


# --------------------------------------------------------------------------- jobs (jobs.py)


def get_job(conn: psycopg.Connection[Any], job_id: int) -> Job | None:
    """The job with ``job_id``, or None (``jobs.get``)."""
    with cursor(conn) as cur:
        row = cur.execute(sql.GET_JOB, [job_id]).fetchone()
    return job_from_row(row) if row is not None else None


def cancel(conn: psycopg.Connection[Any], job_ids: list[int]) -> dict[int, JobState]:
    """Cancel jobs not yet running, request it of running ones; each acted-on job's state
    now (``jobs.cancel``)."""
    with cursor(conn) as cur:
        rows = cur.execute(sql.CANCEL_JOBS, [job_ids]).fetchall()
    return {r["id"]: JobState(r["state"]) for r in rows}


def retry(conn: psycopg.Connection[Any], job_ids: list[int]) -> list[int]:
    """Make finished, retryable or scheduled jobs available now; the ids changed
    (``jobs.retry``, whose reasons hold here: a job enqueued meanwhile that takes a key one
    of them would take makes the statement run again, in a savepoint inside a caller's
    transaction, which survives)."""
    for tries_left in reversed(range(RETRY_TRIES)):
        try:
            if conn.info.transaction_status == IDLE:
                rows = _fetch(conn, sql.RETRY_JOBS, [job_ids])
            else:
                with conn.transaction():  # a savepoint, inside a transaction
                    rows = _fetch(conn, sql.RETRY_JOBS, [job_ids])
        except psycopg.errors.UniqueViolation as e:
            if e.diag.constraint_name != UNIQUE_INDEX or not tries_left:
                raise
        else:
            return sorted(r["id"] for r in rows)
    raise AssertionError("unreachable: the last try returns or raises")


def _fetch(conn: psycopg.Connection[Any], statement: str, params: Sequence[Any]) -> list[Any]:
    with cursor(conn) as cur:
        return cur.execute(statement, params).fetchall()


class DoneListener:
    """A connection of one wait's own that LISTENs on ``pgq_done``: it tells when a job's
    id is announced as final. It runs no other statement, so no notification can arrive
    while something else reads the connection (psycopg before 3.2.4 dropped those)."""

    __slots__ = ("conn",)

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(sql.LISTEN_DONE)
        self.conn = conn

    def announced(self, job_id: int, timeout_s: float) -> bool:
        """Whether ``job_id`` is announced within ``timeout_s`` seconds (False: not yet)."""
        wanted = str(job_id)
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            for notify in self.conn.notifies(timeout=left, stop_after=1):
                if wanted in notify.payload.split(","):
                    return True
        return False
