"""What an operator reads and does across many jobs: filtered pages, counts, bulk actions,
the overview's counts and the throughput rollup (the dashboard's reads; no SQL elsewhere)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

import asyncpg

from pgq._db import jobs as store_jobs
from pgq._db import sql
from pgq._db.claims import QueueLimits, limits_from_row
from pgq._db.codec import job_from_row
from pgq._db.connections import Db, Pool
from pgq.job import Job, JobState

#: Jobs one bulk statement acts on at most: short transactions, few locks at a time.
BULK_BATCH = 1000

Action = Literal["retry", "cancel", "delete"]

_STATE_NAMES = frozenset(s.value for s in JobState)


@dataclass(frozen=True, slots=True)
class JobFilter:
    """Which jobs a listing or a bulk action covers (each field None: any)."""

    states: tuple[JobState, ...] | None = None
    queue: str | None = None
    task: str | None = None
    tag: str | None = None
    #: JSON text of an object the args must contain (``{"user_id": 7}``).
    args: str | None = None
    job_id: int | None = None

    def params(self) -> list[Any]:
        """The filter's statement parameters, $1 to $6."""
        states = [s.value for s in self.states] if self.states else None
        return [states, self.queue, self.task, self.tag, self.args, self.job_id]


@dataclass(frozen=True, slots=True)
class JobPage:
    """One page of a listing, newest first.

    ``older`` is where the next page starts (pass it as ``before``), None at the end of the
    table. A page with fewer jobs than asked that still has ``older`` stopped at the edge of
    its scan window, ``scanned_to``: nothing between ``before`` and it matched beyond what is
    shown, and older jobs remain to be searched."""

    jobs: list[Job]
    older: int | None
    scanned_to: int
    window_exhausted: bool


async def page(
    pool: Pool, filt: JobFilter, *, before: int | None, limit: int, window: int
) -> JobPage:
    """Up to ``limit`` matching jobs with ids below ``before`` (None: the newest), looking at
    no more than ``window`` ids: the cost of a page is bounded whatever the filter."""
    async with pool.acquire() as conn, conn.transaction():
        bounds = await conn.fetchrow(sql.JOB_ID_BOUNDS)
        assert bounds is not None
        low, high = bounds["low"], bounds["high"]
        if high is None or (filt.job_id is not None and filt.job_id < low):
            return JobPage([], None, 0, False)
        top = min(before, high + 1) if before is not None else high + 1
        floor = max(top - window, low)
        if filt.job_id is not None:  # one id: its own window
            top, floor = min(top, filt.job_id + 1), filt.job_id
        await conn.execute(sql.LOCAL_CUSTOM_PLANS)
        rows = await conn.fetch(sql.JOBS_PAGE, *filt.params(), top, floor, limit)
    found = [job_from_row(r) for r in rows]
    if len(found) == limit:
        return JobPage(found, found[-1].id, found[-1].id, False)
    more = floor > low and filt.job_id is None
    return JobPage(found, floor if more else None, floor, more)


async def count_matching(pool: Pool, filt: JobFilter, *, up_to: int) -> int:
    """How many jobs with ids up to ``up_to`` match."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(sql.LOCAL_CUSTOM_PLANS)
        n: int = await conn.fetchval(sql.COUNT_MATCHING, *filt.params(), up_to)
    return n


async def highest_id(db: Db) -> int:
    """The highest job id (0 when there are no jobs): a bulk action's fixed upper bound, so
    jobs enqueued after its count was shown are left alone."""
    row = await db.fetchrow(sql.JOB_ID_BOUNDS)
    return int(row["high"] or 0) if row is not None else 0


async def act_on_matching(pool: Pool, filt: JobFilter, action: Action, *, up_to: int) -> int:
    """Retry, cancel or delete every matching job with an id up to ``up_to``, a batch per
    transaction; returns how many it changed (a job in a state the action does not apply to
    is skipped)."""
    changed, after = 0, 0
    while True:
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute(sql.LOCAL_CUSTOM_PLANS)
            rows = await conn.fetch(sql.MATCHING_BATCH, *filt.params(), up_to, after, BULK_BATCH)
            ids = [r["id"] for r in rows]
            if not ids:
                return changed
            changed += len(await act(conn, ids, action))
        after = ids[-1]


async def act(db: Db, ids: list[int], action: Action) -> list[int]:
    """Retry, cancel or delete ``ids``; returns the ids it changed."""
    if action == "retry":
        return await store_jobs.retry(db, ids)
    if action == "cancel":
        return sorted(await store_jobs.cancel(db, ids))
    return await delete(db, ids)


async def delete(db: Db, ids: Sequence[int]) -> list[int]:
    """Delete jobs that are not running; returns the ids deleted."""
    return sorted(r["id"] for r in await db.fetch(sql.DELETE_JOBS, list(ids)))


@dataclass(slots=True)
class StateCounts:
    """Jobs by queue and state. When counting every finished job took longer than allowed,
    ``exact`` is False: the queues hold only their unfinished states, and ``estimates``
    the planner's table-wide figure for every state."""

    by_queue: dict[str, dict[JobState, int]]
    exact: bool = True
    estimates: dict[JobState, int] = field(default_factory=dict)


