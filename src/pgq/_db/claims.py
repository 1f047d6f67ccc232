"""The worker's hot path: claim jobs, write their outcomes (fenced, in batches, or by the
task itself in its own transaction), and the checks of a worker that runs only until
nothing is left."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from pgq._db import sql
from pgq._db.codec import RowLike, jobs_from_claim
from pgq._db.connections import Connection, Db
from pgq._db.drivers import AsyncDriver
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
    db: Db,
    plan: ClaimPlan,
    producer_id: uuid.UUID,
    worker_name: str,
    limit: int,
    *,
    async_commit: bool = False,
) -> list[Job]:
    """Claim up to ``limit`` available jobs of ``plan.queue`` for ``producer_id`` of worker
    ``worker_name``; with ``async_commit``, committed without waiting for the WAL's flush."""
    rows = await db.fetch(
        sql.CLAIM_JOBS,
        plan.queue,
        plan.tasks,
        limit,
        producer_id,
        plan.timeouts,
        plan.max_attempts,
        worker_name,
        async_commit,
    )
    return jobs_from_claim(rows, plan.queue, producer_id, worker_name)


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """A queue's flow-control limits: at most ``concurrency`` jobs running across all
    workers, at most ``rate_count`` started per ``rate_period_s`` seconds (sliding); and the
    same for each limit key of its jobs (``key_*``)."""

    concurrency: int | None = None
    rate_count: int | None = None
    rate_period_s: float | None = None
    key_concurrency: int | None = None
    key_rate_count: int | None = None
    key_rate_period_s: float | None = None

    @property
    def limited(self) -> bool:
        """Whether any limit is set."""
        return self.concurrency is not None or self.rate_count is not None or self.keyed

    @property
    def keyed(self) -> bool:
        """Whether a per-key limit is set."""
        return self.key_concurrency is not None or self.key_rate_count is not None

    def describe(self) -> str:
        """The limits in a few words ("4 at once, 100/60s; per key: 1 at once"), or "-"."""
        whole = _describe(self.concurrency, self.rate_count, self.rate_period_s)
        per_key = _describe(self.key_concurrency, self.key_rate_count, self.key_rate_period_s)
        if per_key:
            return f"{whole}; per key: {per_key}" if whole else f"per key: {per_key}"
        return whole or "-"


def _describe(concurrency: int | None, count: int | None, period: float | None) -> str:
    parts = [f"{concurrency} at once"] if concurrency is not None else []
    if count is not None and period is not None:
        parts.append(f"{count}/{period:g}s")
    return ", ".join(parts)


def limits_from_row(row: RowLike) -> QueueLimits:
    """The limits in a row with the columns of ``sql.QUEUE_LIMITS``."""
    return QueueLimits(
        row["concurrency"],
        row["rate_count"],
        row["rate_period_s"],
        row["key_concurrency"],
        row["key_rate_count"],
        row["key_rate_period_s"],
    )


async def queue_limits(db: Db, queue: str) -> QueueLimits:
    """The limits stored for ``queue`` (none when it has no row)."""
    row = await db.fetchrow(sql.QUEUE_LIMITS, queue)
    return limits_from_row(row) if row is not None else QueueLimits()


async def claim_limited(
    db: Db,
    plan: ClaimPlan,
    producer_id: uuid.UUID,
    worker_name: str,
    limit: int,
    *,
    ahead: int = 0,
    async_commit: bool = False,
) -> tuple[list[Job], bool, QueueLimits]:
    """Claim from a queue with limits: under its row's lock, at most ``limit`` jobs (the
    free slots) and ``ahead`` more (to start as slots free), and no more than its limits
    leave (running jobs of every worker, starts within the window; with per-key limits, the
    same for each key); jobs ahead only out of half the room left beyond the free slots'
    part. One round trip, in a transaction of its own: ``db`` must not be in one. Returns
    the jobs, whether the limits held the claim back (jobs were left that a limit kept),
    and the limits as read under the lock."""
    row = await db.fetchrow(
        sql.CLAIM_LIMITED,
        plan.queue,
        plan.tasks,
        limit,
        ahead,
        producer_id,
        plan.timeouts,
        plan.max_attempts,
        worker_name,
        KEYLESS_SEARCH,
        async_commit,
    )
    assert row is not None  # one row, always
    # The jobs come as an array of records, each in CLAIM_JOBS' columns.
    jobs = jobs_from_claim(row["jobs"], plan.queue, producer_id, worker_name)
    return jobs, row["held_back"], limits_from_row(row)


#: In a queue with per-key limits, jobs without a key are looked for among this many of
#: its next available jobs (they have no index of their own).
KEYLESS_SEARCH = 1_000


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


@dataclass(frozen=True, slots=True)
class Written:
    """What a batch of outcomes did: the ids the fence let through (each with the state
    written), and those passed over because their row was locked elsewhere (neither
    written nor rejected: to be written on their own, after :func:`lock_job`)."""

    states: dict[int, str]
    passed_over: list[int]


async def complete_successes(
    db: Db,
    ids: Sequence[int],
    tokens: Sequence[uuid.UUID | None],
    results: Sequence[str | None],
    *,
    async_commit: bool = False,
    skip_locked: bool = False,
    lock_wait_ms: int | None = None,
) -> Written:
    """Mark jobs completed (with their results). With ``async_commit``, committed without
    waiting for the WAL's flush (so are the other outcome writes below). A row locked
    elsewhere is waited for (``lock_wait_ms`` at most, then ``asyncpg.LockNotAvailableError``;
    None: as long as the session's ``lock_timeout``), or with ``skip_locked`` passed over at
    once (so are those of the other writes below)."""
    payload = _done_payload([str(i) for i in ids])
    # One row, its ids in one array: a row per job would cost a record each to build and
    # read. Without results, no array of NULLs.
    if results.count(None) == len(results):
        row = await db.fetchrow(
            sql.COMPLETE_SUCCESSES_NO_RESULT,
            ids,
            tokens,
            payload,
            skip_locked,
            async_commit,
            _wait(lock_wait_ms),
        )
    else:
        row = await db.fetchrow(
            sql.COMPLETE_SUCCESSES,
            ids,
            tokens,
            results,
            payload,
            skip_locked,
            async_commit,
            _wait(lock_wait_ms),
        )
    assert row is not None
    return Written(dict.fromkeys(row[0], "completed"), row[1])


