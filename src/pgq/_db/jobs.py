"""Jobs as clients see them: read, cancel, retry (the enqueue is ``enqueue.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import asyncpg

from pgq._db import sql
from pgq._db.codec import job_from_row
from pgq._db.connections import Connection, Db, Record
from pgq.job import Job, JobState

#: The partial unique index that holds unique keys (schema.py).
UNIQUE_INDEX = "pgq_jobs_unique_idx"


async def get(db: Db, job_id: int) -> Job | None:
    """The job with ``job_id``, or None."""
    row = await db.fetchrow(sql.GET_JOB, job_id)
    return job_from_row(row) if row is not None else None


async def parents(db: Db, parent_ids: Sequence[int]) -> list[Job]:
    """The jobs with ``parent_ids``, in that order (those that no longer exist left out)."""
    return [job_from_row(r) for r in await db.fetch(sql.PARENT_JOBS, list(parent_ids))]


async def list_jobs(
    db: Db,
    *,
    states: Sequence[JobState] | None = None,
    queue: str | None = None,
    task: str | None = None,
    args_contain: str | None = None,
    limit: int,
) -> list[Job]:
    """The newest jobs matching the filters (``args_contain``: JSON text of an object the
    args must contain)."""
    rows = await db.fetch(
        sql.LIST_JOBS,
        [s.value for s in states] if states is not None else None,
        queue,
        task,
        limit,
        args_contain,
    )
    return [job_from_row(r) for r in rows]


async def ids_matching(
    db: Db,
    *,
    states: Sequence[JobState] | None = None,
    queue: str | None = None,
    task: str | None = None,
) -> list[int]:
    """The ids of every job matching the filters, oldest first."""
    rows = await db.fetch(
        sql.MATCHING_IDS, [s.value for s in states] if states is not None else None, queue, task
    )
    return [r["id"] for r in rows]


async def attempted_since(db: Db, since: datetime) -> list[Job]:
    """Every job attempted at or after ``since`` (database time), as it is now."""
    return [job_from_row(r) for r in await db.fetch(sql.JOBS_ATTEMPTED_SINCE, since)]


async def count_by_state(db: Db, queue: str | None) -> dict[JobState, int]:
    """How many jobs are in each state (all queues, or one)."""
    counts = dict.fromkeys(JobState, 0)
    counts.update({JobState(r["state"]): r["n"] for r in await db.fetch(sql.COUNT_BY_STATE, queue)})
    return counts


async def cancel(db: Db, job_ids: list[int]) -> dict[int, JobState]:
    """Cancel jobs not yet running, request it of running ones; returns each acted-on job's
    state now."""
    return {r["id"]: JobState(r["state"]) for r in await db.fetch(sql.CANCEL_JOBS, job_ids)}


async def retry(db: Db, job_ids: list[int]) -> list[int]:
    """Make finished, retryable or scheduled jobs available now; returns the ids changed.

    A finished job whose unique key another job took after it finished is left as it is:
    made available, it would hold the key twice (see ``sql.RETRY_JOBS``)."""
    if isinstance(db, asyncpg.Pool):
        async with db.acquire() as conn:
            return await _retry(conn, job_ids)
    return await _retry(db, job_ids)


#: How many times a retry runs when a job enqueued meanwhile takes a key it would take.
RETRY_TRIES = 3


async def _retry(conn: Connection, job_ids: list[int]) -> list[int]:
    # The statement leaves out jobs whose key is held, but a job enqueued with that key
    # between its check and its write still collides: the statement runs again (in a
    # savepoint inside a caller's transaction, which survives) and then sees that job.
    for tries_left in reversed(range(RETRY_TRIES)):
        try:
            rows = await _in_savepoint(conn, sql.RETRY_JOBS, job_ids)
        except asyncpg.UniqueViolationError as e:
            if e.constraint_name != UNIQUE_INDEX or not tries_left:
                raise
        else:
            return sorted(r["id"] for r in rows)
    raise AssertionError("unreachable: the last try returns or raises")


async def _in_savepoint(conn: Connection, query: str, *args: Any) -> list[Record]:
    """``fetch``; inside a transaction (the caller's, however it was begun) in a
    savepoint, so that a statement that fails does not abort the transaction."""
    if not conn.is_in_transaction():
        return await conn.fetch(query, *args)
    await conn.execute("SAVEPOINT pgq_statement")
    try:
        rows = await conn.fetch(query, *args)
    except asyncpg.PostgresError:
        await conn.execute("ROLLBACK TO SAVEPOINT pgq_statement")
        await conn.execute("RELEASE SAVEPOINT pgq_statement")
        raise
    await conn.execute("RELEASE SAVEPOINT pgq_statement")
    return rows