async def active_counts(db: Db) -> dict[str, dict[JobState, int]]:
    """Jobs by queue in the unfinished states (cheap on any table: the partial indexes)."""
    counts: dict[str, dict[JobState, int]] = {}
    for r in await db.fetch(sql.ACTIVE_BY_QUEUE):
        counts.setdefault(r["queue"], dict.fromkeys(JobState, 0))[JobState(r["state"])] = r["n"]
    return counts


async def state_counts(pool: Pool, *, timeout_s: float) -> StateCounts:
    """Jobs by queue and state, exactly if that takes under ``timeout_s``."""
    counts: dict[str, dict[JobState, int]] = {}
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(sql.LOCAL_STATEMENT_TIMEOUT, str(max(1, int(timeout_s * 1000))))
        try:
            async with conn.transaction():  # a savepoint: a timeout leaves the rest usable
                rows = await conn.fetch(sql.STATS_BY_QUEUE)
            exact = True
        except asyncpg.QueryCanceledError:
            await conn.execute(sql.LOCAL_STATEMENT_TIMEOUT, "0")
            rows = await conn.fetch(sql.ACTIVE_BY_QUEUE)
            exact = False
        for r in rows:
            counts.setdefault(r["queue"], dict.fromkeys(JobState, 0))[JobState(r["state"])] = r["n"]
        estimates = {}
        if not exact:
            estimates = {
                JobState(r["state"]): r["n"]
                for r in await conn.fetch(sql.STATE_ESTIMATES)
                if r["state"] in _STATE_NAMES
            }
    return StateCounts(counts, exact, estimates)


@dataclass(frozen=True, slots=True)
class Minute:
    """Jobs that finished in one minute (every queue, or one)."""

    minute: datetime
    completed: int = 0
    discarded: int = 0
    cancelled: int = 0


async def throughput(db: Db, *, minutes: int, queue: str | None = None) -> list[Minute]:
    """The last ``minutes`` minutes, the current one (still filling) last, each present (zero
    when nothing finished or no leader counted it)."""
    now = await db.fetchval(sql.CURRENT_MINUTE)
    totals: dict[datetime, list[int]] = {}
    for r in await db.fetch(sql.THROUGHPUT, minutes):
        if queue is None or r["queue"] == queue:
            acc = totals.setdefault(r["minute"], [0, 0, 0])
            acc[0] += r["completed"]
            acc[1] += r["discarded"]
            acc[2] += r["cancelled"]
    slots = [now - timedelta(minutes=m) for m in range(minutes - 1, -1, -1)]
    return [Minute(m, *totals.get(m, [0, 0, 0])) for m in slots]


async def throughput_by_queue(db: Db, *, minutes: int) -> dict[str, Minute]:
    """Per queue, the jobs finished over the last ``minutes`` minutes (the current one too)."""
    now = await db.fetchval(sql.CURRENT_MINUTE)
    sums: dict[str, list[int]] = {}
    for r in await db.fetch(sql.THROUGHPUT, minutes):
        acc = sums.setdefault(r["queue"], [0, 0, 0])
        acc[0] += r["completed"]
        acc[1] += r["discarded"]
        acc[2] += r["cancelled"]
    return {q: Minute(now, *v) for q, v in sums.items()}


async def rollup_throughput(
    db: Db, *, since: datetime | None, late_s: float, backfill_s: float
) -> datetime:
    """Count the jobs finished since the start of the minute ``late_s`` before ``since``
    (the previous round's clock), but at most ``backfill_s`` back (all of it when ``since``
    is None); returns this round's clock, on the database."""
    began: datetime = await db.fetchval(sql.THROUGHPUT_ROLLUP, since, late_s, backfill_s)
    return began


async def trim_throughput(db: Db, *, keep_s: float) -> None:
    """Forget rollup minutes older than ``keep_s`` seconds."""
    await db.execute(sql.THROUGHPUT_TRIM, keep_s)


async def oldest_available(db: Db) -> dict[str, float]:
    """Per queue, the age in seconds of its oldest available job."""
    return {r["queue"]: r["age_s"] for r in await db.fetch(sql.OLDEST_AVAILABLE)}


async def queue_gauges(
    pool: Pool, *, count_timeout_s: float = 1.0
) -> tuple[StateCounts, dict[str, float]]:
    """What the queue gauges export, read now: jobs by queue and state (exactly if that takes
    under ``count_timeout_s``), and the age of each queue's oldest available job."""
    return await state_counts(pool, timeout_s=count_timeout_s), await oldest_available(pool)


async def paused_queues(db: Db) -> dict[str, datetime | None]:
    """Every queue with a setting, and when it was paused (None: not paused)."""
    return {r["name"]: r["paused_at"] for r in await db.fetch(sql.QUEUE_SETTINGS)}


async def queue_limits(db: Db) -> dict[str, QueueLimits]:
    """The limits of every queue that has some."""
    return {r["name"]: limits_from_row(r) for r in await db.fetch(sql.LIMITED_QUEUES)}


@dataclass(frozen=True, slots=True)
class RunningJobs:
    """Jobs running under one producer id, per the jobs table."""

    producer_id: Any
    count: int
    #: The producer's row is gone: these jobs wait for the leader's rescue.
    orphaned: bool


async def running_by_producer(db: Db) -> list[RunningJobs]:
    """Running jobs per producer id."""
    return [
        RunningJobs(r["producer_id"], r["n"], r["orphaned"])
        for r in await db.fetch(sql.RUNNING_BY_PRODUCER)
    ]