async def write_outcomes(
    db: Db,
    outcomes: Sequence[OutcomeRow],
    *,
    async_commit: bool = False,
    skip_locked: bool = False,
    lock_wait_ms: int | None = None,
) -> Written:
    """Write outcomes of any kind (a state written may be ``cancelled`` where a cancel
    request turned a retry or hand-back)."""
    rows = await db.fetch(
        sql.COMPLETE_JOBS,
        [o.job_id for o in outcomes],
        [o.token for o in outcomes],
        [o.state for o in outcomes],
        [o.delay_s for o in outcomes],
        [o.error for o in outcomes],
        [o.result for o in outcomes],
        [o.attempt_delta for o in outcomes],
        skip_locked,
        async_commit,
        _wait(lock_wait_ms),
    )
    return Written(
        {r["id"]: r["state"] for r in rows if r["state"] is not None},
        [r["id"] for r in rows if r["state"] is None],
    )


def _wait(ms: int | None) -> str | None:
    return None if ms is None else f"{int(ms)}ms"


async def lock_job(conn: Connection, job_id: int) -> None:
    """Wait for job ``job_id``'s row and hold it until the transaction open on ``conn``
    ends (an outcome passed over by its batch, written next)."""
    await conn.execute(sql.LOCK_JOB, job_id)


async def fail_attempt(
    db: Db, job_id: int, token: uuid.UUID | None, error: str, *, async_commit: bool = False
) -> bool:
    """Record the attempt as failed with ``error`` (an error entry); returns whether the
    fence let it through."""
    return await db.fetchrow(sql.FAIL_ATTEMPT, job_id, token, error, async_commit) is not None


# --------------------------------------------------------------------------- in a task's transaction
# An attempt's outcome written by the task itself, in its own transaction: fenced on the
# attempt's token, which it replaces with one the task alone knows, so the worker can tell
# afterwards whether that transaction committed.


async def write_in_transaction(
    driver: AsyncDriver,
    job_id: int,
    token: uuid.UUID | None,
    own_token: uuid.UUID,
    state: str,
    *,
    delay_s: float | None = None,
    error: str | None = None,
    result: str | None = None,
    attempt_delta: int = 0,
) -> str | None:
    """Write the outcome in ``driver``'s transaction (a caller's asyncpg or psycopg
    connection); returns the job's new state, or None when ``token`` is no longer the job's
    running attempt (nothing written)."""
    row = await driver.fetchrow(
        sql.SETTLE_ATTEMPT,
        [job_id, token, own_token, state, delay_s, error, result, attempt_delta],
    )
    return None if row is None or row["state"] is None else str(row["state"])


def write_in_transaction_sync(
    conn: Any,
    job_id: int,
    token: uuid.UUID | None,
    own_token: uuid.UUID,
    state: str,
    *,
    delay_s: float | None = None,
    error: str | None = None,
    result: str | None = None,
    attempt_delta: int = 0,
) -> str | None:
    """:func:`write_in_transaction` on a psycopg connection."""
    from pgq._db.psycopg_drivers import cursor

    with cursor(conn) as cur:
        row = cur.execute(
            sql.SETTLE_ATTEMPT,
            [job_id, token, own_token, state, delay_s, error, result, attempt_delta],
        ).fetchone()
    return None if row is None else str(row["state"])


async def in_transaction_token(db: Db, job_id: int, tokens: list[uuid.UUID]) -> uuid.UUID | None:
    """Which of ``tokens`` job ``job_id`` holds (the transaction that wrote its outcome with that
    token committed), or None."""
    token: uuid.UUID | None = await db.fetchval(sql.SETTLED_BY, job_id, tokens)
    return token


async def cancel_requested(db: Db, running: list[int]) -> set[int]:
    """Which of the ``running`` job ids have a cancel request."""
    return {r["id"] for r in await db.fetch(sql.CANCEL_REQUESTED, running)}


@dataclass(frozen=True, slots=True)
class Leftovers:
    """What a burst worker must still wait for in one queue."""

    runnable: bool
    orphaned: bool


async def leftovers(
    db: Db,
    plan: ClaimPlan,
    fencing_bound: float,
    stable_name: str | None = None,
    own_ids: Sequence[uuid.UUID] = (),
    silent_since: datetime | None = None,
) -> Leftovers:
    """Whether ``plan``'s queue holds jobs its producer could run now, or jobs running
    under a producer gone or silent past ``fencing_bound`` seconds (to be rescued), or,
    for a worker with a ``stable_name``, under another producer of that name than its own
    ``own_ids`` that has not beaten since ``silent_since`` (its previous run's, which it
    takes over)."""
    row = await db.fetchrow(
        sql.RUNNABLE_LEFT,
        plan.queue,
        plan.tasks,
        fencing_bound,
        stable_name,
        list(own_ids),
        silent_since,
    )
    assert row is not None
    return Leftovers(row["runnable"], row["orphaned"])


def _done_payload(ids: list[str], per_notification: int = 500) -> list[str]:
    # NOTIFY payloads stop at 8000 bytes: 500 ids a notification stays well under.
    return [",".join(ids[i : i + per_notification]) for i in range(0, len(ids), per_notification)]
