"""Batches job outcomes into fenced UPDATEs: one round trip for many jobs."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import anyio
import asyncpg

from pgq import sql
from pgq.db import CONNECTION_ERRORS, Pool

log = logging.getLogger("pgq.completer")


@dataclass(slots=True)
class Outcome:
    """The end of one attempt, as it will be written. ``(job_id, attempt, producer_id)`` is
    the fencing token; ``attempt_delta`` is -1 when the attempt must not count (a snooze, a
    shutdown)."""

    job_id: int
    attempt: int
    producer_id: uuid.UUID
    state: str
    delay_s: float | None = None
    error: str | None = None
    result: str | None = None
    attempt_delta: int = 0


#: Called with the outcomes a flush wrote, and those the fence rejected.
Reporter = Callable[[list[Outcome], list[Outcome]], None]


class Completer:
    """Collects outcomes from every producer of a worker and writes them in batches.

    A batch goes out when ``batch_size`` outcomes wait or ``interval_s`` after the first one,
    whichever is sooner. Outcomes that cannot be written (the database is away) are kept and
    retried; none is dropped while the worker lives.
    """

    def __init__(
        self,
        pool: Pool,
        report: Reporter,
        *,
        batch_size: int = 1000,
        interval_s: float = 0.002,
        retry_max_s: float = 5.0,
    ) -> None:
        self._pool = pool
        self._report = report
        self._batch_size = batch_size
        self._interval_s = interval_s
        self._retry_max_s = retry_max_s
        self._buffer: list[Outcome] = []
        self._has_items = anyio.Event()
        self._full = anyio.Event()
        self._idle = anyio.Event()
        self._idle.set()
        self.failures = 0
        #: Held around every write; a producer changing its id holds it too.
        self.write_lock = anyio.Lock()

    @property
    def pending(self) -> int:
        """Outcomes not yet durable."""
        return len(self._buffer)

    def add(self, outcome: Outcome) -> None:
        """Queue one outcome; never blocks."""
        self._buffer.append(outcome)
        if len(self._buffer) == 1:
            self._has_items.set()
            self._idle = anyio.Event()
        if len(self._buffer) >= self._batch_size:
            self._full.set()

    def rekey(self, old: uuid.UUID, new: uuid.UUID) -> None:
        """Point pending outcomes fenced with producer ``old`` at ``new``."""
        for outcome in self._buffer:
            if outcome.producer_id == old:
                outcome.producer_id = new

    async def wait_idle(self) -> None:
        """Return once every outcome added so far is written (or rejected)."""
        await self._idle.wait()

    async def run(self) -> None:
        """Write batches until cancelled. Cancel only after :meth:`wait_idle`."""
        delay = 0.1
        while True:
            await self._has_items.wait()
            if len(self._buffer) < self._batch_size:
                with anyio.move_on_after(self._interval_s):
                    await self._full.wait()
            batch = self._buffer[: self._batch_size]
            try:
                try:
                    await self._write(batch)
                except asyncpg.PostgresError as exc:
                    if isinstance(exc, CONNECTION_ERRORS):
                        raise
                    # Not the connection: something in the batch itself. Write the outcomes
                    # one by one so a single bad one cannot hold back the rest.
                    await self._write_singly(batch, exc)
            except CONNECTION_ERRORS as exc:
                self.failures += 1
                log.warning(
                    "could not write %d outcomes (%s); keeping them, retrying in %.1fs",
                    len(batch),
                    exc,
                    delay,
                )
                await anyio.sleep(delay)
                delay = min(delay * 2, self._retry_max_s)
                continue
            delay = 0.1
            del self._buffer[: len(batch)]
            self._full = anyio.Event()
            if not self._buffer:
                self._has_items = anyio.Event()
                self._idle.set()
            elif len(self._buffer) >= self._batch_size:
                self._full.set()

    async def _write_singly(self, batch: list[Outcome], first: BaseException) -> None:
        log.warning("batch of %d outcomes failed (%s); writing them one by one", len(batch), first)
        for outcome in batch:
            try:
                await self._write([outcome])
            except asyncpg.PostgresError as exc:
                # The job stays 'running' under this producer; the rescuer retries it later.
                self.failures += 1
                log.error(
                    "dropped the outcome of job %d attempt %d: %s",
                    outcome.job_id,
                    outcome.attempt,
                    exc,
                )

    async def _write(self, batch: list[Outcome]) -> None:
        batch.sort(key=lambda o: o.job_id)  # a stable lock order across concurrent writers
        simple: list[Outcome] = []
        other: list[Outcome] = []
        for o in batch:
            (simple if o.state == "completed" and o.error is None else other).append(o)
        written: set[int] = set()
        with anyio.fail_after(30):
            async with self.write_lock, self._pool.acquire() as conn:
                # Lock order: ids ascending within each statement; the two statements touch
                # disjoint jobs.
                if simple:
                    rows = await conn.fetch(
                        sql.COMPLETE_SUCCESSES,
                        [o.job_id for o in simple],
                        [o.attempt for o in simple],
                        [o.producer_id for o in simple],
                        [o.result for o in simple],
                        _done_payload(simple),
                    )
                    written.update(r[0] for r in rows)
                if other:
                    rows = await conn.fetch(
                        sql.COMPLETE_JOBS,
                        [o.job_id for o in other],
                        [o.attempt for o in other],
                        [o.producer_id for o in other],
                        [o.state for o in other],
                        [o.delay_s for o in other],
                        [o.error for o in other],
                        [o.result for o in other],
                        [o.attempt_delta for o in other],
                    )
                    written.update(r[0] for r in rows)
        if len(written) == len(batch):
            self._report(batch, [])
            return
        ok: list[Outcome] = []
        rejected: list[Outcome] = []
        for o in batch:
            (ok if o.job_id in written else rejected).append(o)
        self._report(ok, rejected)


def _done_payload(outcomes: list[Outcome], per_notification: int = 500) -> list[str]:
    # NOTIFY payloads stop at 8000 bytes: 500 ids a notification stays well under.
    ids = [str(o.job_id) for o in outcomes]
    return [",".join(ids[i : i + per_notification]) for i in range(0, len(ids), per_notification)]
