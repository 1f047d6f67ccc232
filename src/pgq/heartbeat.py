"""Producer heartbeats on a dedicated connection, and the self-fencing they drive."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence

import anyio
import asyncpg

from pgq import sql
from pgq.db import connect
from pgq.producer import Producer

log = logging.getLogger("pgq.heartbeat")


class Heartbeater:
    """Every ``interval_s`` writes ``heartbeat_at = now()`` (database clock) and the counters
    of every producer of the worker, in one statement, within ``timeout_s``.

    It owns its connection so job traffic can never starve it. ``max_failures`` failures
    in a row fence the producers (they claim nothing); the next success unfences them.
    """

    def __init__(
        self,
        dsn: str | None,
        producers: Sequence[Producer],
        *,
        worker_id: uuid.UUID,
        worker_name: str,
        interval_s: float,
        timeout_s: float,
        max_failures: int,
    ) -> None:
        self._dsn = dsn
        self._producers = producers
        self._worker_id = worker_id
        self._worker_name = worker_name
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._max_failures = max_failures
        self._conn: asyncpg.Connection[asyncpg.Record] | None = None
        self.beats = 0
        self.reregistrations = 0

    async def run(self) -> None:
        """Beat until cancelled. The schedule is start-to-start, so a slow beat does not
        stretch the interval the fencing invariant counts on."""
        next_at = anyio.current_time()  # the first beat at once: health shows up early
        try:
            while True:
                await anyio.sleep(max(0.0, next_at - anyio.current_time()))
                next_at += self._interval_s
                if next_at < anyio.current_time():  # the loop itself was held up
                    next_at = anyio.current_time() + self._interval_s
                await self.beat()
        finally:
            if self._conn is not None:
                self._conn.terminate()

    async def beat(self) -> bool:
        """One heartbeat; returns whether it succeeded."""
        try:
            with anyio.fail_after(self._timeout_s):
                if self._conn is None or self._conn.is_closed():
                    self._conn = await connect(
                        self._dsn,
                        timeout_s=self._timeout_s,
                        server_settings={"application_name": "pgq heartbeat"},
                    )
                alive = {r[0] for r in await self._conn.fetch(sql.HEARTBEAT, *self._columns())}
                for producer in self._producers:
                    if producer.id not in alive:
                        await self._reregister(self._conn, producer)
        except Exception as exc:  # whatever stopped it, this heartbeat did not land
            if self._conn is not None:
                self._conn.terminate()  # its state is unknown after a cut-off statement
                self._conn = None
            for producer in self._producers:
                producer.heartbeat_failed(exc, self._max_failures)
            return False
        self.beats += 1
        now = time.time()
        for producer in self._producers:
            producer.heartbeat_ok(now)
        return True

    def _columns(self) -> tuple[list[object], ...]:
        ps = self._producers
        return (
            [p.id for p in ps],
            [len(p.running) for p in ps],
            [p.healthy for p in ps],
            [p.claimed for p in ps],
            [p.completed for p in ps],
            [p.failed for p in ps],
            [p.rejected_outcomes for p in ps],
        )

    async def _reregister(
        self, conn: asyncpg.Connection[asyncpg.Record], producer: Producer
    ) -> None:
        # Outcomes are fenced on each attempt's own token, which adoption leaves alone: they
        # need no pause while the producer's id changes.
        old, new = producer.id, uuid.uuid4()
        running = list(producer.running)
        adopted = await conn.fetch(
            sql.REREGISTER_PRODUCER,
            old,
            new,
            self._worker_id,
            self._worker_name,
            producer.queue,
            producer.concurrency,
            producer.claimed,
            producer.completed,
            producer.failed,
            producer.rejected_outcomes,
            running,
        )
        producer.id = new
        self.reregistrations += 1
        log.warning(
            "producer %s (queue %s) found its row gone: peers judged it dead, or it was "
            "deleted; re-registered as %s and kept %d of its %d running jobs (the others "
            "were rescued: their late outcomes will be rejected)",
            old,
            producer.queue,
            new,
            len(adopted),
            len(running),
        )
