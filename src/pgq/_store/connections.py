"""Connections: opening pools and connections with clear errors, telling passing failures
from refusals, and adapting a caller's connection (asyncpg, or SQLAlchemy's AsyncConnection /
AsyncSession)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import asyncpg

from pgq._dsn import mask_dsn, scrub
from pgq.errors import ConfigError, DatabaseUnavailable

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

log = logging.getLogger("pgq")

if TYPE_CHECKING:
    from typing import TypeAlias

    from asyncpg.pool import PoolConnectionProxy

    Connection: TypeAlias = asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]
    Pool: TypeAlias = asyncpg.Pool[asyncpg.Record]
    #: Where a statement runs: a connection (in its transaction), or a pool (one acquire).
    Db: TypeAlias = Connection | Pool
    Record: TypeAlias = asyncpg.Record
else:
    Connection = asyncpg.Connection
    Pool = asyncpg.Pool
    Db = asyncpg.Connection | asyncpg.Pool
    Record = asyncpg.Record

# Errors that mean "the database is not there" rather than "the statement was wrong".
CONNECTION_ERRORS: tuple[type[Exception], ...] = (
    OSError,
    TimeoutError,
    asyncpg.ConnectionDoesNotExistError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,  # protocol state lost mid-statement (e.g. server shutting down)
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.ConnectionFailureError,
    asyncpg.TooManyConnectionsError,
    asyncpg.QueryCanceledError,
)


# SQLSTATE classes of failures that pass: connection exceptions, transaction rollbacks
# (deadlock, serialization), insufficient resources (disk full, out of memory), operator
# intervention (shutdown, cancel), system errors.
_TRANSIENT_CLASSES = frozenset({"08", "40", "53", "57", "58"})
_READ_ONLY_TRANSACTION = "25006"  # connected to a standby (e.g. during a failover)


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` says the database could not do it *now*: the same statement may well
    succeed later. Otherwise the statement itself (or what it carries) was refused."""
    if isinstance(exc, asyncpg.PostgresError):
        state = exc.sqlstate or ""
        return (
            state[:2] in _TRANSIENT_CLASSES
            or state == _READ_ONLY_TRANSACTION
            or isinstance(exc, asyncpg.InvalidCachedStatementError)
        )
    return isinstance(exc, CONNECTION_ERRORS)


def _unavailable(dsn: str | None, exc: BaseException) -> DatabaseUnavailable:
    reason = scrub(str(exc) or type(exc).__name__, dsn)
    err = DatabaseUnavailable(
        f"cannot connect to PostgreSQL at {mask_dsn(dsn)}: {reason}; check that the server "
        "is running and the DSN (--dsn, PGQ_DSN or DATABASE_URL) is right"
    )
    err.__cause__ = exc
    return err


def _unparsable(dsn: str | None, exc: ValueError) -> ConfigError:
    return ConfigError(
        f"malformed DSN {mask_dsn(dsn)}: {scrub(str(exc), dsn)}; expected "
        "postgresql://user:password@host:port/database"
    )


_connect_errors: tuple[type[Exception], ...] = (
    *CONNECTION_ERRORS,
    asyncpg.InvalidAuthorizationSpecificationError,
    asyncpg.InvalidPasswordError,
    asyncpg.InvalidCatalogNameError,
)
#: Connection trouble, or a statement the server refused: a loop logs it and tries again.
DATABASE_ERRORS: tuple[type[Exception], ...] = (*CONNECTION_ERRORS, asyncpg.PostgresError)


async def connect(
    dsn: str | None, *, timeout_s: float = 10.0, **kwargs: Any
) -> asyncpg.Connection[asyncpg.Record]:
    """Open one connection, turning driver and socket failures into DatabaseUnavailable."""
    try:
        return await asyncpg.connect(dsn, timeout=timeout_s, **kwargs)
    except _connect_errors as exc:
        raise _unavailable(dsn, exc) from exc
    except ValueError as exc:  # asyncpg's own DSN parser
        raise _unparsable(dsn, exc) from None


#: Session settings for the worker's connections. Its batch statements join arrays whose
#: sizes vary to the jobs table: a generic plan (which Postgres switches to after five runs
#: of a prepared statement) guesses their size and can pick a plan many times slower;
#: custom plans cost a fraction of a millisecond per batch. (The client's inserts have no
#: join to get wrong, and keep cheap generic plans.)
WORKER_SESSION_SETTINGS = {"plan_cache_mode": "force_custom_plan"}


async def _reset(conn: Connection) -> None:
    # asyncpg's default reset costs a round trip per release (UNLISTEN *, RESET ALL, ...):
    # one per job batch on the hot path. pgq's statements leave no session state behind
    # (LISTENs are removed by their owner); only an abandoned transaction needs undoing.
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK")


async def create_pool(
    dsn: str | None, *, min_size: int, max_size: int, timeout_s: float = 10.0, **kwargs: Any
) -> Pool:
    """Open a pool (its first connections too) for pgq's own use, with the same error
    translation."""
    kwargs.setdefault("reset", _reset)
    try:
        pool = await asyncpg.create_pool(
            dsn, min_size=min_size, max_size=max_size, timeout=timeout_s, **kwargs
        )
    except _connect_errors as exc:
        raise _unavailable(dsn, exc) from exc
    except ValueError as exc:
        raise _unparsable(dsn, exc) from None
    assert pool is not None
    return pool


async def caller_connection(
    connection: Connection | AsyncConnection | AsyncSession,
) -> Connection:
    """The asyncpg connection behind ``connection``, inside the caller's transaction.

    A SQLAlchemy connection begins its database transaction lazily ("autobegin"), at its
    first statement; when it has not yet, a no-op statement through SQLAlchemy begins it, so
    our write commits or rolls back with the caller's (unless the caller chose AUTOCOMMIT).
    """
    if isinstance(connection, asyncpg.Connection):
        return connection
    try:
        from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    except ImportError:  # pragma: no cover - sqlalchemy is a dependency
        AsyncConnection = AsyncSession = ()  # type: ignore[assignment,misc]
    if isinstance(connection, AsyncSession):
        connection = await connection.connection()
    if not isinstance(connection, AsyncConnection):
        raise ConfigError(
            f"connection= takes an asyncpg connection or a SQLAlchemy AsyncConnection or "
            f"AsyncSession, not {type(connection).__name__}"
        )
    raw = await connection.get_raw_connection()
    driver = raw.driver_connection
    if not isinstance(driver, asyncpg.Connection):
        raise ConfigError(
            "pgq needs SQLAlchemy's asyncpg driver for connection=: create the engine with a "
            "postgresql+asyncpg:// URL"
        )
    if not driver.is_in_transaction():
        await connection.exec_driver_sql("SELECT 1")
    return driver
