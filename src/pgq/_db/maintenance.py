"""What the leader's services run: promotion, rescue, reaping, retention, periodic slots, and
the jobs table's statistics."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from pgq._db import sql
from pgq._db.connections import Connection, Db, Record
from pgq.job import JobState


async def database_now(db: Db) -> datetime:
    """The database's clock."""
    now: datetime = await db.fetchval(sql.DATABASE_NOW)
    return now


async def promote_due(db: Db, limit: int) -> int:
    """Make up to ``limit`` due scheduled and retryable jobs available; returns how many."""
    return sum(int(r["n"]) for r in await db.fetch(sql.PROMOTE_DUE, limit))


async def make_due_now(db: Db, queue: str, tasks: Sequence[str]) -> int:
    """Tests only: make the scheduled and retryable jobs of ``queue``'s ``tasks`` due now;
    returns how many were waiting."""
    n: int = await db.fetchval(sql.MAKE_DUE_NOW, queue, list(tasks))
    return n


@dataclass(frozen=True, slots=True)
class Rescued:
    """One rescued job: what it became and why."""

    id: int
    state: JobState
    reason: str
    worker_name: str | None
    silent_s: float
    queue: str
    task: str
    attempt: int
    #: The rescue's transaction (its ``pg_current_xact_id()``, in text).
    xact: str


async def rescue(
    db: Db, leader_id: uuid.UUID, *, stale_after: float, grace: float, limit: int
) -> list[Rescued]:
    """Rescue up to ``limit`` running jobs whose producer is stale or gone, or that overran
    their deadline by ``grace``; nothing unless ``leader_id`` holds the lease."""
    return _rescued(await db.fetch(sql.RESCUE_JOBS, leader_id, stale_after, grace, limit))


def _rescued(rows: list[Record]) -> list[Rescued]:
    return [
        Rescued(
            r["id"],
            JobState(r["state"]),
            r["reason"],
            r["worker_name"],
            float(r["silent_s"]),
            r["queue"],
            r["task"],
            r["attempt"],
            r["xact"],
        )
        for r in rows
    ]


async def xact_status(db: Db, xact: str) -> str | None:
    """Whether the transaction ``xact`` is ``committed``, ``aborted`` or ``in progress``
    (None: too old to tell, or an id this server never gave: another server, after a
    failover)."""
    try:
        status: str | None = await db.fetchval(sql.XACT_STATUS, xact)
    except asyncpg.InvalidParameterValueError:  # "transaction ID ... is in the future"
        return None
    return status


async def current_xact(db: Db) -> str:
    """The id of the transaction open on ``db``, as :func:`xact_status` takes it."""
    xact: str = await db.fetchval(sql.CURRENT_XACT)
    return xact


async def begin_rescue(db: Db, token: str) -> None:
    """Start a rescue in the transaction open on ``db``: bound its idle time, and name it
    ``token`` in the error entries it writes."""
    await db.execute(sql.RESCUE_BEGIN, token)


async def rescue_landed(db: Db, job_ids: Sequence[int], token: str, kind: str = "rescued") -> bool:
    """Whether the write named ``token`` of ``job_ids`` (a rescue, or with ``kind``
    ``lost_reply`` a stray's hand-back) is in the database."""
    return bool(await db.fetchval(sql.RESCUE_LANDED, list(job_ids), token, kind))


@dataclass(frozen=True, slots=True)
class SameName:
    """A producer row of another process registered under this worker's name."""

    id: uuid.UUID
    heartbeat_at: datetime
    fence_after_s: float | None
    age_s: float


async def same_name_producers(
    db: Db, worker_name: str, own_ids: Sequence[uuid.UUID]
) -> list[SameName]:
    """Producer rows named ``worker_name`` that are not this worker's."""
    rows = await db.fetch(sql.SAME_NAME_PRODUCERS, worker_name, list(own_ids))
    return [
        SameName(r["id"], r["heartbeat_at"], r["fence_after_s"], float(r["age_s"])) for r in rows
    ]


