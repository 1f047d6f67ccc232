"""pgq's side of the benchmark: `python bench_pgq.py WORKLOAD`."""

from __future__ import annotations

import sys

import asyncpg
from common import Timer, drop_database, emit, fresh_database, run

import pgq
from pgq import migrate

N = 20_000
BATCH = 1_000

app = pgq.App()


@app.task
async def noop(ctx: pgq.JobContext, i: int) -> None:
    """A job that does nothing: measures the queue, not the work."""


async def setup(name: str) -> str:
    dsn = await fresh_database(name)
    await migrate.upgrade_async(dsn)
    return dsn


async def enqueue_many() -> None:
    dsn = await setup("bench_pgq_enqueue_many")
    async with pgq.Client(dsn, app=app) as client:
        with Timer() as t:
            for start in range(0, N, BATCH):
                await client.enqueue_many(
                    [pgq.JobSpec(noop, {"i": i}) for i in range(start, start + BATCH)]
                )
    emit(
        {
            "system": "pgq",
            "workload": "enqueue_many",
            "jobs": N,
            "seconds": t.seconds,
            "rate": N / t.seconds,
        }
    )
    await drop_database("bench_pgq_enqueue_many")


async def drain(concurrency: int) -> None:
    dsn = await setup("bench_pgq_drain")
    async with pgq.Client(dsn, app=app) as client:
        for start in range(0, N, 5_000):
            await client.enqueue_many(
                [pgq.JobSpec(noop, {"i": i}) for i in range(start, start + 5_000)]
            )
    with Timer() as t:
        await pgq.Worker(app, dsn, concurrency=concurrency).run(burst=True)
    conn = await asyncpg.connect(dsn)
    done = await conn.fetchval("SELECT count(*) FROM pgq_jobs WHERE state = 'completed'")
    await conn.close()
    assert done == N, f"only {done} of {N} jobs completed"
    emit(
        {
            "system": "pgq",
            "workload": "drain",
            "jobs": N,
            "seconds": t.seconds,
            "rate": N / t.seconds,
            "settings": {"concurrency": concurrency},
        }
    )
    await drop_database("bench_pgq_drain")


async def main() -> None:
    workload = sys.argv[1]
    if workload == "enqueue_many":
        await enqueue_many()
    elif workload == "drain":
        await drain(int(sys.argv[2]) if len(sys.argv) > 2 else 100)
    else:
        raise SystemExit(f"unknown workload {workload}")


if __name__ == "__main__":
    run(lambda: main())
