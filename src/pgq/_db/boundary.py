"""The public boundary: what the database or its driver (asyncpg, psycopg) raises under a
public call comes out as one of pgq's errors (:mod:`pgq.errors`), the driver's exception on
``__cause__``; and a closed client says so (:class:`~pgq.errors.ClientClosed`).

Only the public calls wrap: inside the worker, the loops keep reading the driver's types
(``DATABASE_ERRORS``, ``is_transient``) to tell a passing failure from a refusal."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, Protocol, TypeVar, cast

import asyncpg

from pgq._core.dsn import scrub
from pgq._db.connections import is_transient
from pgq.errors import (
    ClientClosed,
    DatabaseError,
    DatabaseUnavailable,
    PgqError,
    TransactionConflict,
)

#: What a call on a closed client raises.
CLOSED = "the client is closed: open it again (`async with client`, or `client.open()`)"

#: asyncpg's exceptions, and the system's for a socket (a ConnectionResetError).
_ASYNCPG_ERRORS: tuple[type[Exception], ...] = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,
)


def _driver_errors() -> tuple[type[Exception], ...]:
    # psycopg is optional (the sync extra), and SQLAlchemy (a caller's connection= session,
    # whose statements raise its DBAPIError) loaded only when used: none of their errors
    # exists before they are imported.
    found = _ASYNCPG_ERRORS
    if (psycopg := sys.modules.get("psycopg")) is not None:
        found = (*found, psycopg.Error)
    if (sqlalchemy_exc := sys.modules.get("sqlalchemy.exc")) is not None:
        found = (*found, sqlalchemy_exc.DBAPIError)
    return found


def _underlying(exc: BaseException) -> BaseException:
    """The driver's exception behind ``exc``: SQLAlchemy's DBAPIError holds its DBAPI's on
    ``orig``, which its asyncpg dialect raises from asyncpg's own."""
    orig = getattr(exc, "orig", None)
    if not isinstance(orig, BaseException) or isinstance(exc, _ASYNCPG_ERRORS):
        return exc
    cause = orig.__cause__
    return cause if isinstance(cause, _driver_errors()) else orig


def _unavailable(exc: BaseException) -> bool:
    if isinstance(exc, asyncpg.InterfaceError) and isinstance(exc, ValueError):
        return False  # a value the driver could not send (its DataError): refused
    if is_transient(exc):
        return True
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(exc, psycopg.OperationalError)


def database_error(exc: BaseException, dsn: str | None = None, caller: Any = None) -> DatabaseError:
    """pgq's error for ``exc``, a driver's (or the socket's): a conflict, the database
    unavailable, or a refusal; its message without the DSN's password. ``caller``: the
    caller's connection (``connection=``) the call ran on, whose transaction the message
    then speaks of."""
    exc = _underlying(exc)
    sqlstate = getattr(exc, "sqlstate", None)
    sqlstate = sqlstate if isinstance(sqlstate, str) and sqlstate else None
    reason = scrub(str(exc).strip() or type(exc).__name__, dsn)
    said = f"{reason} (SQLSTATE {sqlstate})" if sqlstate else f"{type(exc).__name__}: {reason}"
    if sqlstate is not None and sqlstate.startswith("40"):
        return TransactionConflict(
            f"the transaction conflicted with another and was rolled back, nothing of it "
            f"written: {said}; run the whole transaction again",
            sqlstate=sqlstate,
        )
    if not _unavailable(exc):
        return DatabaseError(f"PostgreSQL refused the call: {said}", sqlstate=sqlstate)
    if caller is None:
        return DatabaseUnavailable(
            f"the database cannot serve the call now: {said}; it may succeed once the "
            "server is back (a write cut off while it committed may have landed)",
            sqlstate=sqlstate,
        )
    if _lost(exc, sqlstate, caller):
        return DatabaseUnavailable(
            f"your connection (connection=) was lost: {said}. Its whole transaction is "
            "rolled back, not only this call's writes. Once the server is back, run the "
            "whole transaction again on a new connection (outside a transaction, a write "
            "cut off as it committed may have landed)",
            sqlstate=sqlstate,
        )
    return DatabaseUnavailable(
        f"the database cannot serve the call now: {said}. The call's writes in your "
        "transaction (connection=) are undone: roll the transaction back, and run it whole "
        "again once the server can serve it",
        sqlstate=sqlstate,
    )


