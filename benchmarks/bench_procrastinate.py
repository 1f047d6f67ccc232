"""procrastinate's side of the benchmark: `python bench_procrastinate.py WORKLOAD [N]`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg
import procrastinate
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


def make_app(dsn: str) -> Any:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="noop")
    async def noop(i: int) -> None:
        """A job that does nothing."""

    @app.task(name="io")
    async def io_job(i: int) -> None:
        """A job that waits on I/O for IO_SECONDS."""
        await asyncio.sleep(IO_SECONDS)

    return app


async def setup(name: str) -> tuple[str, Any]:
    dsn = await fresh_database(name)
    app = make_app(dsn)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
    return dsn, app


async def enqueue_many() -> None:
    _, app = await setup("bench_procrastinate_enqueue_many")
    async with app.open_async():
        noop = app.tasks["noop"]
        await noop.batch_defer_async(*({"i": -1} for _ in range(BATCH)))  # warm-up, untimed
        with Timer() as t:
            for start in range(0, N, BATCH):
                await noop.batch_defer_async(*({"i": i} for i in range(start, start + BATCH)))
    emit(
        {
            "system": "procrastinate",
            "workload": "enqueue_many",
            "jobs": N,
            "seconds": t.seconds,
            "rate": N / t.seconds,
        }
    )
    await drop_database("bench_procrastinate_enqueue_many")


async def enqueue_one() -> None:
    _, app = await setup("bench_procrastinate_enqueue")
    async with app.open_async():
        noop = app.tasks["noop"]
        for i in range(50):  # warm-up, untimed
            await noop.defer_async(i=-i)
        with Timer() as t:
            for i in range(1_000):
                await noop.defer_async(i=i)
    emit(
        {
            "system": "procrastinate",
            "workload": "enqueue",
            "jobs": 1_000,
            "seconds": t.seconds,
            "rate": 1_000 / t.seconds,
        }
    )
    await drop_database("bench_procrastinate_enqueue")


async def drain(concurrency: int) -> None:
    result = await run_backlog("bench_procrastinate_drain", "noop", N, concurrency)
    emit({**result, "workload": "drain"})


async def io() -> None:
    result = await run_backlog("bench_procrastinate_io", "io", IO_JOBS, IO_CONCURRENCY)
    emit({**result, "workload": "io"})


async def run_backlog(name: str, task: str, n: int, concurrency: int) -> dict[str, Any]:
    """Enqueue ``n`` jobs of ``task``, then time a worker that stops when none is left."""
    dsn, app = await setup(name)
    async with app.open_async():
        deferrer = app.tasks[task]
        for start in range(0, n, 5_000):
            await deferrer.batch_defer_async(*({"i": i} for i in range(start, start + 5_000)))
        with CpuMeter(name) as cpu, Timer() as t:
            await app.run_worker_async(
                concurrency=concurrency,
                wait=False,
                install_signal_handlers=False,
                delete_jobs="never",
            )
    conn = await asyncpg.connect(dsn)
    done = await conn.fetchval("SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'")
    await conn.close()
    assert done == n, f"only {done} of {n} jobs succeeded"
    await drop_database(name)
    return {
        "system": "procrastinate",
        "jobs": n,
        "seconds": t.seconds,
        "rate": n / t.seconds,
        **cpu.per_job_us(n),
        "settings": {"concurrency": concurrency},
    }


async def latency() -> None:
    import latency as driver

    dsn, app = await setup("bench_procrastinate_latency")
    async with app.open_async():

        async def enqueue(seq: int) -> None:
            await app.configure_task("stamp").defer_async(seq=seq)

        out = Path(tempfile.mkdtemp()) / "procrastinate.json"
        result = await driver.drive(Path(__file__), dsn, enqueue, out)
    emit({"system": "procrastinate", "workload": "latency", **result})
    await drop_database("bench_procrastinate_latency")


async def latency_worker(dsn: str, out: str, n: int) -> None:
    app = make_app(dsn)
    started: dict[int, float] = {}
    done = asyncio.Event()

    @app.task(name="stamp")
    async def stamp(seq: int) -> None:
        """Record when the job started."""
        started[seq] = time.time()
        if len(started) >= n:
            done.set()

    async with app.open_async():
        worker = asyncio.create_task(
            app.run_worker_async(concurrency=10, install_signal_handlers=False)
        )
        await asyncio.sleep(0.5)
        print("READY", flush=True)
        await done.wait()
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
    Path(out).write_text(json.dumps(started))


if __name__ == "__main__":
    dispatch(
        {
            "enqueue_many": enqueue_many,
            "enqueue": enqueue_one,
            "drain": lambda concurrency="10": drain(int(concurrency)),
            "io": io,
            "latency": latency,
            "latency-worker": lambda dsn, out, n: latency_worker(dsn, out, int(n)),
        }
    )
