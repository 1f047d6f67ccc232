"""Helpers shared by the test packages."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeAlias

import anyio
import asyncpg

import pgq

if TYPE_CHECKING:
    #: An asyncpg connection, as the tests hold them.
    Conn: TypeAlias = asyncpg.Connection[asyncpg.Record]


async def until(
    condition: Callable[[], Awaitable[bool]], limit_s: float = 15, every_s: float = 0.05
) -> None:
    """Wait for a condition with no event of its own (a database row, another process)."""
    with anyio.fail_after(limit_s):
        while not await condition():  # noqa: ASYNC110 - nothing to await but the condition
            await anyio.sleep(every_s)


async def burst(app: pgq.App, dsn: str, limit_s: float = 30, **kw: Any) -> None:
    """Run a burst worker of ``app`` until no runnable job is left (at most ``limit_s``)."""
    with anyio.fail_after(limit_s):
        await pgq.Worker(app, dsn, **kw).run(burst=True)


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


class JobNotes:
    """The payloads (queue names) of the ``pgq_jobs`` notifications a listener received."""

    _END = "-- end of notes --"

    def __init__(self, conn: Conn) -> None:
        self.conn = conn
        self._payloads: list[str] = []
        self._arrived = anyio.Event()

    def _on_note(self, *args: object) -> None:
        self._payloads.append(str(args[3]))
        self._arrived.set()

    async def received(self) -> list[str]:
        """Every payload received so far, once all that was sent before this call is in:
        a notification sent now arrives after the earlier ones (delivered in commit order)."""
        await self.conn.execute("SELECT pg_notify('pgq_jobs', $1)", self._END)
        with anyio.fail_after(5):
            while self._END not in self._payloads:
                self._arrived = anyio.Event()
                await self._arrived.wait()
        self._payloads.remove(self._END)
        return list(self._payloads)


@asynccontextmanager
async def job_notes(dsn: str) -> AsyncIterator[JobNotes]:
    """Listen on ``pgq_jobs`` on a connection of its own while the block runs."""
    conn = await asyncpg.connect(dsn)
    notes = JobNotes(conn)
    await conn.add_listener("pgq_jobs", notes._on_note)
    try:
        yield notes
    finally:
        await conn.close()
