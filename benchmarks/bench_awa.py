"""awa-pg's side of the benchmark: `python bench_awa.py WORKLOAD [SETTING ...]`.

awa runs its workers in a Rust (tokio) runtime inside the Python process and calls each
Python handler through PyO3; claims and completions are Rust's, in batches. Settings are
those of awa's own Python benchmark (`awa-python/scripts/benchmark_runtime.py`: a pool of
50 connections, a 50 ms poll interval) with `max_workers` swept, since its configuration
guide sizes a hot no-op queue by the in-flight permits (1,024 for its 10k/s shape).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import awa
from common import (
    IO_CONCURRENCY,
    IO_JOBS,
    IO_SECONDS,
    CpuMeter,
    Timer,
    dispatch,
    drop_database,
    emit,
    fresh_database,
)

N = 20_000
BATCH = 1_000
MAX_CONNECTIONS = 50
POLL_INTERVAL_MS = 50


COMPLETED = """
SELECT
    (SELECT COALESCE(sum(completed_count), 0)::bigint FROM awa.receipt_completion_batches)
        AS batched,
    (SELECT count(*)::bigint FROM awa.done_entries WHERE state = 'completed') AS single
"""


@dataclass
class Noop:
    """A job's arguments: its number."""

    i: int


async def setup(name: str) -> awa.AsyncClient:
    """A fresh database with awa's schema and its queue-storage engine active, which a
    fresh install gets (`install_queue_storage` selects it without starting a runtime)."""
    dsn = await fresh_database(name)
    client = awa.AsyncClient(dsn, max_connections=MAX_CONNECTIONS)
    await client.migrate()
    await client.install_queue_storage()
    engine = json.loads(await client.storage_status())["active_engine"]
    assert engine == "queue_storage", f"awa's active engine is {engine}"
    return client


async def backlog(client: awa.AsyncClient, n: int) -> None:
    for start in range(0, n, 5_000):
        await client.enqueue_many_copy([Noop(i) for i in range(start, min(n, start + 5_000))])


async def completions(client: awa.AsyncClient) -> int:
    """Completed jobs, as awa's exact queue counts add them up on its fast path: the
    compact completion batches of queue storage plus single terminal rows. (`queue_stats`
    also counts the available ones, a query that ran for minutes on this table.)"""
    tx = await client.transaction()
    try:
        row = await tx.fetch_one(COMPLETED)
    finally:
        await tx.rollback()
    return int(row["batched"]) + int(row["single"])


async def enqueue_many() -> None:
    client = await setup("bench_awa_enqueue_many")
    await client.enqueue_many_copy([Noop(-1)] * BATCH)  # warm-up, untimed
    with Timer() as t:
        for start in range(0, N, BATCH):
            await client.enqueue_many_copy([Noop(i) for i in range(start, start + BATCH)])
    await client.close()
    emit(
        {
            "system": "awa",
            "workload": "enqueue_many",
            "jobs": N,
            "seconds": t.seconds,
            "rate": N / t.seconds,
            "settings": {"call": "enqueue_many_copy"},
        }
    )
    await drop_database("bench_awa_enqueue_many")


async def run_backlog(name: str, n: int, max_workers: int, sleep: float) -> dict[str, Any]:
    """Enqueue ``n`` jobs, then time a runtime of ``max_workers`` from its start until every
    handler has returned and `shutdown` has written the last completions."""
    client = await setup(name)
    await backlog(client, n)
    done = 0
    finished = asyncio.Event()

    @client.task(Noop)
    async def noop(job: awa.Job[Noop]) -> None:
        nonlocal done
        if sleep:
            await asyncio.sleep(sleep)
        done += 1
        if done == n:
            finished.set()

    with CpuMeter(name) as cpu, Timer() as t:
        await client.start(
            [{"name": "default", "max_workers": max_workers}], poll_interval_ms=POLL_INTERVAL_MS
        )
        await finished.wait()
        handlers = time.perf_counter() - t.start
        await client.shutdown()
    completed = await completions(client)
    await client.close()
    assert completed == n, f"only {completed} of {n} jobs completed"
    await drop_database(name)
    return {
        "system": "awa",
        "jobs": n,
        "seconds": t.seconds,
        "rate": n / t.seconds,
        "rate_handlers": n / handlers,  # until the last handler returned
        **cpu.per_job_us(n),
        "settings": {
            "max_workers": max_workers,
            "max_connections": MAX_CONNECTIONS,
            "poll_interval_ms": POLL_INTERVAL_MS,
        },
    }


async def drain(max_workers: int) -> None:
    result = await run_backlog("bench_awa_drain", N, max_workers, 0.0)
    emit({**result, "workload": "drain"})


async def io() -> None:
    result = await run_backlog("bench_awa_io", IO_JOBS, IO_CONCURRENCY, IO_SECONDS)
    emit({**result, "workload": "io"})


if __name__ == "__main__":
    dispatch(
        {
            "enqueue_many": enqueue_many,
            "drain": lambda max_workers="256": drain(int(max_workers)),
            "io": io,
        }
    )
