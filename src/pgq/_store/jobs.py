"""Jobs as clients see them: enqueue (one, many, COPY), read, cancel, retry."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import anyio
import asyncpg
from asyncpg.pool import PoolConnectionProxy

from pgq._store import enqueue, sql
from pgq._store.codec import NewJob, job_from_row
from pgq._store.connections import Connection, Db, Pool, Record
from pgq._store.enqueue import AsyncpgDriver, copied_jobs, copy_plan, copy_records, run
from pgq.job import Job, JobState

#: The partial unique index that holds unique keys (schema.py).
UNIQUE_INDEX = "pgq_jobs_unique_idx"


def by_copy(rows: Sequence[NewJob], own_connection: bool) -> bool:
    """Whether ``rows`` are written by COPY rather than an INSERT: a batch without unique
    keys or parents, on pgq's own connection (COPY's binary format relies on the
    connection's jsonb codec, which a caller's may have replaced). The one decision of the
    asynchronous and synchronous clients alike."""
    return (
        own_connection
        and len(rows) > 1
        and all(r.unique_key is None and r.depends_on is None for r in rows)
    )


async def write(conn: Connection, rows: list[NewJob], *, own_connection: bool) -> list[Job]:
    """Enqueue ``rows`` on ``conn`` by COPY or INSERT (see :func:`by_copy`)."""
    if by_copy(rows, own_connection):
        return await copy(conn, rows)
    return await insert(conn, rows)


async def insert(conn: Connection, rows: list[NewJob]) -> list[Job]:
    """Enqueue ``rows`` with one INSERT (see ``enqueue.insert``), in ``conn``'s transaction."""
    return await run(AsyncpgDriver(conn), enqueue.insert(rows))


async def insert_chain(conn: Connection, rows: list[NewJob]) -> list[Job]:
    """Enqueue ``rows``, each depending on the one before, in one transaction."""
    return await run(AsyncpgDriver(conn), enqueue.insert_chain(rows))


async def insert_group(
    conn: Connection, members: list[NewJob], callback: NewJob
) -> tuple[list[Job], Job]:
    """Enqueue ``members`` and ``callback``, which depends on all of them, in one
    transaction."""
    return await run(AsyncpgDriver(conn), enqueue.insert_group(members, callback))


async def copy(conn: Connection, rows: list[NewJob]) -> list[Job]:
    """Enqueue keyless ``rows`` with COPY, in a transaction of its own. Only on pgq's own
    connections: COPY's binary format relies on the connection's jsonb codec, and a
    caller's connection may have registered another."""
    plain, due = copy_plan(rows)
    # The transaction's enter and exit called by hand, so that the exit (the commit) can run
    # as a task while the jobs are built; entered, it is a managed one, as in `async with`.
    transaction = conn.transaction()
    await transaction.__aenter__()
    try:
        allocated = await conn.fetchrow(sql.ALLOCATE_JOBS, len(rows), list(due), list(due.values()))
        assert allocated is not None
        ids, now = allocated["ids"], allocated["now"]
        await _copy_rows(conn, rows, ids, now, plain)
    except BaseException as exc:
        # Shielded: under a cancel scope, the rollback would be cancelled in turn.
        with anyio.CancelScope(shield=True), anyio.move_on_after(CLEANUP_S):
            await transaction.__aexit__(type(exc), exc, exc.__traceback__)  # rolls back
        raise
    return await _commit_building(transaction, lambda: copied_jobs(rows, ids, now, plain))


#: Jobs of a plain batch prepared between two turns of the event loop (see copy_preparing).
PREPARE_CHUNK = 250


@dataclass(slots=True)
class PlainBatch:
    """A batch of ``size`` jobs all due now, without tags, metadata, keys, limits or parents
    (see :func:`copy_plan`), in ``queues``, not yet prepared: ``prepare(start, stop)``
    checks and serializes jobs ``start`` to ``stop`` (it may raise). ``rows`` holds those
    prepared so far."""

    size: int
    queues: list[str]
    prepare: Callable[[int, int], list[NewJob]]
    rows: list[NewJob] = field(default_factory=list)


#: The longest a failed enqueue waits to roll back and hand its connection back.
CLEANUP_S = 5.0


