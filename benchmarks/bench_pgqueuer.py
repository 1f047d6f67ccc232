"""PgQueuer's side of the benchmark: `python bench_pgqueuer.py WORKLOAD [BATCH]`."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path

import asyncpg
from common import (
    IO_CONCURRENCY,
    IO_JOBS,
    IO_SECONDS,
    SERVER_DSN,
    CpuMeter,
    Timer,
    dispatch,
    drop_database,
    emit,
    fresh_database,
    with_database,
)
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
    await queries.enqueue(["noop"] * BATCH, [b"-1"] * BATCH, [0] * BATCH)  # warm-up, untimed
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
    result = await run_backlog("bench_pgqueuer_drain", N, batch_size, None, 0.0)
    emit({**result, "workload": "drain"})


async def io() -> None:
    """IO_JOBS jobs of IO_SECONDS each, at most IO_CONCURRENCY at once (its
    `max_concurrent_tasks`), claimed in batches of 500 (its best drain setting)."""
    result = await run_backlog("bench_pgqueuer_io", IO_JOBS, 500, IO_CONCURRENCY, IO_SECONDS)
    emit({**result, "workload": "io"})


async def run_backlog(
    name: str, n: int, batch_size: int, max_tasks: int | None, sleep: float
) -> dict[str, object]:
    """Enqueue ``n`` jobs, then time PgQueuer's drain mode until it exits."""
    conn = await setup(name)
    queries = Queries(AsyncpgDriver(conn))
    for start in range(0, n, 5_000):
        await queries.enqueue(
            ["noop"] * 5_000, [str(i).encode() for i in range(start, start + 5_000)], [0] * 5_000
        )
    pq = PgQueuer(AsyncpgDriver(conn))

    @pq.entrypoint("noop")
    async def noop(job: Job) -> None:
        """A job that does nothing (or waits ``sleep``)."""
        if sleep:
            await asyncio.sleep(sleep)

    with CpuMeter(name) as cpu, Timer() as t:
        await pq.run(
            mode=QueueExecutionMode.drain, batch_size=batch_size, max_concurrent_tasks=max_tasks
        )
    left = await conn.fetchval("SELECT count(*) FROM pgqueuer")
    await conn.close()
    assert left == 0, f"{left} jobs left"
    await drop_database(name)
    return {
        "system": "pgqueuer",
        "jobs": n,
        "seconds": t.seconds,
        "rate": n / t.seconds,
        **cpu.per_job_us(n),
        "settings": {"batch_size": batch_size, "max_concurrent_tasks": max_tasks},
    }


async def enqueue_one() -> None:
    conn = await setup("bench_pgqueuer_enqueue")
    queries = Queries(AsyncpgDriver(conn))
    for _ in range(50):  # warm-up, untimed
        await queries.enqueue("noop", b"-1")
    with Timer() as t:
        for i in range(1_000):
            await queries.enqueue("noop", str(i).encode())
    await conn.close()
    emit(
        {
            "system": "pgqueuer",
            "workload": "enqueue",
            "jobs": 1_000,
            "seconds": t.seconds,
            "rate": 1_000 / t.seconds,
        }
    )
    await drop_database("bench_pgqueuer_enqueue")


async def latency() -> None:
    import latency as driver

    conn = await setup("bench_pgqueuer_latency")
    dsn = with_database(SERVER_DSN, "bench_pgqueuer_latency")
    queries = Queries(AsyncpgDriver(conn))

    async def enqueue(seq: int) -> None:
        await queries.enqueue("stamp", str(seq).encode())

    out = Path(tempfile.mkdtemp()) / "pgqueuer.json"
    result = await driver.drive(Path(__file__), dsn, enqueue, out)
    await conn.close()
    emit({"system": "pgqueuer", "workload": "latency", **result})
    await drop_database("bench_pgqueuer_latency")


async def latency_worker(dsn: str, out: str, n: int) -> None:
    conn = await asyncpg.connect(dsn)
    pq = PgQueuer(AsyncpgDriver(conn))
    started: dict[int, float] = {}

    @pq.entrypoint("stamp")
    async def stamp(job: Job) -> None:
        """Record when the job started."""
        assert job.payload is not None
        started[int(job.payload.decode())] = time.time()
        if len(started) >= n:
            pq.shutdown.set()

    async def ready() -> None:
        await asyncio.sleep(0.5)
        print("READY", flush=True)

    await asyncio.gather(pq.run(), ready())
    Path(out).write_text(json.dumps(started))
    await conn.close()


if __name__ == "__main__":
    dispatch(
        {
            "enqueue_many": enqueue_many,
            "enqueue": enqueue_one,
            "drain": lambda batch="10": drain(int(batch)),
            "io": io,
            "latency": latency,
            "latency-worker": lambda dsn, out, n: latency_worker(dsn, out, int(n)),
        }
    )
