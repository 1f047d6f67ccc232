"""What a client does besides enqueueing: cancel, retry, queue control, waiting for results,
and the operator's reads (jobs, queues, stats). Mixed into :class:`pgq.Client`."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import anyio

from pgq import serde, sql
from pgq.app import check_queue_name
from pgq.db import Pool, caller_connection
from pgq.job import Job, JobState

if TYPE_CHECKING:
    import asyncpg
    from asyncpg.pool import PoolConnectionProxy

    from pgq.client import AnyConnection

log = logging.getLogger("pgq.client")


@dataclass(slots=True)
class QueueInfo:
    """A queue as `pgq queues list` shows it."""

    name: str
    paused: bool
    paused_at: datetime | None
    available: int
    running: int
    producers: int


@dataclass(slots=True)
class QueueStats:
    """Counts of one queue by state, the age of its oldest available job and its
    throughput over the last minute."""

    queue: str
    counts: dict[JobState, int] = field(default_factory=lambda: dict.fromkeys(JobState, 0))
    oldest_available_s: float | None = None
    completed_last_minute: int = 0
    finished_last_minute: int = 0


def job_from_record(rec: Any) -> Job:
    """A full :class:`Job` from a ``sql.GET_JOB``-shaped row."""
    producer = rec["producer_id"]
    return Job(
        id=rec["id"],
        queue=rec["queue"],
        task=rec["task"],
        args=serde.loads(rec["args"]),
        state=JobState(rec["state"]),
        priority=rec["priority"],
        attempt=rec["attempt"],
        max_attempts=rec["max_attempts"],
        scheduled_at=rec["scheduled_at"],
        attempted_at=rec["attempted_at"],
        finalized_at=rec["finalized_at"],
        created_at=rec["created_at"],
        producer_id=uuid.UUID(str(producer)) if producer is not None else None,
        errors=serde.loads(rec["errors"]),
        tags=list(rec["tags"]),
        metadata=serde.loads(rec["metadata"]),
        result=serde.loads(rec["result"]),
        unique_key=rec["unique_key"],
        attempt_token=rec["attempt_token"],
    )


class _Waiters:
    """One LISTEN connection on ``pgq_done`` shared by every :meth:`Operations.wait`."""

    def __init__(self) -> None:
        self.conn: PoolConnectionProxy[asyncpg.Record] | None = None
        self.events: dict[int, list[anyio.Event]] = {}
        self.lock = anyio.Lock()

    def on_done(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        for part in str(payload).split(","):
            for event in self.events.pop(int(part), ()) if part.isdigit() else ():
                event.set()


class Operations:
    """Cancel, retry, pause and resume, wait, and the operator's reads."""

    _waiters: _Waiters | None = None

    @property
    def pool(self) -> Pool:  # provided by Client
        raise NotImplementedError

    async def _conn_do(self, connection: AnyConnection | None, query: str, *args: Any) -> list[Any]:
        if connection is not None:
            return list(await (await caller_connection(connection)).fetch(query, *args))
        async with self.pool.acquire() as conn:
            return list(await conn.fetch(query, *args))

    # ------------------------------------------------------------------ actions

    async def cancel(self, job_id: int, *, connection: AnyConnection | None = None) -> Job | None:
        """Cancel a job. Not yet running: it becomes ``cancelled`` at once. Running: its
        worker is told (NOTIFY, or its next poll) and cancels it (an async task is
        cancelled; a thread sees ``ctx.cancel_requested``); it ends ``cancelled`` unless it
        finished first. Returns the job as it is now (None if there is no such job)."""
        await self.cancel_many([job_id], connection=connection)
        return await self.get_job(job_id, connection=connection)

    async def cancel_many(
        self, job_ids: Iterable[int], *, connection: AnyConnection | None = None
    ) -> dict[int, JobState]:
        """Cancel several jobs; returns the state each acted-on job is in now (running jobs
        stay ``running`` until their worker stops them). Final jobs are left out."""
        rows = await self._conn_do(connection, sql.CANCEL_JOBS, list(job_ids))
        return {r[0]: JobState(r[1]) for r in rows}

    async def retry(
        self, job_ids: Iterable[int], *, connection: AnyConnection | None = None
    ) -> list[int]:
        """Make finished, retryable or scheduled jobs available now (allowing one more
        attempt to jobs that used theirs); returns the ids that were changed."""
        rows = await self._conn_do(connection, sql.RETRY_JOBS, list(job_ids))
        return sorted(r[0] for r in rows)

    async def pause_queue(self, name: str, *, connection: AnyConnection | None = None) -> None:
        """Stop every worker claiming from queue ``name`` (``"*"``: every queue). Persisted;
        jobs can still be enqueued; running jobs finish."""
        await self._conn_do(connection, sql.PAUSE_QUEUE, _queue_or_star(name))

    async def resume_queue(self, name: str, *, connection: AnyConnection | None = None) -> None:
        """Undo :meth:`pause_queue` and wake the queue's workers."""
        await self._conn_do(connection, sql.RESUME_QUEUE, _queue_or_star(name))

    # ------------------------------------------------------------------ waiting

    async def wait(self, job_id: int, *, timeout: float | None = None) -> Job:  # noqa: ASYNC109
        """Wait until the job is final (completed, discarded, cancelled) and return it, with
        its ``result`` or its ``errors``. Driven by LISTEN, not by polling.
        Raises TimeoutError after ``timeout`` seconds, LookupError for an unknown job."""
        waiters = await self._listening()
        event = anyio.Event()
        waiters.events.setdefault(job_id, []).append(event)
        try:
            with anyio.fail_after(timeout):
                while True:
                    job = await self.get_job(job_id)
                    if job is None:
                        raise LookupError(f"no job {job_id}")
                    if job.state.is_final:
                        return job
                    await event.wait()
                    event = anyio.Event()
                    waiters.events.setdefault(job_id, []).append(event)
        finally:
            left = [e for e in waiters.events.get(job_id, []) if e is not event]
            if left:
                waiters.events[job_id] = left
            else:
                waiters.events.pop(job_id, None)

    async def _listening(self) -> _Waiters:
        if self._waiters is None:
            self._waiters = _Waiters()
        waiters = self._waiters
        async with waiters.lock:
            if waiters.conn is None or waiters.conn.is_closed():
                if waiters.conn is not None:
                    await self.pool.release(waiters.conn)
                waiters.conn = await self.pool.acquire()
                await waiters.conn.add_listener(sql.CHANNEL_DONE, waiters.on_done)
                # A reconnect may have missed notifications: let every waiter re-read.
                for events in waiters.events.values():
                    for e in events:
                        e.set()
        return waiters

    async def _close_waiters(self) -> None:
        if self._waiters is not None and self._waiters.conn is not None:
            conn, self._waiters.conn = self._waiters.conn, None
            await conn.remove_listener(sql.CHANNEL_DONE, self._waiters.on_done)
            await self.pool.release(conn)

    # ------------------------------------------------------------------ reads

    async def get_job(self, job_id: int, *, connection: AnyConnection | None = None) -> Job | None:
        """The job with ``job_id``, or None."""
        rows = await self._conn_do(connection, sql.GET_JOB, job_id)
        return job_from_record(rows[0]) if rows else None

    async def list_jobs(
        self,
        *,
        state: JobState | str | None = None,
        queue: str | None = None,
        task: str | None = None,
        limit: int = 50,
    ) -> list[Job]:
        """The newest jobs matching the filters."""
        rows = await self._conn_do(
            None, sql.LIST_JOBS, JobState(state).value if state else None, queue, task, limit
        )
        return [job_from_record(r) for r in rows]

    async def count_by_state(self, queue: str | None = None) -> dict[JobState, int]:
        """How many jobs are in each state (all queues, or one)."""
        rows = await self._conn_do(None, sql.COUNT_BY_STATE, queue)
        counts = dict.fromkeys(JobState, 0)
        counts.update({JobState(r[0]): r[1] for r in rows})
        return counts

    async def list_queues(self) -> list[QueueInfo]:
        """Every queue known from jobs, producers or pause settings."""
        rows = await self._conn_do(None, sql.LIST_QUEUES)
        return [
            QueueInfo(
                r["name"],
                r["paused_at"] is not None,
                r["paused_at"],
                r["available"],
                r["running"],
                r["producers"],
            )
            for r in rows
        ]

    async def stats(self) -> list[QueueStats]:
        """Per queue: counts by state, oldest available job's age, last minute's throughput."""
        by_queue: dict[str, QueueStats] = {}
        async with self.pool.acquire() as conn:
            for queue, state, n in await conn.fetch(sql.STATS_BY_QUEUE):
                by_queue.setdefault(queue, QueueStats(queue)).counts[JobState(state)] = n
            for r in await conn.fetch(sql.STATS_EXTRA):
                st = by_queue.setdefault(r["queue"], QueueStats(r["queue"]))
                st.oldest_available_s = r["oldest_available_s"]
                st.completed_last_minute = r["completed_last_minute"]
                st.finished_last_minute = r["finished_last_minute"]
        return [by_queue[q] for q in sorted(by_queue)]


def _queue_or_star(name: str) -> str:
    return name if name == "*" else check_queue_name(name)
