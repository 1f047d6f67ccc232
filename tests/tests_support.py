"""Helpers shared by the test packages."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeAlias

import anyio

if TYPE_CHECKING:
    import asyncpg

    #: An asyncpg connection, as the tests hold them.
    Conn: TypeAlias = asyncpg.Connection[asyncpg.Record]


async def until(
    condition: Callable[[], Awaitable[bool]], limit_s: float = 15, every_s: float = 0.05
) -> None:
    """Wait for a condition with no event of its own (a database row, another process)."""
    with anyio.fail_after(limit_s):
        while not await condition():  # noqa: ASYNC110 - nothing to await but the condition
            await anyio.sleep(every_s)
