"""Helpers shared by the test packages."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeAlias

import anyio

import pgq

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


def blocking_app() -> tuple[pgq.App, anyio.Event]:
    """An App whose task ``forever`` sets the returned event when it starts, then sleeps
    for an hour: a job that is certainly running when the test acts on it."""
    app = pgq.App()
    started = anyio.Event()

    @app.task
    async def forever(ctx: pgq.JobContext) -> None:
        started.set()
        await anyio.sleep(3600)

    return app, started
