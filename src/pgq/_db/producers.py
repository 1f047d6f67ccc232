"""Producers in the database: registration, heartbeats, re-registration, the operator's list;
and the leader's lease."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from pgq._db import sql
from pgq._db.codec import RowLike
from pgq._db.connections import Db


@dataclass(frozen=True, slots=True)
class ProducerRow:
    """What a worker writes of one of its producers."""

    id: uuid.UUID
    queue: str
    concurrency: int


@dataclass(frozen=True, slots=True)
class Bounds:
    """What a worker declares with its producers, by which every peer judges them: past
    ``fence_after_s`` without a heartbeat a live producer has stopped claiming; past
    ``stale_after_s`` the leader rescues its jobs, and a job that overran its own timeout
    by ``rescue_grace_s``; ``tasks`` are the task names it serves."""

    fence_after_s: float
    stale_after_s: float
    rescue_grace_s: float
    tasks: tuple[str, ...]


async def register(
    db: Db,
    worker_id: uuid.UUID,
    worker_name: str,
    producers: Sequence[ProducerRow],
    bounds: Bounds,
) -> None:
    """Register a worker's producers, all in one statement."""
    await db.execute(
        sql.REGISTER_PRODUCERS,
        [p.id for p in producers],
        worker_id,
        worker_name,
        [p.queue for p in producers],
        [p.concurrency for p in producers],
        bounds.fence_after_s,
        bounds.stale_after_s,
        bounds.rescue_grace_s,
        list(bounds.tasks),
    )


@dataclass(frozen=True, slots=True)
class Beat:
    """One producer's heartbeat: its id and the counters it reports."""

    id: uuid.UUID
    running: int
    healthy: bool
    claimed: int
    completed: int
    failed: int
    rejected_outcomes: int


async def heartbeat(db: Db, beats: Sequence[Beat]) -> dict[uuid.UUID, float]:
    """Write every beat on the database clock; returns the ids whose row still exists, each
    with the seconds since its previous beat by that clock."""
    rows = await db.fetch(
        sql.HEARTBEAT,
        [b.id for b in beats],
        [b.running for b in beats],
        [b.healthy for b in beats],
        [b.claimed for b in beats],
        [b.completed for b in beats],
        [b.failed for b in beats],
        [b.rejected_outcomes for b in beats],
    )
    return {r["id"]: r["silent_s"] for r in rows}


@dataclass(frozen=True, slots=True)
class Adoption:
    """The jobs a producer took over from its former ids, and those passed over for now
    (their rows were locked): still under a former id, to be taken over later."""

    adopted: list[int]
    passed_over: list[int]


def _adoption(rows: Sequence[RowLike]) -> Adoption:
    return Adoption(
        [r["id"] for r in rows if r["adopted"]], [r["id"] for r in rows if not r["adopted"]]
    )


async def reregister(
    db: Db,
    old_ids: Sequence[uuid.UUID],
    beat: Beat,
    *,
    worker_id: uuid.UUID,
    worker_name: str,
    queue: str,
    concurrency: int,
    bounds: Bounds,
) -> Adoption:
    """Register ``beat.id`` in place of ``old_ids[0]`` (whose row is gone; ``beat.id``'s
    may exist, from a try that timed out) and adopt every job still running under
    ``old_ids`` (that id, and those the producer still holds from earlier
    re-registrations). Each old id gets a row again, of concurrency 0, for the jobs that
    may still be found under it: the caller beats them until it lets them go
    (:func:`release`)."""
    rows = await db.fetch(
        sql.REREGISTER_PRODUCER,
        beat.id,
        [*old_ids, beat.id],
        worker_id,
        worker_name,
        queue,
        concurrency,
        beat.claimed,
        beat.completed,
        beat.failed,
        beat.rejected_outcomes,
        bounds.fence_after_s,
        bounds.stale_after_s,
        bounds.rescue_grace_s,
        list(bounds.tasks),
    )
    return _adoption(rows)


async def adopt(db: Db, producer_id: uuid.UUID, former_ids: Sequence[uuid.UUID]) -> Adoption:
    """Move the jobs still running under ``former_ids`` (a re-registered producer's earlier
    ids) to ``producer_id``."""
    return _adoption(await db.fetch(sql.ADOPT_JOBS, producer_id, list(former_ids)))


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job running under one of a worker's producers, as the database has it."""

    id: int
    token: uuid.UUID | None
    attempt: int
    queue: str
    task: str
    producer_id: uuid.UUID
    max_attempts: int


async def running_under(db: Db, producer_ids: Sequence[uuid.UUID]) -> list[RunningJob]:
    """The jobs running under ``producer_ids`` now."""
    rows = await db.fetch(sql.RUNNING_UNDER, list(producer_ids))
    return [
        RunningJob(
            id=r["id"],
            token=r["attempt_token"],
            attempt=r["attempt"],
            queue=r["queue"],
            task=r["task"],
            producer_id=r["producer_id"],
            max_attempts=r["max_attempts"],
        )
        for r in rows
    ]


