"""Physical cost per job: WAL bytes written per job for enqueue_many (batches of 1,000) +
claim + complete, on a plain queue and with each newer feature used.

`python benchmarks/bench_wal.py [MODE ...]` (modes: `plain`, `keyed` (every job with a
limit key, per-key limits set), `chained` (chains of 10, each job waiting for the one
before)). Each mode enqueues and drains 20,000 no-op jobs in a fresh database and reads
the server's WAL position before and after (after a CHECKPOINT, so full-page images are
counted as a steady server writes them); the server must be otherwise idle (WAL is
counted cluster-wide). Run it with PYTHONPATH at another checkout's src to compare
versions (`plain` only, for versions before these features).
"""

from __future__ import annotations

import sys

import anyio
import asyncpg
from common import fresh_database

import pgq
from pgq import migrate

N = 20_000
app = pgq.App()


@app.task
async def noop(ctx: pgq.JobContext, i: int) -> None:
    """Nothing: the queue's own cost."""


async def wal_position(conn: asyncpg.Connection[asyncpg.Record]) -> int:
    """The server's WAL position, in bytes."""
    return int(await conn.fetchval("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"))


async def run(mode: str) -> float:
    dsn = await fresh_database(f"pgq_bench_wal_{mode}")
    await migrate.upgrade_async(dsn)
    conn = await asyncpg.connect(dsn)
    try:
        async with pgq.Client(dsn, app=app) as client:
            if mode == "keyed":
                await client.set_queue_limits("default", key_concurrency=10_000)
            await client.enqueue(noop, {"i": -1})  # warm-up: the first row of a table
            await pgq.Worker(app, dsn, metrics=False).run(burst=True)
            await conn.execute("CHECKPOINT")
            wal0 = await wal_position(conn)
            for start in range(0, N, 1_000):
                if mode == "chained":
                    for link in range(start, start + 1_000, 10):
                        await client.enqueue_chain(
                            [pgq.JobSpec(noop, {"i": i}) for i in range(link, link + 10)]
                        )
                    continue
                await client.enqueue_many(
                    [
                        pgq.JobSpec(noop, {"i": i}, limit_key=str(i % 100))
                        if mode == "keyed"
                        else pgq.JobSpec(noop, {"i": i})
                        for i in range(start, start + 1_000)
                    ]
                )
            await pgq.Worker(app, dsn, concurrency=100, metrics=False).run(burst=True)
            wal1 = await wal_position(conn)
    finally:
        await conn.close()
    return (wal1 - wal0) / N


async def main(modes: list[str]) -> None:
    print(f"{'mode':10} {'WAL bytes/job':>14}")
    for mode in modes:
        print(f"{mode:10} {await run(mode):14,.0f}", flush=True)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1:] or ["plain", "keyed", "chained"])
