"""Side effects under at-least-once delivery: fenced, and idempotent.

``charge`` writes two effects for each job:

- a *fenced* row in ``charge_attempts``: written only while this attempt is the job's
  running attempt (its token), so a zombie's late write is refused. A retry of an attempt
  that died after writing it writes another: one row per attempt that got that far.
- an *idempotent* row in ``charges``: keyed by the job, so it is written once per job
  whatever the kills, retries and rescues.

Run workers with ``pgq worker idempotent:app`` and ``PGQ_DSN`` set; the test suite runs them
under ``kill -9`` (tests/faults/test_idempotent.py).
"""

from __future__ import annotations

import os

import anyio
import asyncpg

import pgq

app = pgq.App()

SCHEMA = """
CREATE TABLE IF NOT EXISTS charges (
    order_id bigint NOT NULL,
    idempotency_key text PRIMARY KEY
);
CREATE TABLE IF NOT EXISTS charge_attempts (job_id bigint NOT NULL, attempt int NOT NULL);
"""

_pool: asyncpg.Pool[asyncpg.Record] | None = None


async def pool() -> asyncpg.Pool[asyncpg.Record]:
    """The application's own pool (not pgq's), opened on first use."""
    global _pool
    if _pool is None:
        _pool = await asyncpg.create_pool(os.environ["PGQ_DSN"], min_size=1, max_size=4)
    return _pool


@app.task(max_attempts=25)
async def charge(ctx: pgq.JobContext, order_id: int, settle_s: float = 0.2) -> bool:
    """Charge an order once, however often the job runs. Returns whether this attempt did."""
    async with (await pool()).acquire() as conn, conn.transaction():
        # Fenced: refused once this attempt is no longer the job's running attempt.
        await conn.execute(
            "INSERT INTO charge_attempts (job_id, attempt) SELECT $1, $2"
            " WHERE EXISTS (SELECT 1 FROM pgq_jobs WHERE id = $1 AND attempt_token = $3"
            " AND state = (SELECT 'running'::pgq_job_state))",
            ctx.id,
            ctx.attempt,
            ctx.token,
        )
        # Idempotent: the key is the same for every attempt of this job.
        charged = await conn.fetchval(
            "INSERT INTO charges (order_id, idempotency_key) VALUES ($1, $2)"
            " ON CONFLICT (idempotency_key) DO NOTHING RETURNING true",
            order_id,
            f"pgq-job-{ctx.id}",
        )
    # Whatever else the task does after its effect (here: nothing but time) is the window in
    # which a kill makes the job run again with its effect already done.
    await anyio.sleep(settle_s)
    return bool(charged)
