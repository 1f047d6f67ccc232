"""A caller's connection (``connection=``), for pgq to write in its transaction: asyncpg's,
or SQLAlchemy's ``AsyncConnection`` / ``AsyncSession`` on the asyncpg driver."""

from __future__ import annotations

from typing import Any

from pgq._store.connections import Connection, caller_connection
from pgq._store.enqueue import AsyncDriver, AsyncpgDriver


async def caller_driver(connection: Any) -> AsyncDriver:
    """The driver that runs an enqueue's plan in ``connection``'s transaction."""
    return AsyncpgDriver(await caller_connection(connection))


async def caller_db(connection: Any) -> Connection:
    """The asyncpg connection behind ``connection``, for the calls that run on asyncpg
    alone."""
    return await caller_connection(connection)
