"""PgQueuer's side of the benchmark: `python bench_pgqueuer.py WORKLOAD [BATCH]`."""

from __future__ import annotations

import sys

import asyncpg
from common import Timer, drop_database, emit, fresh_database, run
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job
from pgqueuer.queries import Queries
from pgqueuer.types import QueueExecutionMode

N = 20_000
BATCH = 1_000


async def setup(name: str) -> asyncpg.Connection:  # type: ignore[type-arg]
    dsn = await fresh_database(name)
    conn = await asyncpg.connect(dsn)
    await Queries(AsyncpgDriver(conn)).install()
    return conn


async def enqueue_many() -> None:
    conn = await setup("bench_pgqueuer_enqueue_many")
    queries = Queries(AsyncpgDriver(conn))
    with Timer() as t:
        for start in range(0, N, BATCH):
            await queries.enqueue(
                ["noop"] * BATCH,
                [str(i).encode() for i in range(start, start + BATCH)],
                [0] * BATCH,
            )
    await conn.close()
    emit(
        {
            "system": "pgqueuer",
            "workload": "enqueue_many",
            "jobs": N,
            "seconds": t.seconds,
            "rate": N / t.seconds,
        }
    )
    await drop_database("bench_pgqueuer_enqueue_many")


async def drain(batch_size: int) -> None:
    conn = await setup("bench_pgqueuer_drain")
    queries = Queries(AsyncpgDriver(conn))
    for start in range(0, N, 5_000):
        await queries.enqueue(
            ["noop"] * 5_000, [str(i).encode() for i in range(start, start + 5_000)], [0] * 5_000
        )
    pq = PgQueuer(AsyncpgDriver(conn))

    @pq.entrypoint("noop")
    async def noop(job: Job) -> None:
        """A job that does nothing."""

    with Timer() as t:
        await pq.run(mode=QueueExecutionMode.drain, batch_size=batch_size)
    left = await conn.fetchval("SELECT count(*) FROM pgqueuer")
    await conn.close()
    assert left == 0, f"{left} jobs left"
    emit(
        {
            "system": "pgqueuer",
            "workload": "drain",
            "jobs": N,
            "seconds": t.seconds,
            "rate": N / t.seconds,
            "settings": {"batch_size": batch_size},
        }
    )
    await drop_database("bench_pgqueuer_drain")


async def main() -> None:
    workload = sys.argv[1]
    if workload == "enqueue_many":
        await enqueue_many()
    elif workload == "drain":
        await drain(int(sys.argv[2]) if len(sys.argv) > 2 else 10)
    else:
        raise SystemExit(f"unknown workload {workload}")


if __name__ == "__main__":
    run(lambda: main())
