"""The enqueue's control flow, written once for every driver.

Each operation (:func:`write`, :func:`insert_chain`, :func:`insert_group`) is a *plan*: a
generator that yields the statements it needs run (:class:`Fetch`, :class:`FetchRow`,
:class:`CopyJobs`, and :class:`InTransaction` for a part that must run in one transaction)
and receives their rows, deciding what comes next from them. A driver runs a plan:
:func:`run` over the ``drivers.AsyncDriver`` protocol (asyncpg, psycopg's async
connection), :func:`run_sync` over ``drivers.SyncDriver`` (psycopg). The plans do no I/O,
so every client shares them instead of each keeping a copy of the same decisions;
:func:`write` is the one choice between COPY and INSERT.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Generator, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeAlias, TypeVar

import anyio

from pgq._core.specs import NewJob
from pgq._db import sql
from pgq._db.codec import (
    RowLike,
    copied_plain,
    enqueued,
    job_from_row,
    vanished_holder,
)
from pgq._db.drivers import AsyncDriver, SyncDriver
from pgq.errors import ConfigError, PgqError
from pgq.job import Job, JobState

T = TypeVar("T")

#: The longest a failed enqueue waits to roll back (and hand its connection back).
CLEANUP_S = 5.0


@dataclass(frozen=True, slots=True)
class Fetch:
    """Run ``statement`` with ``params``; the plan receives its rows."""

    statement: str
    params: Sequence[Any]


@dataclass(frozen=True, slots=True)
class FetchRow:
    """Run ``statement`` with ``params``; the plan receives its first row (or None)."""

    statement: str
    params: Sequence[Any]


@dataclass(frozen=True, slots=True)
class InTransaction:
    """Run the plan ``plan`` in one transaction (a savepoint inside the caller's); the plan
    receives its result (of an :class:`AfterCommit`, what it builds)."""

    plan: Plan[Any]


@dataclass(frozen=True, slots=True)
class AfterCommit:
    """What a transaction's plan returns when its result is best made once the COMMIT is
    sent: ``build()``, made while the server flushes the commit (where the runner can
    overlap the two) and handed on only once the commit succeeded. ``landed`` names what
    the commit writes, for the error of a ``build()`` that fails once it may have landed."""

    build: Callable[[], Any]
    landed: str


@dataclass(frozen=True, slots=True)
class CopyJobs:
    """Write ``records`` (:func:`copy_records`) into the jobs table with COPY: six columns
    each if ``plain``, else all of ``sql.COPY_JOBS_COLUMNS``."""

    records: list[tuple[Any, ...]]
    plain: bool


Step: TypeAlias = Fetch | FetchRow | InTransaction | CopyJobs
#: A plan: yields steps, receives what each returned, returns its result.
Plan: TypeAlias = Generator[Step, Any, T]


async def run(driver: AsyncDriver, plan: Plan[T]) -> T:
    """Run ``plan`` on ``driver``; its result."""
    value: Any = None
    while True:
        try:
            step = plan.send(value)
        except StopIteration as done:
            result: T = done.value
            return result
        if isinstance(step, Fetch):
            value = await driver.fetch(step.statement, step.params)
        elif isinstance(step, FetchRow):
            value = await driver.fetchrow(step.statement, step.params)
        elif isinstance(step, InTransaction):
            value = await _in_transaction(driver, step.plan)
        else:
            await driver.copy_jobs(step.records, step.plain)
            value = None


async def _in_transaction(driver: AsyncDriver, plan: Plan[Any]) -> Any:
    """Run ``plan`` in a transaction, entered and left by hand: a failure rolls back shielded
    from a cancellation (bounded by ``CLEANUP_S``), and an :class:`AfterCommit` is built
    while the COMMIT is under way."""
    transaction = driver.transaction()
    await transaction.__aenter__()
    try:
        value = await run(driver, plan)
    except BaseException as exc:
        # Shielded: under a cancel scope, the rollback would be cancelled in turn.
        with anyio.CancelScope(shield=True), anyio.move_on_after(CLEANUP_S):
            await transaction.__aexit__(type(exc), exc, exc.__traceback__)  # rolls back
        raise
    if isinstance(value, AfterCommit):
        return await _commit_building(transaction, value)
    await transaction.__aexit__(None, None, None)
    return value


async def _commit_building(
    transaction: AbstractAsyncContextManager[Any], after: AfterCommit
) -> Any:
    """Commit ``transaction`` (entered by hand) and return what ``after.build`` makes
    meanwhile: the commit waits for the server to flush its log to disk, and the result is
    returned only once it has succeeded."""
    committing = asyncio.ensure_future(transaction.__aexit__(None, None, None))
    try:
        await asyncio.sleep(0)  # the commit's task runs first: its COMMIT is sent
        built = after.build()
    except Exception as exc:
        # The COMMIT is sent and may land: the caller learns whether it did, or a retry of
        # a batch without keys would enqueue it twice. A commit that fails raises its own
        # error (nothing was written), the build's on its context.
        await committing
        raise landed_unbuilt(after.landed, exc) from exc
    except BaseException:
        # Stopped before the commit is awaited (a cancel landing at the sleep): the stop
        # reaches the COMMIT, as it would have had the commit itself been awaited, and it is
        # what the caller sees, whatever the commit's own end.
        committing.cancel()
        with contextlib.suppress(BaseException):
            await committing
        raise
    await committing  # a cancel landing here reaches the COMMIT too (awaiting a task does)
    return built


def landed_unbuilt(landed: str, exc: Exception) -> PgqError:
    """The error of a write that committed but whose result could not be made."""
    return PgqError(
        f"{landed} were enqueued (their transaction committed), but the jobs to return could "
        f"not be made ({type(exc).__name__}: {exc}): do not enqueue them again; read them "
        "with get_job or list_jobs"
    )


def run_sync(driver: SyncDriver, plan: Plan[T]) -> T:
    """Run ``plan`` on ``driver``; its result."""
    value: Any = None
    while True:
        try:
            step = plan.send(value)
        except StopIteration as done:
            result: T = done.value
            return result
        if isinstance(step, Fetch):
            value = driver.fetch(step.statement, step.params)
        elif isinstance(step, FetchRow):
            value = driver.fetchrow(step.statement, step.params)
        elif isinstance(step, InTransaction):
            with driver.transaction():
                value = run_sync(driver, step.plan)
            if isinstance(value, AfterCommit):
                try:
                    value = value.build()
                except Exception as exc:  # committed: a retry would enqueue it twice
                    raise landed_unbuilt(value.landed, exc) from exc
        else:
            driver.copy_jobs(step.records, step.plain)
            value = None


def write(rows: list[NewJob], *, own_connection: bool) -> Plan[list[Job]]:
    """Enqueue ``rows``: the one choice between COPY (:func:`copy`) and INSERT
    (:func:`insert`). COPY writes a batch without unique keys or parents on pgq's own
    connection: in a caller's transaction, one INSERT (and a caller's asyncpg connection
    may have replaced the jsonb codec COPY's binary format relies on)."""
    if (
        own_connection
        and len(rows) > 1
        and all(r.unique_key is None and r.depends_on is None for r in rows)
    ):
        return copy(rows)
    return insert(rows)


def insert(rows: list[NewJob]) -> Plan[list[Job]]:
    """Enqueue ``rows`` with one INSERT; a row whose unique key is taken comes back as the
    job holding it, marked ``duplicate``. Works on any connection, in its transaction.
    Rows with dependencies are written one statement each, in one transaction."""
    if any(r.depends_on is not None for r in rows):
        jobs: list[Job] = yield InTransaction(_each(rows))
        return jobs
    statement, params = insert_statement(rows)
    written, duplicates = assemble(rows, (yield Fetch(statement, params)))
    if duplicates:
        holders = yield Fetch(sql.EXISTING_UNIQUE, [[k for _, k in duplicates]])
        fill_duplicates(rows, written, duplicates, holders)
    return [j for j in written if j is not None]


def _each(rows: list[NewJob]) -> Plan[list[Job]]:
    jobs: list[Job] = []
    for row in rows:
        jobs.append((yield from _insert_one(row)))
    return jobs


def _insert_one(row: NewJob) -> Plan[Job]:
    if row.depends_on is None:
        (job,) = yield from insert([row])
        return job
    params = [*row.values(), list(row.depends_on), row.on_parent_failure]
    rec = yield FetchRow(sql.ENQUEUE_DEPENDENT, params)
    assert rec is not None  # one row, always
    holder = None
    if rec["id"] is None and rec["found"] >= len(row.depends_on):
        holders = yield Fetch(sql.EXISTING_UNIQUE, [[row.unique_key]])
        holder = holders[0] if holders else None
    return dependent_job(row, rec, holder)


def insert_chain(rows: list[NewJob]) -> Plan[list[Job]]:
    """Enqueue ``rows``, each depending on the one before, in one transaction."""

    def chain() -> Plan[list[Job]]:
        jobs: list[Job] = []
        for row in rows:
            if jobs:
                chain_after(row, jobs[-1])
            jobs.append((yield from _insert_one(row)))
        return jobs

    jobs: list[Job] = yield InTransaction(chain())
    return jobs


def insert_group(members: list[NewJob], callback: NewJob) -> Plan[tuple[list[Job], Job]]:
    """Enqueue ``members`` and ``callback``, which depends on all of them, in one
    transaction."""
    if not members:
        raise ConfigError("a group needs at least one member")

    def group() -> Plan[tuple[list[Job], Job]]:
        jobs = yield from insert(members)
        group_after(callback, jobs)
        return jobs, (yield from _insert_one(callback))

    written: tuple[list[Job], Job] = yield InTransaction(group())
    return written


def copy(rows: list[NewJob]) -> Plan[list[Job]]:
    """Enqueue keyless ``rows`` with COPY, in a transaction of their own: ids and the
    clock from ``ALLOCATE_JOBS`` (which also queues the NOTIFYs), then the rows; the jobs
    are built while the commit is under way."""
    plain, due = copy_plan(rows)

    def copying() -> Plan[AfterCommit]:
        allocated = yield FetchRow(sql.ALLOCATE_JOBS, [len(rows), list(due), list(due.values())])
        assert allocated is not None
        ids, now = allocated["ids"], allocated["now"]
        yield CopyJobs(copy_records(rows, ids, now, plain), plain)
        landed = f"the {len(rows)} jobs of this batch (ids {ids[0]} to {ids[-1]}, in order)"
        return AfterCommit(lambda: copied_jobs(rows, ids, now, plain), landed)

    jobs: list[Job] = yield InTransaction(copying())
    return jobs


def dependent_job(row: NewJob, rec: RowLike, holder: RowLike | None) -> Job:
    """The job ``ENQUEUE_DEPENDENT`` wrote (or the one holding its unique key)."""
    parents = row.depends_on or ()
    if rec["found"] < len(parents):
        raise ConfigError(
            f"depends_on names jobs that do not exist (of {list(parents)}, "
            f"{len(parents) - rec['found']} not found): enqueue the parents first, and keep "
            "them until their dependents are enqueued; nothing was enqueued"
        )
    if rec["id"] is None:  # the unique key is taken
        if holder is None:
            # Unlike a batch's, a dependent's duplicate reports no metadata of its own.
            return vanished_holder(row, row.unique_key, metadata={})
        job = job_from_row(holder)
        job.duplicate = True
        return job
    return enqueued(row, rec["id"], JobState(rec["state"]), rec["scheduled_at"], rec["created_at"])


def chain_after(row: NewJob, previous: Job) -> None:
    """Make ``row`` depend on ``previous`` too."""
    row.depends_on = tuple(dict.fromkeys([*(row.depends_on or ()), previous.id]))


def group_after(callback: NewJob, members: list[Job]) -> None:
    """Make ``callback`` depend on every member (first) and its own parents."""
    callback.depends_on = tuple(
        dict.fromkeys([*(j.id for j in members), *(callback.depends_on or ())])
    )


def insert_statement(rows: list[NewJob]) -> tuple[str, list[Any]]:
    """The INSERT for ``rows`` and its parameters: scalars for one row, arrays for more."""
    if len(rows) == 1:
        return sql.ENQUEUE_ONE, list(rows[0].values())
    columns = [list(col) for col in zip(*(r.values() for r in rows), strict=True)]
    keyed = any(r.unique_key is not None for r in rows)
    return (sql.ENQUEUE_KEYED if keyed else sql.ENQUEUE_PLAIN), columns


def assemble(
    rows: list[NewJob], inserted_rows: Sequence[RowLike]
) -> tuple[list[Job | None], list[tuple[int, str]]]:
    """The jobs the INSERT wrote, in the order given, with a gap (and its key) for each row
    whose unique key was taken."""
    inserted = iter(inserted_rows)
    inserted_keys = {r["unique_key"] for r in inserted_rows if r["unique_key"] is not None}
    claimed: set[str] = set()
    jobs: list[Job | None] = []
    duplicates: list[tuple[int, str]] = []
    for i, row in enumerate(rows):
        key = row.unique_key
        # Inserted rows come back in input order (ids follow it); a key's first holder in
        # this batch is the one inserted, the rest are duplicates.
        if key is not None and (key in claimed or key not in inserted_keys):
            duplicates.append((i, key))
            jobs.append(None)
            continue
        if key is not None:
            claimed.add(key)
        rec = next(inserted)
        jobs.append(
            enqueued(row, rec["id"], JobState(rec["state"]), rec["scheduled_at"], rec["created_at"])
        )
    return jobs, duplicates


def fill_duplicates(
    rows: list[NewJob],
    jobs: list[Job | None],
    duplicates: list[tuple[int, str]],
    holders: Sequence[RowLike],
) -> None:
    """Fill each gap with the job holding its key (``EXISTING_UNIQUE`` rows)."""
    existing = {r["unique_key"]: r for r in holders}
    for i, key in duplicates:
        held = existing.get(key)
        if held is None:
            # The holder finished (and left the unique states) between our insert and this
            # read: report the key as skipped with what we know.
            jobs[i] = vanished_holder(rows[i], key)
            continue
        job = job_from_row(held)
        job.duplicate = True
        jobs[i] = job


def copy_plan(rows: list[NewJob]) -> tuple[bool, dict[str, datetime | None]]:
    """Whether every job is due now without tags or metadata (COPY then writes six columns
    and leaves the rest to their defaults), and per queue its earliest job (None: now)."""
    due: dict[str, datetime | None] = {}
    plain = True
    for r in rows:
        if r.run_at is None and not r.delay_s:
            due[r.queue] = None
            plain = plain and not r.tags and not r.metadata and r.limit_key is None
            continue
        plain = False
        if r.run_at is not None:
            earliest = due.get(r.queue, r.run_at)
            if earliest is not None:
                due[r.queue] = min(earliest, r.run_at)
    return plain, due


def _schedule(r: NewJob, now: datetime) -> tuple[JobState, datetime]:
    """The state and ``scheduled_at`` a COPY writes for ``r`` at ``now``."""
    if r.run_at is not None:
        scheduled_at = r.run_at
    elif r.delay_s:
        scheduled_at = now + timedelta(seconds=r.delay_s)
    else:
        scheduled_at = now
    return (JobState.SCHEDULED if scheduled_at > now else JobState.AVAILABLE), scheduled_at


def copy_records(
    rows: list[NewJob], ids: Sequence[int], now: datetime, plain: bool
) -> list[tuple[Any, ...]]:
    """The records a COPY writes (ids from ALLOCATE_JOBS, ``now`` its clock): of a plain
    batch (see :func:`copy_plan`), six columns each."""
    if plain:
        return [
            (job_id, r.queue, r.task, r.args_json, r.priority, r.max_attempts)
            for job_id, r in zip(ids, rows, strict=True)
        ]
    records: list[tuple[Any, ...]] = []
    for job_id, r in zip(ids, rows, strict=True):
        state, scheduled_at = _schedule(r, now)
        records.append(
            (
                job_id, r.queue, r.task, r.args_json, r.priority, r.max_attempts,
                state.value, scheduled_at, r.tags, r.metadata_json, r.limit_key,
            )
        )  # fmt: skip
    return records


def copied_jobs(rows: list[NewJob], ids: Sequence[int], now: datetime, plain: bool) -> list[Job]:
    """The jobs the COPY of :func:`copy_records` wrote."""
    if not plain:
        return [
            enqueued(r, job_id, *_schedule(r, now), now)
            for job_id, r in zip(ids, rows, strict=True)
        ]
    return copied_plain(rows, ids, now)
