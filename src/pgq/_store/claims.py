"""The worker's hot path: claim jobs, write their outcomes (fenced), and the checks of a
worker that runs only until nothing is left."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from pgq._store import sql
from pgq._store.connections import Db, Pool
from pgq._store.rows import job_from_row
from pgq.job import Job


@dataclass(frozen=True, slots=True)
class ClaimPlan:
    """What a producer claims: its queue, and per registered task its timeout (for the
    rescuer of hung jobs) and max_attempts (for jobs enqueued without one)."""

    queue: str
    tasks: tuple[str, ...]
    timeouts: tuple[float | None, ...]
    max_attempts: tuple[int, ...]


async def claim(
    db: Db, plan: ClaimPlan, producer_id: uuid.UUID, worker_name: str, limit: int
) -> list[Job]:
    """Claim up to ``limit`` available jobs of ``plan.queue`` for ``producer_id`` of worker
    ``worker_name``."""
    rows = await db.fetch(
        sql.CLAIM_JOBS,
        plan.queue,
        plan.tasks,
        limit,
        producer_id,
        plan.timeouts,
        plan.max_attempts,
        worker_name,
    )
    return [job_from_row(r) for r in rows]


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """A queue's flow-control limits: at most ``concurrency`` jobs running across all
    workers, at most ``rate_count`` started per ``rate_period_s`` seconds (sliding)."""

    concurrency: int | None = None
    rate_count: int | None = None
    rate_period_s: float | None = None

    @property
    def limited(self) -> bool:
        """Whether any limit is set."""
        return self.concurrency is not None or self.rate_count is not None


async def queue_limits(db: Db, queue: str) -> QueueLimits:
    """The limits stored for ``queue`` (none when it has no row)."""
    row = await db.fetchrow(sql.QUEUE_LIMITS, queue)
    if row is None:
        return QueueLimits()
    return QueueLimits(row["concurrency"], row["rate_count"], row["rate_period_s"])


async def claim_limited(
    pool: Pool, plan: ClaimPlan, producer_id: uuid.UUID, worker_name: str, limit: int
) -> tuple[list[Job], bool, QueueLimits]:
    """Claim from a queue with limits: under its row's lock, at most ``limit`` jobs and no
    more than its limits leave (running jobs of every worker, starts within the window).
    Returns the jobs, whether the limits held the claim back (it took all they allowed,
    less than ``limit``), and the limits as read under the lock."""
    async with pool.acquire() as conn, conn.transaction():
        row = await conn.fetchrow(sql.LOCK_LIMITED_QUEUE, plan.queue)
        limits = QueueLimits(*row) if row is not None else QueueLimits()
        period = limits.rate_period_s or 0.0
        usage = await conn.fetchrow(sql.LIMIT_USAGE, plan.queue, period)
        assert usage is not None  # one row, always
        budget = limit
        if limits.concurrency is not None:
            budget = min(budget, limits.concurrency - usage["running"])
        if limits.rate_count is not None:
            budget = min(budget, limits.rate_count - usage["started"])
        if budget <= 0:
            return [], True, limits
        rows = await conn.fetch(
            sql.CLAIM_LIMITED,
            plan.queue,
            plan.tasks,
            budget,
            producer_id,
            plan.timeouts,
            plan.max_attempts,
            worker_name,
        )
        if rows and limits.rate_count is not None:
            await conn.execute(sql.LOG_STARTS, plan.queue, len(rows), period)
    held_back = budget < limit and len(rows) == budget
    return [job_from_row(r) for r in rows], held_back, limits


class OutcomeRow(Protocol):
    """One outcome as the outcome statements take it; ``(job_id, token)`` fences it."""

    @property
    def job_id(self) -> int: ...
    @property
    def token(self) -> uuid.UUID | None: ...
    @property
    def state(self) -> str: ...
    @property
    def delay_s(self) -> float | None: ...
    @property
    def error(self) -> str | None: ...
    @property
    def result(self) -> str | None: ...
    @property
    def attempt_delta(self) -> int: ...


async def complete_successes(
    db: Db, ids: Sequence[int], tokens: Sequence[uuid.UUID | None], results: Sequence[str | None]
) -> set[int]:
    """Mark jobs completed (with their results); returns the ids the fence let through."""
    rows = await db.fetch(
        sql.COMPLETE_SUCCESSES, ids, tokens, results, _done_payload([str(i) for i in ids])
    )
    return {r["id"] for r in rows}


async def write_outcomes(db: Db, outcomes: Sequence[OutcomeRow]) -> set[int]:
    """Write outcomes of any kind; returns the ids the fence let through."""
    rows = await db.fetch(
        sql.COMPLETE_JOBS,
        [o.job_id for o in outcomes],
        [o.token for o in outcomes],
        [o.state for o in outcomes],
        [o.delay_s for o in outcomes],
        [o.error for o in outcomes],
        [o.result for o in outcomes],
        [o.attempt_delta for o in outcomes],
    )
    return {r["id"] for r in rows}


async def fail_attempt(db: Db, job_id: int, token: uuid.UUID | None, error: str) -> bool:
    """Record the attempt as failed with ``error`` (an error entry); returns whether the
    fence let it through."""
    return await db.fetchrow(sql.FAIL_ATTEMPT, job_id, token, error) is not None


async def cancel_requested(db: Db, running: list[int]) -> set[int]:
    """Which of the ``running`` job ids have a cancel request."""
    return {r["id"] for r in await db.fetch(sql.CANCEL_REQUESTED, running)}


@dataclass(frozen=True, slots=True)
class Leftovers:
    """What a burst worker must still wait for in one queue."""

    runnable: bool
    orphaned: bool


async def leftovers(db: Db, plan: ClaimPlan, fencing_bound: float) -> Leftovers:
    """Whether ``plan``'s queue holds jobs its producer could run now, or jobs running
    under a producer gone or silent past ``fencing_bound`` seconds (to be rescued)."""
    row = await db.fetchrow(sql.RUNNABLE_LEFT, plan.queue, plan.tasks, fencing_bound)
    assert row is not None
    return Leftovers(row["runnable"], row["orphaned"])


def _done_payload(ids: list[str], per_notification: int = 500) -> list[str]:
    # NOTIFY payloads stop at 8000 bytes: 500 ids a notification stays well under.
    return [",".join(ids[i : i + per_notification]) for i in range(0, len(ids), per_notification)]
