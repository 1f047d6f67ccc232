"""oban-py's side of the benchmark: `python bench_oban.py WORKLOAD [LIMIT]`.

oban-py needs Python 3.12 or newer, so it runs from benchmarks/.venv-oban (made by `make
bench` from benchmarks/requirements-oban.txt when a python3.12 is found). Its one
documented throughput knob is a queue's limit (the jobs it runs at once); the pool is
psycopg's, 10 connections as `Oban.create_pool` makes it by default. A queue's producer
fetches up to the free limit, runs each job as an asyncio task and acknowledges the jobs
finished since its last fetch at its next one (debounced by 5 ms), one `UPDATE` per job in
one transaction; `enqueue_many` is one `INSERT` per job, awaited in turn.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg
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
from oban import Oban, worker
from oban.schema import install

N = 20_000
BATCH = 1_000

state: dict[str, Any] = {"done": 0, "n": 0, "sleep": 0.0, "finished": None}


@worker(queue="default")
class Noop:
    """A job that does nothing (or waits ``state["sleep"]``)."""

    async def process(self, job: Any) -> None:
        """Count the job; the last one wakes the runner."""
        if state["sleep"]:
            await asyncio.sleep(state["sleep"])
        state["done"] += 1
        if state["done"] == state["n"]:
            state["finished"].set()


async def setup(name: str) -> tuple[str, Any]:
    dsn = await fresh_database(name)
    pool = await Oban.create_pool(dsn)
    await install(pool)
    return dsn, pool


async def enqueue_many() -> None:
    _, pool = await setup("bench_oban_enqueue_many")
    async with Oban(pool=pool) as oban:  # client mode: no queues, no leadership
        await oban.enqueue_many([Noop.new({"i": -1}) for _ in range(BATCH)])  # warm-up
        with Timer() as t:
            for start in range(0, N, BATCH):
                await oban.enqueue_many([Noop.new({"i": i}) for i in range(start, start + BATCH)])
    await pool.close()
    emit(
        {
            "system": "oban",
            "workload": "enqueue_many",
            "jobs": N,
            "seconds": t.seconds,
            "rate": N / t.seconds,
        }
    )
    await drop_database("bench_oban_enqueue_many")


async def run_backlog(name: str, n: int, limit: int, sleep: float) -> dict[str, Any]:
    """Enqueue ``n`` jobs, then time an Oban with one queue of ``limit`` from its start
    until every job has run and `stop` has acknowledged the last ones."""
    dsn, pool = await setup(name)
    async with Oban(pool=pool) as client:
        for start in range(0, n, 5_000):
            await client.enqueue_many(
                [Noop.new({"i": i}) for i in range(start, min(n, start + 5_000))]
            )
    state.update(done=0, n=n, sleep=sleep, finished=asyncio.Event())
    oban = Oban(pool=pool, queues={"default": limit})
    with CpuMeter(name) as cpu, Timer() as t:
        await oban.start()
        await state["finished"].wait()
        handlers = time.perf_counter() - t.start
        await oban.stop()
    await pool.close()
    conn = await asyncpg.connect(dsn)
    done = await conn.fetchval("SELECT count(*) FROM oban_jobs WHERE state = 'completed'")
    await conn.close()
    assert done == n, f"only {done} of {n} jobs completed"
    await drop_database(name)
    return {
        "system": "oban",
        "jobs": n,
        "seconds": t.seconds,
        "rate": n / t.seconds,
        "rate_handlers": n / handlers,  # until the last job's process() returned
        **cpu.per_job_us(n),
        "settings": {"limit": limit, "pool": 10},
    }


async def drain(limit: int) -> None:
    result = await run_backlog("bench_oban_drain", N, limit, 0.0)
    emit({**result, "workload": "drain"})


async def io() -> None:
    result = await run_backlog("bench_oban_io", IO_JOBS, IO_CONCURRENCY, IO_SECONDS)
    emit({**result, "workload": "io"})


if __name__ == "__main__":
    dispatch(
        {
            "enqueue_many": enqueue_many,
            "drain": lambda limit="10": drain(int(limit)),
            "io": io,
        }
    )