async def copy_preparing(pool: Pool, batch: PlainBatch) -> list[Job]:
    """:func:`copy` of a plain ``batch`` on a connection of ``pool``, prepared meanwhile:
    taking the connection, the transaction's BEGIN and the ids' allocation (two round
    trips, which need only the batch's size and queues) go on while the jobs are prepared,
    ``PREPARE_CHUNK`` at a time between turns of the event loop. A job that fails to
    prepare raises its own error, whatever became of the rest, and writes nothing: the
    transaction is rolled back (the ids it drew are left unused, a gap as a rollback
    leaves); a batch still waiting for a connection stops waiting."""
    begun = _Begun(pool, batch)
    allocating = asyncio.ensure_future(begun.allocate())
    try:
        rows = await _prepare_meanwhile(batch, begun, allocating)
        ids, now = await allocating
        assert begun.conn is not None
        await _copy_rows(begun.conn, rows, ids, now, True)
    except BaseException as exc:
        with anyio.CancelScope(shield=True), anyio.move_on_after(CLEANUP_S):
            allocating.cancel()  # nothing if it has ended
            with contextlib.suppress(BaseException):
                await allocating
            await begun.roll_back(exc)
        raise
    try:
        assert begun.transaction is not None
        return await _commit_building(begun.transaction, lambda: copied_jobs(rows, ids, now, True))
    finally:
        await begun.release()


async def _prepare_meanwhile(
    batch: PlainBatch, begun: _Begun, allocating: asyncio.Future[tuple[list[int], datetime]]
) -> list[NewJob]:
    """Prepare ``batch`` while ``allocating`` runs. A job that fails to prepare lets the
    allocation end first (cutting it short would cost the server a cancel request) unless it
    is still waiting for a connection."""
    rows = batch.rows
    try:
        for start in range(0, batch.size, PREPARE_CHUNK):
            await asyncio.sleep(0)  # the allocation's replies are read, its next step sent
            rows += batch.prepare(start, min(batch.size, start + PREPARE_CHUNK))
    except Exception:
        if begun.conn is None:
            allocating.cancel()
        with anyio.CancelScope(shield=True), anyio.move_on_after(CLEANUP_S):
            with contextlib.suppress(BaseException):
                await allocating
        raise
    return rows


class _Begun:
    """A plain batch's connection and transaction, taken and begun while its jobs are
    prepared."""

    def __init__(self, pool: Pool, batch: PlainBatch) -> None:
        self._pool = pool
        self._batch = batch
        self.conn: PoolConnectionProxy[Record] | None = None
        self.transaction: asyncpg.transaction.Transaction | None = None
        self._started = False

    async def allocate(self) -> tuple[list[int], datetime]:
        """Take a connection, begin the transaction, draw the ids: (ids, the clock)."""
        self.conn = await self._pool.acquire()
        self.transaction = self.conn.transaction()
        await self.transaction.__aenter__()  # a managed transaction, as in copy()
        self._started = True
        queues = self._batch.queues
        allocated = await self.conn.fetchrow(
            sql.ALLOCATE_JOBS, self._batch.size, queues, [None] * len(queues)
        )
        assert allocated is not None
        return allocated["ids"], allocated["now"]

    async def roll_back(self, exc: BaseException) -> None:
        """Roll back (if begun) and hand the connection back. What fails here is not what
        the caller sees: ``exc`` is (the pool resets or closes a connection it could not
        clean)."""
        try:
            if self._started and self.transaction is not None:
                with contextlib.suppress(Exception):
                    await self.transaction.__aexit__(type(exc), exc, exc.__traceback__)
        finally:
            await self.release()

    async def release(self) -> None:
        if self.conn is not None:
            conn, self.conn = self.conn, None
            with contextlib.suppress(Exception):
                await self._pool.release(conn)


async def _copy_rows(
    conn: Connection, rows: list[NewJob], ids: Sequence[int], now: datetime, plain: bool
) -> None:
    await conn.copy_records_to_table(
        sql.COPY_JOBS_TABLE,
        records=copy_records(rows, ids, now, plain),
        columns=sql.COPY_JOBS_COLUMNS[: 6 if plain else None],
    )


async def _commit_building(
    transaction: asyncpg.transaction.Transaction, build: Callable[[], list[Job]]
) -> list[Job]:
    """Commit ``transaction`` (entered by hand) and return what ``build`` makes meanwhile:
    the commit waits for the server to flush its log to disk, and the jobs are returned only
    once it has succeeded."""
    committing = asyncio.ensure_future(transaction.__aexit__(None, None, None))
    try:
        await asyncio.sleep(0)  # the commit's task runs first: its COMMIT is sent
        jobs = build()
    except BaseException:
        # Stopped before the commit is awaited (a cancel landing at the sleep): the stop
        # reaches the COMMIT, as it would have had the commit itself been awaited, and it is
        # what the caller sees, whatever the commit's own end.
        committing.cancel()
        with contextlib.suppress(BaseException):
            await committing
        raise
    await committing  # a cancel landing here reaches the COMMIT too (awaiting a task does)
    return jobs


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
_RETRY_TRIES = 3


async def _retry(conn: Connection, job_ids: list[int]) -> list[int]:
    # The statement leaves out jobs whose key is held, but a job enqueued with that key
    # between its check and its write still collides: the statement runs again (in a
    # savepoint inside a caller's transaction, which survives) and then sees that job.
    for tries_left in reversed(range(_RETRY_TRIES)):
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
