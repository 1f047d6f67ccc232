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
async def effect(ctx: pgq.JobContext, seconds: float, hold_on: str | None = None) -> str:
    """Work for ``seconds``, then record the effect, fenced. On the worker named
    ``hold_on`` the work never ends: a test that kills that worker has its job for sure,
    and any other worker runs it in ``seconds``."""
    p = await pool()
    async with p.acquire() as conn:
        await conn.execute(
            "INSERT INTO starts (job_id, attempt, worker) VALUES ($1, $2, $3)",
            ctx.id,
            ctx.attempt,
            os.environ["FAULT_WORKER"],
        )
    if hold_on == os.environ["FAULT_WORKER"]:
        await anyio.sleep_forever()
    await anyio.sleep(seconds)
    async with p.acquire() as conn:
        await conn.execute(
            FENCED_EFFECT, ctx.id, ctx.attempt, os.environ["FAULT_WORKER"], ctx.token
        )
    return "done"


@app.task(max_attempts=25)
async def tx_effect(ctx: pgq.JobContext, work_s: float, before_commit_s: float = 0.0) -> str:
    """Work for ``work_s``, then write the effect and complete the job in one transaction,
    which (on the first attempt only) stays open ``before_commit_s`` more: exactly once,
    whatever kills it."""
    p = await pool()
    async with p.acquire() as conn:
        await conn.execute(
            "INSERT INTO starts (job_id, attempt, worker) VALUES ($1, $2, $3)",
            ctx.id,
            ctx.attempt,
            os.environ["FAULT_WORKER"],
        )
    await anyio.sleep(work_s)
    async with p.acquire() as conn, conn.transaction():
        await conn.execute(
            "INSERT INTO effects (job_id, attempt, worker) VALUES ($1, $2, $3)",
            ctx.id,
            ctx.attempt,
            os.environ["FAULT_WORKER"],
        )
        await ctx.complete(connection=conn, result="done")
        if ctx.attempt == 1:
            await anyio.sleep(before_commit_s)
    return "done"


@app.task(max_attempts=10)
async def gather(ctx: pgq.JobContext, seconds: float = 0.0) -> int:
    """A group's callback: record, fenced, how many of its parents completed with a result
    (the effect's ``attempt`` column carries the count)."""
    await anyio.sleep(seconds)
    completed = sum(1 for p in ctx.parents if p.state is pgq.JobState.COMPLETED and p.result)
    p = await pool()
    async with p.acquire() as conn:
        await conn.execute(FENCED_EFFECT, ctx.id, completed, os.environ["FAULT_WORKER"], ctx.token)
    return completed


async def _record_start(job_id: int, attempt: int) -> None:
    p = await pool()
    async with p.acquire() as conn:
        await conn.execute(
            "INSERT INTO starts (job_id, attempt, worker) VALUES ($1, $2, $3)",
            job_id,
            attempt,
            os.environ["FAULT_WORKER"],
        )


@app.task(max_attempts=10)
def thread_effect(ctx: pgq.JobContext, seconds: float) -> str:
    """A plain ``def`` task, run in a worker thread: records its start, works ``seconds``,
    records the effect, fenced."""
    import time

    anyio.from_thread.run(_record_start, ctx.id, ctx.attempt)
    time.sleep(seconds)

    async def effect() -> None:
        p = await pool()
        async with p.acquire() as conn:
            await conn.execute(
                FENCED_EFFECT, ctx.id, ctx.attempt, os.environ["FAULT_WORKER"], ctx.token
            )

    anyio.from_thread.run(effect)
    return "done"


@app.task(max_attempts=10, timeout=2)
async def timed_effect(ctx: pgq.JobContext, seconds: float) -> str:
    """Like ``effect``, with a timeout of 2 s: a job whose outcome is not written within that
    (and the rescuer's grace) is rescued as an overrun."""
    await _record_start(ctx.id, ctx.attempt)
    await anyio.sleep(seconds)
    p = await pool()
    async with p.acquire() as conn:
        await conn.execute(
            FENCED_EFFECT, ctx.id, ctx.attempt, os.environ["FAULT_WORKER"], ctx.token
        )
    return "done"
