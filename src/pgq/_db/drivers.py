"""The drivers a plan of ``enqueue`` runs on: what it needs of a connection
(:class:`AsyncDriver`, :class:`SyncDriver`), asyncpg's (:class:`AsyncpgDriver`; psycopg's
are ``psycopg_drivers``), and a caller's connection (``connection=``), for pgq to write in
its transaction: asyncpg's, psycopg's ``AsyncConnection``, or SQLAlchemy's
``AsyncConnection`` / ``AsyncSession`` on either driver (``postgresql+asyncpg``,
``postgresql+psycopg``)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import asyncpg

from pgq._db import sql
from pgq._db.codec import RowLike
from pgq._db.connections import Connection
from pgq.errors import ConfigError


class AsyncDriver(Protocol):
    """What a plan needs of an asynchronous connection."""

    async def fetch(self, statement: str, params: Sequence[Any]) -> Sequence[RowLike]: ...

    async def fetchrow(self, statement: str, params: Sequence[Any]) -> RowLike | None: ...

    async def copy_jobs(self, records: list[tuple[Any, ...]], plain: bool) -> None: ...

    def transaction(self) -> AbstractAsyncContextManager[Any]: ...


class SyncDriver(Protocol):
    """What a plan needs of a synchronous connection."""

    def fetch(self, statement: str, params: Sequence[Any]) -> Sequence[RowLike]: ...

    def fetchrow(self, statement: str, params: Sequence[Any]) -> RowLike | None: ...

    def copy_jobs(self, records: list[tuple[Any, ...]], plain: bool) -> None: ...

    def transaction(self) -> AbstractContextManager[Any]: ...


@dataclass(frozen=True, slots=True)
class AsyncpgDriver:
    """:class:`AsyncDriver` over an asyncpg connection (pgq's own, or a caller's)."""

    conn: Connection

    async def fetch(self, statement: str, params: Sequence[Any]) -> Sequence[RowLike]:
        return await self.conn.fetch(statement, *params)

    async def fetchrow(self, statement: str, params: Sequence[Any]) -> RowLike | None:
        return await self.conn.fetchrow(statement, *params)

    async def copy_jobs(self, records: list[tuple[Any, ...]], plain: bool) -> None:
        # Binary COPY: no text to build or parse per row.
        await self.conn.copy_records_to_table(
            sql.COPY_JOBS_TABLE,
            records=records,
            columns=sql.COPY_JOBS_COLUMNS[: 6 if plain else None],
        )

    def transaction(self) -> AbstractAsyncContextManager[Any]:
        return self.conn.transaction()


#: What ``connection=`` takes, for the messages that refuse something else.
TAKES = (
    "an asyncpg connection, a psycopg AsyncConnection, or a SQLAlchemy AsyncConnection or "
    "AsyncSession (postgresql+asyncpg or postgresql+psycopg)"
)


async def caller_driver(connection: Any) -> AsyncDriver:
    """The driver that runs pgq's statements in ``connection``'s transaction."""
    driver = await _driver_connection(connection)
    if isinstance(driver, asyncpg.Connection):
        return AsyncpgDriver(driver)
    from pgq._db import psycopg_drivers

    return await psycopg_drivers.joined(driver)


async def caller_db(connection: Any, what: str) -> Connection:
    """The asyncpg connection behind ``connection``, for ``what`` (a call that runs on
    asyncpg alone), inside the caller's transaction."""
    driver = await _driver_connection(connection)
    if not isinstance(driver, asyncpg.Connection):
        raise ConfigError(
            f"{what} takes connection= on asyncpg only (an asyncpg connection, or a SQLAlchemy "
            "AsyncConnection or AsyncSession on postgresql+asyncpg); on psycopg's async "
            "connection pgq enqueues (enqueue, enqueue_many, enqueue_chain, enqueue_group) "
            "and settles a task's attempt (ctx.complete and its siblings)"
        )
    return driver


def _psycopg_async(connection: object) -> bool:
    # psycopg is optional (the sync extra): a psycopg connection means it is imported.
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(connection, psycopg.AsyncConnection)


async def _driver_connection(connection: Any) -> Any:
    """The asyncpg or psycopg connection behind ``connection``.

    A SQLAlchemy connection begins its database transaction lazily ("autobegin"), at its
    first statement; when it has not yet, a no-op statement through SQLAlchemy begins it,
    so that pgq's write commits or rolls back with the caller's (unless the caller chose
    AUTOCOMMIT)."""
    if isinstance(connection, asyncpg.Connection) or _psycopg_async(connection):
        return connection
    try:
        from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    except ImportError:  # pragma: no cover - sqlalchemy is a dependency
        AsyncConnection = AsyncSession = ()  # type: ignore[assignment,misc]
    if isinstance(connection, AsyncSession):
        connection = await connection.connection()
    if not isinstance(connection, AsyncConnection):
        raise ConfigError(f"connection= takes {TAKES}, not {type(connection).__name__}")
    raw = await connection.get_raw_connection()
    driver: Any = raw.driver_connection
    if isinstance(driver, asyncpg.Connection):
        begun = driver.is_in_transaction()
    elif _psycopg_async(driver):
        begun = driver.info.transaction_status != 0  # psycopg.pq.TransactionStatus.IDLE
    else:
        raise ConfigError(
            "pgq needs SQLAlchemy's asyncpg or psycopg driver for connection=: create the "
            "engine with a postgresql+asyncpg:// or postgresql+psycopg:// URL"
        )
    if not begun:
        await connection.exec_driver_sql("SELECT 1")
    return driver


def too_large_errors() -> tuple[type[Exception], ...]:
    """The drivers' errors for a value PostgreSQL cannot store (program_limit_exceeded)."""
    psycopg = sys.modules.get("psycopg")
    if psycopg is None:
        return (asyncpg.ProgramLimitExceededError,)
    return (asyncpg.ProgramLimitExceededError, psycopg.errors.ProgramLimitExceeded)
