"""LISTEN: a worker's reconnecting connection that fans notifications out to callbacks, the
client's wait for finished jobs, and the typed payloads of the control channel."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
import asyncpg

from pgq._db import sql
from pgq._db.connections import CONNECTION_ERRORS, Pool, Target, connect
from pgq.errors import ConfigError, DatabaseUnavailable

log = logging.getLogger("pgq.notifier")

Callback = Callable[[str], None]

LISTEN_ERRORS: tuple[type[Exception], ...] = (DatabaseUnavailable, *CONNECTION_ERRORS)

#: The longest close() waits for the LISTEN connection's UNLISTEN, then for its reset as
#: it goes back to the pool, before ending it.
CLOSE_S = 1.0

#: What a wait() under way when its client is closed raises (as ConfigError).
CLOSED_DURING_WAIT = (
    "the client was closed while a wait() was under way: close it only after its waits have ended"
)


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
        #: Times the connection was lost and made again.
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


# --------------------------------------------------------------------------- control payloads


@dataclass(frozen=True, slots=True)
class CancelRequested:
    """``client.cancel()`` asked that running job ``job_id`` stop."""

    job_id: int


@dataclass(frozen=True, slots=True)
class QueuePaused:
    """Queue ``queue`` was paused (``*``: every queue)."""

    queue: str


@dataclass(frozen=True, slots=True)
class LimitsChanged:
    """Queue ``queue``'s flow-control limits were set or cleared."""

    queue: str


ControlEvent = CancelRequested | QueuePaused | LimitsChanged


def parse_control(payload: str) -> ControlEvent | None:
    """The control message in a ``pgq_control`` payload (see ``sql.CANCEL_JOBS`` and
    ``sql.PAUSE_QUEUE``), or None for one this pgq does not know (a newer release's)."""
    try:
        message = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(message, dict):
        return None
    kind = message.get("kind")
    job_id = message.get("job_id")
    queue = message.get("queue")
    if kind == "cancel" and isinstance(job_id, int) and not isinstance(job_id, bool):
        return CancelRequested(job_id)
    if kind == "pause" and isinstance(queue, str):
        return QueuePaused(queue)
    if kind == "limits" and isinstance(queue, str):
        return LimitsChanged(queue)
    return None


# --------------------------------------------------------------------------- waiting for jobs


