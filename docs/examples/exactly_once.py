"""An effect in the application's own database that happens exactly once per job: written in
the same transaction that completes the job (the test suite runs `main`)."""

from __future__ import annotations

import asyncpg

import pgq
from pgq import testing

app = pgq.App()
_pool: asyncpg.Pool[asyncpg.Record] | None = None


@app.task(max_attempts=10)
async def credit(ctx: pgq.JobContext, account: int, cents: int) -> int:
    """Credit an account. The ledger row and the job's completion commit together: if this
    attempt dies before the commit, neither happened and the retry does both; if it was
    rescued meanwhile (a zombie), ``ctx.complete`` raises and the row rolls back."""
    assert _pool is not None
    async with _pool.acquire() as conn, conn.transaction():
        balance: int = await conn.fetchval(
            "UPDATE accounts SET cents = cents + $2 WHERE id = $1 RETURNING cents",
            account,
            cents,
        )
        await ctx.complete(connection=conn, result=balance)
    return balance  # not written: the transaction already completed the job


async def main(dsn: str) -> tuple[list[int], int]:
    """Credit account 1 three times; returns the balances the jobs recorded, and the final
    balance."""
    global _pool
    _pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    assert _pool is not None
    try:
        await _pool.execute(
            "CREATE TABLE IF NOT EXISTS accounts (id int PRIMARY KEY, cents bigint NOT NULL);"
            "INSERT INTO accounts VALUES (1, 0) ON CONFLICT DO NOTHING"
        )
        async with pgq.Client(dsn) as client:
            await client.enqueue_many([credit.spec(account=1, cents=c) for c in (100, 250, 50)])
        result = await testing.drain(app, dsn)
        final: int = await _pool.fetchval("SELECT cents FROM accounts WHERE id = 1")
        return sorted(job.result for job in result.completed if job.result is not None), final
    finally:
        await _pool.close()
        _pool = None
