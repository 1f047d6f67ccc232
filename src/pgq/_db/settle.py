"""An attempt's outcome written by the task itself, in its own transaction: fenced on the
attempt's token, which it replaces with one the task alone knows, so the worker can tell
afterwards whether that transaction committed."""

from __future__ import annotations

import uuid
from typing import Any

from pgq._db import sql
from pgq._db.connections import Db
from pgq._db.drivers import AsyncDriver


async def settle(
    driver: AsyncDriver,
    job_id: int,
    token: uuid.UUID | None,
    settle_token: uuid.UUID,
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
        [job_id, token, settle_token, state, delay_s, error, result, attempt_delta],
    )
    return None if row is None or row["state"] is None else str(row["state"])


def settle_sync(
    conn: Any,
    job_id: int,
    token: uuid.UUID | None,
    settle_token: uuid.UUID,
    state: str,
    *,
    delay_s: float | None = None,
    error: str | None = None,
    result: str | None = None,
    attempt_delta: int = 0,
) -> str | None:
    """:func:`settle` on a psycopg connection."""
    from pgq._db.psycopg_drivers import cursor

    with cursor(conn) as cur:
        row = cur.execute(
            sql.SETTLE_ATTEMPT,
            [job_id, token, settle_token, state, delay_s, error, result, attempt_delta],
        ).fetchone()
    return None if row is None else str(row["state"])


async def settled_by(db: Db, job_id: int, tokens: list[uuid.UUID]) -> uuid.UUID | None:
    """Which of ``tokens`` job ``job_id`` holds (the transaction that settled it with that
    token committed), or None."""
    token: uuid.UUID | None = await db.fetchval(sql.SETTLED_BY, job_id, tokens)
    return token