class DoneWaiters:
    """One LISTEN connection on ``pgq_done`` shared by every waiter of a client: each waits
    for an event, set when its job's id is announced. The connection is the pool's, or,
    behind a transaction pooler, one of its own to ``listen_dsn`` (past the pooler)."""

    def __init__(self, pool: Pool, listen: Target | None = None) -> None:
        self._pool = pool
        self._listen = listen
        self._conn: Any = None
        self._events: dict[int, list[anyio.Event]] = {}
        self._lock = anyio.Lock()
        self._closed = False
        #: The scope of a LISTEN being set up (under the lock), which close() cancels.
        self._setting_up: anyio.CancelScope | None = None

    async def event_for(self, job_id: int) -> anyio.Event:
        """A new event, set when ``job_id`` is next announced as finished (or when the
        connection was made again: a waiter must then re-read its job)."""
        await self._listening()
        event = anyio.Event()
        self._events.setdefault(job_id, []).append(event)
        return event

    def forget(self, job_id: int, event: anyio.Event) -> None:
        """Stop waiting with ``event``."""
        left = [e for e in self._events.get(job_id, []) if e is not event]
        if left:
            self._events[job_id] = left
        else:
            self._events.pop(job_id, None)

    def _on_done(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        for part in str(payload).split(","):
            for event in self._events.pop(int(part), ()) if part.isdigit() else ():
                event.set()

    async def _listening(self) -> None:
        async with self._lock:
            if self._conn is not None and not _gone(self._conn):
                return  # (close() clears it under this lock, then wakes every waiter)
            if self._conn is not None:
                conn, self._conn = self._conn, None
                await self._give_back(conn)
            if self._closed:
                raise ConfigError(CLOSED_DURING_WAIT)
            try:
                with anyio.CancelScope() as self._setting_up:
                    self._conn = await self._listening_connection()
            finally:
                self._setting_up = None
            if self._closed:  # cancelled by close(), or closed as it ended: close() gives it back
                raise ConfigError(CLOSED_DURING_WAIT)
            # A reconnect may have missed notifications: let every waiter re-read.
            self._wake_all()

    async def _listening_connection(self) -> Any:
        """A connection that has run its LISTEN and watches for its own end. One lost
        before that (a pool's connection whose server process ended while it sat idle, or
        one cut as it began to listen) is given back and replaced once; a second loss, or
        any other error, is raised (the database is down, or refuses)."""
        replaced = False
        while True:
            conn: Any
            if self._listen is None:
                conn = await self._pool.acquire()
            else:
                conn = await connect(self._listen.dsn, **self._listen.options("pgq client wait"))
            try:
                await conn.add_listener(sql.CHANNEL_DONE, self._on_done)
                # Lost later (a server restart, a failover): every waiter is woken, reads
                # its job again and, waiting on, reconnects through event_for(). Lost in
                # the moment before this line, it would call nobody: hence the check.
                conn.add_termination_listener(self._on_lost)
                if _gone(conn):
                    raise asyncpg.ConnectionDoesNotExistError("lost as its LISTEN ended")
            except Exception as exc:
                lost = _gone(conn) or isinstance(exc, CONNECTION_ERRORS)
                await self._give_back(conn)
                if lost and not replaced:
                    replaced = True
                    continue
                raise
            except BaseException:
                # Cancelled mid-LISTEN: the connection's state is unknown (it may listen
                # yet). Ended, it hands its place back to the pool at once.
                _end(conn)
                raise
            return conn

    def _on_lost(self, conn: Any) -> None:
        # Called soon after a connection ends: one already replaced or given back is no
        # longer ours. A pool's connection that dies is detached and given back by the pool
        # itself: only the reference goes. The next event_for() connects again.
        if conn is not self._conn:
            return
        if self._listen is not None:
            conn.terminate()
        self._conn = None
        self._wake_all()

    def _wake_all(self) -> None:
        for events in self._events.values():
            for e in events:
                e.set()

    async def close(self) -> None:
        """Give the connection back to the pool; a wait still under way then raises
        ConfigError instead of listening again. Bounded: a LISTEN being set up (or a
        connection being waited for) is cut short, and a connection that does not answer
        its UNLISTEN and reset within ``CLOSE_S`` is ended; an ended connection hands its
        place back."""
        self._closed = True
        if self._setting_up is not None:
            self._setting_up.cancel()
        # Shielded (it is bounded): a close() in a cancelled scope (an `async with` body
        # left by a timeout) would otherwise keep the connection's place for good.
        with anyio.CancelScope(shield=True):
            async with self._lock:
                conn, self._conn = self._conn, None
                if conn is not None:
                    await self._hand_back(conn)
        self._wake_all()

    async def _hand_back(self, conn: Any) -> None:
        unlistened = False
        try:
            with anyio.move_on_after(CLOSE_S):
                if not _gone(conn):
                    conn.remove_termination_listener(self._on_lost)
                    await conn.remove_listener(sql.CHANNEL_DONE, self._on_done)
                    unlistened = True
        except Exception as exc:  # lost meanwhile, or refused: ended below
            log.debug("UNLISTEN before giving the connection back failed: %r", exc)
        except BaseException:
            _end(conn)
            raise
        if unlistened:
            await self._give_back(conn)
        else:
            _end(conn)

    async def _give_back(self, conn: Any) -> None:
        if self._listen is not None:
            await _close_quietly(conn)
            return
        if _gone(conn):
            # Ending a dead connection hands its place back to the pool now, or it already
            # was; release() could race the pool's own clean-up of it, and would first
            # warn of the listener still registered on it.
            _end(conn)
            return
        try:
            await self._pool.release(conn, timeout=CLOSE_S)
        except asyncpg.InterfaceError:
            pass  # already detached and given back
        except Exception as exc:
            # Its reset failed (or the pool's reset= callback did) or took longer than
            # CLOSE_S: the pool ended it, which gave its place back.
            log.warning("the LISTEN connection of client waits was ended, not reset: %r", exc)
            _end(conn)


def _end(conn: Any) -> None:
    """End ``conn`` at once (a pool's connection: its place goes back to the pool)."""
    with contextlib.suppress(asyncpg.InterfaceError):  # a pool's proxy already detached
        conn.terminate()


def _gone(conn: Any) -> bool:
    """Whether ``conn`` is closed, or a pool's proxy already detached from it."""
    try:
        return bool(conn.is_closed())
    except asyncpg.InterfaceError:
        return True
