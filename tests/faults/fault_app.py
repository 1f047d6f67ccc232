"""The App the fault tests run in real worker processes.

Its one task sleeps, then records its side effect with a *fenced* insert: the row is written
only while this attempt is still the job's running attempt (its token), so a zombie's late
effect is never written. (An attempt whose worker dies after the effect but before its
outcome is retried, and its retry writes the effect again: the fence is not exactly-once;
see docs/liveness.md.)
"""

from __future__ import annotations

import os

import anyio
import asyncpg

import pgq

app = pgq.App()
_pool: asyncpg.Pool[asyncpg.Record] | None = None

FENCED_EFFECT = """
INSERT INTO effects (job_id, attempt, worker)
SELECT $1, $2, $3
WHERE EXISTS (SELECT 1 FROM pgq_jobs
              WHERE id = $1 AND attempt_token = $4 AND state = 'running')
"""


async def pool() -> asyncpg.Pool[asyncpg.Record]:
    global _pool
    if _pool is None:
        _pool = await asyncpg.create_pool(os.environ["FAULT_DSN"], min_size=1, max_size=4)
    return _pool


@app.task(max_attempts=10)
async def effect(ctx: pgq.JobContext, seconds: float) -> str:
    """Work for ``seconds``, then record the effect, fenced."""
    p = await pool()
    async with p.acquire() as conn:
        await conn.execute(
            "INSERT INTO starts (job_id, attempt, worker) VALUES ($1, $2, $3)",
            ctx.id,
            ctx.attempt,
            os.environ["FAULT_WORKER"],
        )
    await anyio.sleep(seconds)
    async with p.acquire() as conn:
        await conn.execute(
            FENCED_EFFECT, ctx.id, ctx.attempt, os.environ["FAULT_WORKER"], ctx.token
        )
    return "done"
