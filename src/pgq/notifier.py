"""One LISTEN connection per worker, reconnecting, that fans notifications out to callbacks."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc
import asyncpg

from pgq.db import CONNECTION_ERRORS, connect
from pgq.errors import DatabaseUnavailable

log = logging.getLogger("pgq.notifier")

Callback = Callable[[str], None]

LISTEN_ERRORS: tuple[type[Exception], ...] = (DatabaseUnavailable, *CONNECTION_ERRORS)


class Notifier:
    """Holds a dedicated connection that LISTENs on pgq's channels.

    Notifications are lost while the connection is down, so every (re)connection calls
    ``on_connect``: the worker then wakes its producers to fetch whatever arrived meanwhile.
    """

    def __init__(
        self,
        dsn: str | None,
        channels: dict[str, Callback],
        *,
        on_connect: Callable[[], None],
        connect_kwargs: dict[str, Any] | None = None,
        reconnect_max_s: float = 5.0,
    ) -> None:
        self._dsn = dsn
        self._channels = channels
        self._on_connect = on_connect
        self._connect_kwargs = connect_kwargs or {}
        self._reconnect_max_s = reconnect_max_s
        self.connected = anyio.Event()
        self.reconnects = 0

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen until cancelled; the first connection is made before ``task_status`` is set."""
        delay = 0.1
        started = False
        while True:
            conn: asyncpg.Connection[asyncpg.Record] | None = None
            try:
                conn = await connect(self._dsn, **self._connect_kwargs)
                lost = anyio.Event()
                conn.add_termination_listener(lambda _c, lost=lost: lost.set())
                for channel, callback in self._channels.items():
                    await conn.add_listener(channel, self._dispatcher(callback))
                if started:
                    self.reconnects += 1
                    log.info("LISTEN connection restored")
                self._on_connect()
                self.connected.set()
                if not started:
                    started = True
                    task_status.started()
                delay = 0.1
                await self._watch(conn, lost)
            except LISTEN_ERRORS as exc:
                if not started:
                    raise
                log.warning("LISTEN connection lost (%s); reconnecting in %.1fs", exc, delay)
            finally:
                if conn is not None:
                    with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                        await _close_quietly(conn)
            self.connected = anyio.Event()
            await anyio.sleep(delay)
            delay = min(delay * 2, self._reconnect_max_s)

    async def _watch(self, conn: asyncpg.Connection[asyncpg.Record], lost: anyio.Event) -> None:
        # asyncpg only notices a dead socket when it reads; a periodic no-op makes sure a
        # silently dropped connection is found and replaced.
        while not lost.is_set():
            with anyio.move_on_after(5):
                await lost.wait()
            if lost.is_set() or conn.is_closed():
                break
            with anyio.fail_after(5):
                await conn.execute("SELECT 1")
        log.warning("LISTEN connection closed by the server")

    @staticmethod
    def _dispatcher(callback: Callback) -> Callable[[Any, int, str, object], None]:
        def on_notify(_conn: Any, _pid: int, _channel: str, payload: object) -> None:
            try:
                callback(str(payload))
            except Exception:
                log.exception("notification handler failed")

        return on_notify


async def _close_quietly(conn: asyncpg.Connection[asyncpg.Record]) -> None:
    try:
        await conn.close(timeout=1)
    except Exception:
        conn.terminate()
