"""Queues: pause and resume, and the operator's views (lists, stats)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from pgq._db import sql
from pgq._db.claims import QueueLimits, limits_from_row
from pgq._db.connections import Db
from pgq.job import JobState


async def known(db: Db, name: str) -> bool:
    """Whether a setting, a job or a producer names queue ``name``."""
    return bool(await db.fetchval(sql.QUEUE_KNOWN, name))


async def pause(db: Db, name: str) -> None:
    """Pause queue ``name`` (``*``: every queue) and tell its workers."""
    await db.execute(sql.PAUSE_QUEUE, name)


async def resume(db: Db, name: str) -> None:
    """Resume queue ``name`` and wake its workers."""
    await db.execute(sql.RESUME_QUEUE, name)


async def set_limits(db: Db, name: str, limits: QueueLimits) -> None:
    """Store queue ``name``'s limits (None: no such limit) and tell its workers."""
    await db.execute(
        sql.SET_QUEUE_LIMITS,
        name,
        limits.concurrency,
        limits.rate_count,
        limits.rate_period_s,
        limits.key_concurrency,
        limits.key_rate_count,
        limits.key_rate_period_s,
    )


@dataclass(slots=True)
class QueueInfo:
    """A queue as ``pgq queues list`` shows it."""

    name: str
    paused: bool
    paused_at: datetime | None
    available: int
    running: int
    producers: int
    #: Flow-control limits (docs/flow-control.md).
    limits: QueueLimits = field(default_factory=QueueLimits)

    @property
    def concurrency(self) -> int | None:
        """The queue's concurrency limit (``limits.concurrency``)."""
        return self.limits.concurrency

    @property
    def rate_count(self) -> int | None:
        """The queue's rate limit's count (``limits.rate_count``)."""
        return self.limits.rate_count

    @property
    def rate_period_s(self) -> float | None:
        """The queue's rate limit's period (``limits.rate_period_s``)."""
        return self.limits.rate_period_s


async def list_queues(db: Db) -> list[QueueInfo]:
    """Every queue known from jobs, producers or pause settings."""
    return [
        QueueInfo(
            r["name"],
            r["paused_at"] is not None,
            r["paused_at"],
            r["available"],
            r["running"],
            r["producers"],
            limits_from_row(r),
        )
        for r in await db.fetch(sql.LIST_QUEUES)
    ]


@dataclass(slots=True)
class QueueStats:
    """Counts of one queue by state, the age of its oldest available job and its
    throughput over the last minute."""

    queue: str
    counts: dict[JobState, int] = field(default_factory=lambda: dict.fromkeys(JobState, 0))
    oldest_available_s: float | None = None
    completed_last_minute: int = 0
    finished_last_minute: int = 0
    #: Available jobs no live worker of the queue serves, by task (see :func:`unrunnable`).
    unrunnable: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Unrunnable:
    """Jobs of one task waiting on a queue whose live workers do not serve that task."""

    queue: str
    task: str
    count: int
    #: Seconds since the oldest of them was due.
    oldest_s: float


async def unrunnable(db: Db, stale_after_s: float, due_for_s: float) -> list[Unrunnable]:
    """Available jobs due for longer than ``due_for_s`` whose task no live producer of their
    queue serves (producers judged by their own ``stale_after``, ``stale_after_s`` for rows
    that recorded none), by queue and task."""
    rows = await db.fetch(sql.UNRUNNABLE_JOBS, stale_after_s, due_for_s)
    return [Unrunnable(r["queue"], r["task"], r["n"], float(r["oldest_s"])) for r in rows]


async def stats(db: Db, stale_after_s: float) -> list[QueueStats]:
    """Per queue: counts by state, oldest available job's age, last minute's throughput,
    and the jobs nobody can run (due for longer than ``stale_after_s``). Every queue with
    jobs, and every one a live producer serves or that has limits or a pause, jobs or not."""
    by_queue = {
        r["name"]: QueueStats(r["name"]) for r in await db.fetch(sql.STATS_QUEUES, stale_after_s)
    }
    for r in await db.fetch(sql.STATS_BY_QUEUE):
        by_queue.setdefault(r["queue"], QueueStats(r["queue"])).counts[JobState(r["state"])] = r[
            "n"
        ]
    for r in await db.fetch(sql.STATS_EXTRA):
        st = by_queue.setdefault(r["queue"], QueueStats(r["queue"]))
        st.oldest_available_s = r["oldest_available_s"]
        st.completed_last_minute = r["completed_last_minute"]
        st.finished_last_minute = r["finished_last_minute"]
    for u in await unrunnable(db, stale_after_s, stale_after_s):
        by_queue.setdefault(u.queue, QueueStats(u.queue)).unrunnable[u.task] = u.count
    return [by_queue[q] for q in sorted(by_queue)]
