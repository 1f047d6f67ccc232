"""The leader lease, on the database clock."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from pgq._db import sql
from pgq._db.connections import Db


async def acquire(db: Db, worker_id: uuid.UUID, worker_name: str, ttl_s: float) -> bool:
    """Take the lease if it is free or expired, or renew it if it is ours; returns whether
    ``worker_id`` holds it now."""
    return await db.fetchval(sql.ACQUIRE_LEADERSHIP, worker_id, worker_name, ttl_s) is not None


async def resign(db: Db, worker_id: uuid.UUID) -> None:
    """Give the lease up (if held) and tell followers."""
    await db.execute(sql.RESIGN_LEADERSHIP, worker_id)


@dataclass(frozen=True, slots=True)
class LeaderInfo:
    """Who leads, since when, and how long the lease has left."""

    worker_id: uuid.UUID
    worker_name: str
    elected_at: datetime
    expires_in_s: float


async def current(db: Db) -> LeaderInfo | None:
    """The current leader, or None when the lease is free or expired."""
    row = await db.fetchrow(sql.CURRENT_LEADER)
    if row is None:
        return None
    return LeaderInfo(
        row["leader_id"], row["worker_name"], row["elected_at"], float(row["expires_in_s"])
    )
