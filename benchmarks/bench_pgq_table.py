"""pgq against a big table, over time, and at rest:

- `aged`: the claim statement's p50/p99 with 1,000,000 finished jobs and 100,000 available
  ones in the table, beside the same claim on a table holding only the 100,000;
- `steady SECONDS [recommended|default]`: enqueuers and a worker together; throughput and
  the jobs table's size (heap, indexes, dead tuples) before and after;
- `rss`: a worker process's resident memory with 1,000 concurrent sleeping async jobs.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import asyncpg
from common import drop_database, emit, fresh_database, pgq_migrate, private_server, run, summary_ms

import pgq
from pgq._db import sql

HERE = Path(__file__).resolve().parent

#: The table settings docs/performance.md recommends for a busy queue.
RECOMMENDED = """
ALTER TABLE pgq_jobs SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
)
"""


async def claim_timings(dsns: dict[str, str], rounds: int, warmup: int) -> dict[str, list[float]]:
    """Time the claim statement (10 jobs) on each database in turn, one claim each per round,
    so that noise on this shared machine falls on every table alike. The first ``warmup``
    rounds warm the caches and are not kept."""
    producer = uuid.uuid4()
    conns = {
        name: await asyncpg.connect(dsn, server_settings={"plan_cache_mode": "force_custom_plan"})
        for name, dsn in dsns.items()
    }
    samples: dict[str, list[float]] = {name: [] for name in dsns}
    try:
        for round_ in range(warmup + rounds):
            for name, conn in conns.items():
                t = time.perf_counter()
                await conn.fetch(
                    sql.CLAIM_JOBS, "default", ["noop"], 10, producer, [None], [20], "bench", False
                )
                if round_ >= warmup:
                    samples[name].append(time.perf_counter() - t)
    finally:
        for conn in conns.values():
            await conn.close()
    return samples


async def fill(dsn: str, finished: int, available: int) -> None:
    conn = await asyncpg.connect(dsn)
    for start in range(0, finished, 200_000):
        await conn.execute(
            "INSERT INTO pgq_jobs (task, args, state, attempt, max_attempts, attempted_at,"
            " finalized_at, created_at) SELECT 'noop', jsonb_build_object('i', g), 'completed',"
            " 1, 20, now() - interval '1 hour', now() - interval '1 hour',"
            " now() - interval '2 hours' FROM generate_series($1::int, $2::int) g",
            start,
            min(finished, start + 200_000) - 1,
        )
    await conn.execute(
        "INSERT INTO pgq_jobs (task, args) SELECT 'noop', jsonb_build_object('i', g)"
        " FROM generate_series(1, $1::int) g",
        available,
    )
    await conn.execute("VACUUM ANALYZE pgq_jobs")
    await conn.close()


async def aged() -> None:
    dsns = {}
    for name, finished in (("fresh", 0), ("aged", 1_000_000)):
        dsns[name] = await fresh_database(f"bench_pgq_{name}")
        await pgq_migrate(dsns[name])
        await fill(dsns[name], finished, 100_000)
    samples = await claim_timings(dsns, rounds=3_000, warmup=200)
    results = {name: summary_ms(s) for name, s in samples.items()}
    for name in dsns:
        await drop_database(f"bench_pgq_{name}")
    emit(
        {
            "system": "pgq",
            "workload": "aged_table",
            "fresh": results["fresh"],
            "aged": results["aged"],
            "p99_ratio": results["aged"]["p99_ms"] / results["fresh"]["p99_ms"],
        }
    )


async def table_size(conn: asyncpg.Connection[asyncpg.Record]) -> dict[str, float]:
    row = await conn.fetchrow(
        "SELECT pg_relation_size('pgq_jobs') AS heap, pg_indexes_size('pgq_jobs') AS indexes,"
        " s.n_dead_tup AS dead, s.autovacuum_count AS vacuums,"
        " (SELECT count(*) FROM pgq_jobs) AS live"
        " FROM pg_stat_user_tables s WHERE s.relname = 'pgq_jobs'"
    )
    assert row is not None
    return sizes(row)


def sizes(row: asyncpg.Record) -> dict[str, float]:
    """A row of ``heap``, ``indexes`` (bytes), ``dead``, ``vacuums`` and ``live`` as the
    benchmarks print and record it."""
    return {
        "heap_mb": row["heap"] / 2**20,
        "indexes_mb": row["indexes"] / 2**20,
        "dead_tuples": float(row["dead"] or 0),
        "autovacuums": float(row["vacuums"] or 0),
        "rows": float(row["live"] or 0),
    }


app = pgq.App()


@app.task
async def noop(ctx: pgq.JobContext, i: int) -> None:
    """Does nothing."""


#: The server setting docs/performance.md recommends with them: autovacuum looks at each
#: database every 10 s instead of every minute, so per-table thresholds can act.
RECOMMENDED_SERVER = {"autovacuum_naptime": "10s"}


async def steady(seconds: float, settings: str) -> None:
    """Each run gets a Postgres instance of its own: stock, or with the recommended server
    setting; the recommended run also applies the recommended table settings."""
    server = RECOMMENDED_SERVER if settings == "recommended" else {}
    async with private_server(server) as dsn:
        await pgq_migrate(dsn)
        conn = await asyncpg.connect(dsn)
        if settings == "recommended":
            await conn.execute(RECOMMENDED)
        before = await table_size(conn)
        stop = asyncio.Event()
        enqueued = 0

        async def enqueuer(client: pgq.Client) -> None:
            nonlocal enqueued
            while not stop.is_set():
                await client.enqueue_many([pgq.JobSpec(noop, {"i": i}) for i in range(100)])
                enqueued += 100
                await asyncio.sleep(0.02)  # about 5,000 jobs/s from each of two enqueuers

        # A short completed-job retention, as a busy production queue would run, so the
        # leader's deletes are part of the churn being measured.
        worker = pgq.Worker(
            app, dsn, concurrency=500, retention_completed=10.0, retention_interval=5.0
        )
        async with pgq.Client(dsn, app=app) as client, worker:
            tasks = [asyncio.create_task(enqueuer(client)) for _ in range(2)]
            started = time.perf_counter()
            await asyncio.sleep(seconds)
            stop.set()
            await asyncio.gather(*tasks)
            elapsed = time.perf_counter() - started
            completed = sum(p["completed"] for p in worker.stats()["producers"])
        after = await table_size(conn)
        await conn.close()
    emit(
        {
            "system": "pgq",
            "workload": f"steady_{settings}",
            "seconds": elapsed,
            "enqueued": enqueued,
            "completed": completed,
            "rate": completed / elapsed,
            "server_settings": server,
            "before": before,
            "after": after,
        }
    )


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def rss() -> None:
    dsn = await fresh_database("bench_pgq_rss")
    await pgq_migrate(dsn)
    async with pgq.Client(dsn) as client:
        await client.enqueue_many([pgq.JobSpec("sleeper", {"s": 30}) for _ in range(1_000)])
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pgq",
            "--log-level",
            "WARNING",
            "worker",
            "rss_app:app",
            "--dsn",
            dsn,
            "--concurrency",
            "1000",
        ],
        cwd=HERE,
        env=env,
    )
    conn = await asyncpg.connect(dsn)
    try:
        deadline = time.monotonic() + 60
        while await conn.fetchval("SELECT count(*) FROM pgq_jobs WHERE state = 'running'") < 1000:
            if time.monotonic() > deadline:
                raise TimeoutError("the jobs did not all start")
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)
        kb = rss_kb(worker.pid)
    finally:
        worker.send_signal(signal.SIGINT)
        worker.send_signal(signal.SIGINT)
        worker.wait(30)
        await conn.close()
        await drop_database("bench_pgq_rss")
    emit({"system": "pgq", "workload": "rss_1000_sleeping", "rss_mb": kb / 1024})


async def main() -> None:
    workload = sys.argv[1]
    if workload == "aged":
        await aged()
    elif workload == "steady":
        await steady(
            float(sys.argv[2]) if len(sys.argv) > 2 else 60.0,
            sys.argv[3] if len(sys.argv) > 3 else "recommended",
        )
    elif workload == "rss":
        await rss()
    else:
        raise SystemExit(f"unknown workload {workload}")


if __name__ == "__main__":
    run(lambda: main())
