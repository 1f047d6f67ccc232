"""Physical cost per job: WAL bytes and index writes per job for enqueue_many (batches of
1,000) + claim + complete, for pgq on a plain queue, with each newer feature used, and for
PgQueuer.

`python benchmarks/bench_wal.py [MODE ...]` (modes: `plain`, `keyed` (every job with a
limit key, per-key limits set), `chained` (chains of 10, each job waiting for the one
before), `pgqueuer` (PgQueuer's enqueue in batches of 1,000 and its drain at batch_size
100)). Each mode enqueues and drains 20,000 no-op jobs in a fresh database and reads the
server's WAL between two positions (after a CHECKPOINT, so full-page images are counted as
a steady server writes them) with pg_walinspect: all of it, the index records (B-tree and
GIN: each is one index entry written, or an index page split) and the heap's. The server
must be otherwise idle (WAL is counted cluster-wide). Run it with PYTHONPATH at another
checkout's src to compare versions (`plain` only, for versions before these features).
"""

from __future__ import annotations

import sys

import anyio
import asyncpg
from common import emit, fresh_database

import pgq
from pgq import migrate

N = 20_000
app = pgq.App()


@app.task
async def noop(ctx: pgq.JobContext, i: int) -> None:
    """Nothing: the queue's own cost."""


#: pg_walinspect's resource managers that write index entries, and the heap's.
INDEX_RMGRS = ("Btree", "Gin", "Hash", "Gist", "SPGist", "BRIN")
HEAP_RMGRS = ("Heap", "Heap2")


async def wal_position(conn: asyncpg.Connection[asyncpg.Record]) -> int:
    """The server's current WAL position (asyncpg reads a pg_lsn as an int)."""
    return int(await conn.fetchval("SELECT pg_current_wal_lsn()"))


async def reserve_wal(conn: asyncpg.Connection[asyncpg.Record]) -> None:
    """Keep the server from removing WAL from here on until ``conn`` closes (a temporary
    physical replication slot, reserved at once): a checkpoint during the measurement, timed
    or forced by WAL volume, would otherwise recycle segments not yet read, and the read
    fails with 'requested WAL segment ... has already been removed'."""
    await conn.execute(
        "SELECT pg_create_physical_replication_slot('pgq_bench_wal_' || pg_backend_pid(),"
        " true, true)"
    )


async def wal_between(
    conn: asyncpg.Connection[asyncpg.Record], start: int, end: int
) -> dict[str, float]:
    """WAL written between two positions, per job: bytes in all, and the index and heap
    records and bytes."""
    await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    rows = await conn.fetch(
        'SELECT "resource_manager/record_type" AS resource_manager, count, combined_size'
        " FROM pg_get_wal_stats($1::pg_lsn, $2::pg_lsn, false)",
        start,
        end,
    )

    def of(rmgrs: tuple[str, ...], column: str) -> float:
        return sum(float(r[column]) for r in rows if r["resource_manager"] in rmgrs) / N

    return {
        "bytes": (end - start) / N,
        "index_records": of(INDEX_RMGRS, "count"),
        "index_bytes": of(INDEX_RMGRS, "combined_size"),
        "heap_records": of(HEAP_RMGRS, "count"),
        "heap_bytes": of(HEAP_RMGRS, "combined_size"),
    }


async def run(mode: str) -> dict[str, float]:
    if mode == "pgqueuer":
        return await run_pgqueuer()
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
            await reserve_wal(conn)
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
        return await wal_between(conn, wal0, wal1)
    finally:
        await conn.close()


async def run_pgqueuer() -> dict[str, float]:
    from pgqueuer import PgQueuer
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.models import Job
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    dsn = await fresh_database("pgq_bench_wal_pgqueuer")
    conn = await asyncpg.connect(dsn)
    worker_conn = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(conn))
        await queries.install()
        pq = PgQueuer(AsyncpgDriver(worker_conn))

        @pq.entrypoint("noop")
        async def noop(job: Job) -> None:
            """Nothing: the queue's own cost."""

        await queries.enqueue("noop", b"-1")  # warm-up: the first row of a table
        await pq.run(mode=QueueExecutionMode.drain, batch_size=100)
        await conn.execute("CHECKPOINT")
        await reserve_wal(conn)
        wal0 = await wal_position(conn)
        for start in range(0, N, 1_000):
            await queries.enqueue(
                ["noop"] * 1_000,
                [str(i).encode() for i in range(start, start + 1_000)],
                [0] * 1_000,
            )
        pq = PgQueuer(AsyncpgDriver(worker_conn))
        pq.entrypoint("noop")(noop)
        await pq.run(mode=QueueExecutionMode.drain, batch_size=100)
        assert await conn.fetchval("SELECT count(*) FROM pgqueuer") == 0
        wal1 = await wal_position(conn)
        return await wal_between(conn, wal0, wal1)
    finally:
        await worker_conn.close()
        await conn.close()


async def main(modes: list[str]) -> None:
    print(
        f"{'mode':10} {'WAL bytes/job':>14} {'index records/job':>18} {'index bytes/job':>16}"
        f" {'heap records/job':>17} {'heap bytes/job':>15}"
    )
    results = {}
    for mode in modes:
        w = results[mode] = await run(mode)
        print(
            f"{mode:10} {w['bytes']:14,.0f} {w['index_records']:18.2f} {w['index_bytes']:16,.0f}"
            f" {w['heap_records']:17.2f} {w['heap_bytes']:15,.0f}",
            flush=True,
        )
    emit({"system": "pgq", "workload": "wal_per_job", "modes": results})


if __name__ == "__main__":
    anyio.run(main, sys.argv[1:] or ["plain", "keyed", "chained", "pgqueuer"])
