"""psycopg's async connection as a driver: the plans of ``enqueue`` (and a task's own
settling) run on a caller's ``psycopg.AsyncConnection``, their statements as they are (a
raw cursor takes PostgreSQL's own ``$1`` placeholders), rows read by column name.

Imported only for a caller's psycopg connection: psycopg is the ``sync`` extra's."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import psycopg
from psycopg import AsyncRawCursor
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row

from pgq._db import sql


def cursor(conn: psycopg.AsyncConnection[Any]) -> AsyncRawCursor[dict[str, Any]]:
    """A cursor that takes pgq's statements as they are and returns rows by name."""
    return AsyncRawCursor(conn, row_factory=dict_row)


class PsycopgAsyncDriver:
    """``enqueue.AsyncDriver`` over a caller's psycopg ``AsyncConnection``."""

    __slots__ = ("conn",)

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn

    async def fetch(self, statement: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        async with cursor(self.conn) as cur:
            await cur.execute(statement, params)
            return await cur.fetchall()

    async def fetchrow(self, statement: str, params: Sequence[Any]) -> dict[str, Any] | None:
        async with cursor(self.conn) as cur:
            await cur.execute(statement, params)
            return await cur.fetchone()

    async def copy_jobs(self, records: list[tuple[Any, ...]], plain: bool) -> None:
        # psycopg writes the rows in COPY's text format.
        async with (
            cursor(self.conn) as cur,
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