#: SQLSTATEs after which the server has ended the session: connection exceptions (class
#: 08), and admin_shutdown, crash_shutdown, cannot_connect_now (a terminated backend).
_SESSION_ENDED = ("08", "57P01", "57P02", "57P03")


def _lost(exc: BaseException, sqlstate: str | None, caller: Any) -> bool:
    """Whether ``exc`` (the database unavailable) means ``caller``, the caller's connection,
    is gone, and with it its transaction; else only the statement failed."""
    if sqlstate is not None:
        return sqlstate.startswith(_SESSION_ENDED)
    if isinstance(caller, asyncpg.Connection):
        return caller.is_closed()  # not an InterfaceError of a connection in use meanwhile
    # A socket's error, or the driver's without a SQLSTATE (psycopg's "the connection is
    # lost"): the connection is what failed.
    return True


def _wrapped(exc: Exception, closed: bool, dsn: str | None, caller: Any = None) -> PgqError | None:
    """What ``exc``, raised by a public call (on ``caller``, the caller's connection, when
    given), comes out as (None: itself)."""
    if isinstance(exc, ClientClosed | TimeoutError):
        return None  # a wait's timeout, or asyncpg's own: the builtin, as documented
    if closed and isinstance(exc, (DatabaseError, *_driver_errors())):
        return ClientClosed(CLOSED)  # closed while the call was under way
    if isinstance(exc, PgqError) or not isinstance(exc, _driver_errors()):
        return None
    return database_error(exc, dsn, caller)


class _Client(Protocol):
    _closed: bool
    _dsn: str | None


A = TypeVar("A", bound=Callable[..., Coroutine[Any, Any, Any]])
S = TypeVar("S", bound=Callable[..., Any])


def public(method: A) -> A:
    """An async client method at the boundary: refused on a closed client; the driver's
    errors raised as pgq's. (Typed as the method itself: its overloads stand.)"""

    @functools.wraps(method)
    async def call(self: _Client, /, *args: Any, **kwargs: Any) -> Any:
        if self._closed:
            raise ClientClosed(CLOSED)
        try:
            return await method(self, *args, **kwargs)
        except Exception as exc:
            wrapped = _wrapped(exc, self._closed, self._dsn, kwargs.get("connection"))
            if wrapped is None:
                raise
            raise wrapped from exc

    return cast(A, call)


def public_sync(method: S) -> S:
    """:func:`public` for a synchronous client's method."""

    @functools.wraps(method)
    def call(self: _Client, /, *args: Any, **kwargs: Any) -> Any:
        if self._closed:
            raise ClientClosed(CLOSED)
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            wrapped = _wrapped(exc, self._closed, self._dsn, kwargs.get("connection"))
            if wrapped is None:
                raise
            raise wrapped from exc

    return cast(S, call)


class database_errors:  # used as a function: `with database_errors(dsn):`
    """``with database_errors(dsn):`` raises what the driver raises inside as pgq's error,
    the driver's on ``__cause__`` (pgq's own errors pass as they are); ``caller``: the
    caller's connection the statements inside run on."""

    __slots__ = ("_caller", "_dsn")

    def __init__(self, dsn: str | None = None, *, caller: Any = None) -> None:
        self._dsn = dsn
        self._caller = caller

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if isinstance(exc, Exception) and (
            wrapped := _wrapped(exc, False, self._dsn, self._caller)
        ):
            raise wrapped from exc