async def rescue_predecessor(
    db: Db, producer_ids: Sequence[uuid.UUID], margin_s: float
) -> list[Rescued]:
    """Rescue the running jobs of ``producer_ids`` whose heartbeat is past their fencing
    bound plus ``margin_s`` (judged in the statement, the rows locked)."""
    return _rescued(await db.fetch(sql.RESCUE_PREDECESSOR, list(producer_ids), margin_s))


async def delete_predecessor(db: Db, producer_ids: Sequence[uuid.UUID], margin_s: float) -> None:
    """Delete the rows of ``producer_ids`` still past their fencing bound plus ``margin_s``
    once their jobs are rescued (a row left behind, because a job of it was being written,
    goes to the reaper)."""
    await db.execute(sql.DELETE_PREDECESSOR, list(producer_ids), margin_s)


@dataclass(frozen=True, slots=True)
class Reaped:
    """A deleted producer row."""

    id: uuid.UUID
    worker_name: str
    queue: str


async def reap(db: Db, after_s: float) -> list[Reaped]:
    """Delete producer rows silent for ``after_s`` whose jobs are all rescued."""
    return [
        Reaped(r["id"], r["worker_name"], r["queue"])
        for r in await db.fetch(sql.REAP_PRODUCERS, after_s)
    ]


async def delete_finished(db: Db, state: JobState, older_than_s: float, limit: int) -> int:
    """Delete up to ``limit`` jobs in final ``state`` finalized over ``older_than_s`` ago."""
    status = await db.execute(sql.DELETE_FINISHED, state.value, older_than_s, limit)
    return int(status.split()[-1])


@dataclass(frozen=True, slots=True)
class JobsStatistics:
    """What the planner knows of the jobs table (``sql.JOBS_STATISTICS``)."""

    worth_analyzing: bool
    analyzed: bool


async def jobs_statistics(db: Db, uncounted_pages: int) -> JobsStatistics:
    """Whether the jobs table is worth analyzing (its rows were counted and some were
    alive, or it was never counted and holds over ``uncounted_pages`` pages), and whether
    its columns have statistics."""
    row = await db.fetchrow(sql.JOBS_STATISTICS, uncounted_pages)
    assert row is not None  # the table exists: the schema was checked at start
    return JobsStatistics(row["worth_analyzing"], row["analyzed"])


async def analyze_jobs(db: Db) -> None:
    """ANALYZE the jobs table."""
    await db.execute(sql.ANALYZE_JOBS)


async def lock_periodic(conn: Connection, name: str) -> datetime | None:
    """The last slot enqueued for schedule ``name``, its row locked until the transaction
    ends (None when the schedule is new)."""
    last: datetime | None = await conn.fetchval(sql.PERIODIC_LOCK, name)
    return last


@dataclass(frozen=True, slots=True)
class ScheduleRecord:
    """A periodic schedule as the leader records it (for operators without the App)."""

    name: str
    task: str | None
    queue: str | None
    schedule: str | None
    last_slot: datetime
    next_slot: datetime | None
    recorded_by: str | None
    updated_at: datetime


async def record_periodic(conn: Connection, record: ScheduleRecord, *, advance: bool) -> None:
    """Record the schedule; with ``advance``, its last slot too (the row is locked by
    :func:`lock_periodic` in the same transaction)."""
    if advance:
        await conn.execute(
            sql.PERIODIC_UPSERT, record.name, record.last_slot, record.task, record.queue,
            record.schedule, record.next_slot, record.recorded_by,
        )  # fmt: skip
    else:
        await conn.execute(
            sql.PERIODIC_DESCRIBE, record.name, record.task, record.queue, record.schedule,
            record.next_slot, record.recorded_by,
        )  # fmt: skip


async def list_periodic(db: Db) -> list[ScheduleRecord]:
    """Every recorded periodic schedule."""
    return [
        ScheduleRecord(
            r["name"],
            r["task"],
            r["queue"],
            r["schedule"],
            r["last_slot"],
            r["next_slot"],
            r["recorded_by"],
            r["updated_at"],
        )
        for r in await db.fetch(sql.LIST_PERIODIC)
    ]