async def lost_replies(db: Db, job_ids: Sequence[int]) -> dict[int, int]:
    """How many times each of ``job_ids`` was handed back before because the reply to its
    claim was lost."""
    return {r["id"]: r["n"] for r in await db.fetch(sql.LOST_REPLIES, list(job_ids))}


async def release(db: Db, former_ids: Sequence[uuid.UUID]) -> None:
    """Delete the rows of a re-registered producer's former ids, those no job runs under."""
    await db.execute(sql.RELEASE_PRODUCERS, list(former_ids))


async def delete(db: Db, ids: Sequence[uuid.UUID]) -> None:
    """Delete producer rows (a worker stopping cleanly)."""
    await db.execute(sql.DELETE_PRODUCERS, list(ids))


async def live_count(db: Db, queue: str, within_s: float) -> int:
    """How many producers of ``queue`` (``*``: any) beat within ``within_s`` seconds."""
    n: int = await db.fetchval(sql.LIVE_PRODUCERS, queue, within_s)
    return n


@dataclass(frozen=True, slots=True)
class ProducerInfo:
    """A producer as `pgq producers` and the dashboard show it."""

    id: uuid.UUID
    worker_id: uuid.UUID
    worker_name: str
    queue: str
    started_at: datetime
    heartbeat_at: datetime
    heartbeat_age_s: float
    concurrency: int
    running: int
    healthy: bool
    claimed: int
    completed: int
    failed: int
    rejected_outcomes: int
    is_leader: bool
    fence_after_s: float | None = None
    stale_after_s: float | None = None

    @property
    def former(self) -> bool:
        """Whether this is the row a re-registered producer keeps for a former id while jobs
        may still be found under it (concurrency 0): no producer of its own."""
        return self.concurrency == 0

    def status(self, stale_after_s: float | None, default_stale_after_s: float) -> str:
        """``healthy``, ``fenced`` (it has stopped claiming: it said so, or its heartbeat is
        older than its fencing bound) or ``stale`` (older than ``stale_after_s`` when given,
        else the worker's recorded bound, else ``default_stale_after_s``: the leader rescues
        its jobs)."""
        stale = stale_after_s or self.stale_after_s or default_stale_after_s
        if self.heartbeat_age_s > stale:
            return "stale"
        fence = self.fence_after_s
        if not self.healthy or (fence is not None and self.heartbeat_age_s > fence):
            return "fenced"
        return "healthy"


async def list_producers(db: Db) -> list[ProducerInfo]:
    """Every registered producer, with its heartbeat age on the database clock."""
    return [
        ProducerInfo(
            id=r["id"],
            worker_id=r["worker_id"],
            worker_name=r["worker_name"],
            queue=r["queue"],
            started_at=r["started_at"],
            heartbeat_at=r["heartbeat_at"],
            heartbeat_age_s=float(r["heartbeat_age_s"]),
            concurrency=r["concurrency"],
            running=r["running"],
            healthy=r["healthy"],
            claimed=r["claimed"],
            completed=r["completed"],
            failed=r["failed"],
            rejected_outcomes=r["rejected_outcomes"],
            is_leader=r["is_leader"],
            fence_after_s=r["fence_after_s"],
            stale_after_s=r["stale_after_s"],
        )
        for r in await db.fetch(sql.LIST_PRODUCERS)
    ]


# --------------------------------------------------------------------------- the leader's lease
# One row, on the database clock: the elected worker judges its peers (pgq._worker.leader).


async def acquire_lease(db: Db, worker_id: uuid.UUID, worker_name: str, ttl_s: float) -> bool:
    """Take the lease if it is free or expired, or renew it if it is ours; returns whether
    ``worker_id`` holds it now."""
    return await db.fetchval(sql.ACQUIRE_LEADERSHIP, worker_id, worker_name, ttl_s) is not None


async def resign_lease(db: Db, worker_id: uuid.UUID) -> None:
    """Give the lease up (if held) and tell followers."""
    await db.execute(sql.RESIGN_LEADERSHIP, worker_id)


@dataclass(frozen=True, slots=True)
class LeaderInfo:
    """Who leads, since when, and how long the lease has left."""

    worker_id: uuid.UUID
    worker_name: str
    elected_at: datetime
    expires_in_s: float


async def current_leader(db: Db) -> LeaderInfo | None:
    """The current leader, or None when the lease is free or expired."""
    row = await db.fetchrow(sql.CURRENT_LEADER)
    if row is None:
        return None
    return LeaderInfo(
        row["leader_id"], row["worker_name"], row["elected_at"], float(row["expires_in_s"])
    )
