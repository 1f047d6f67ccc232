"""pgq's side of the benchmark: `python bench_pgq.py WORKLOAD`."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import anyio
import asyncpg
from common import (
    IO_CONCURRENCY,
    IO_JOBS,
    IO_SECONDS,
    CpuMeter,
    Timer,
    cli_environment,
    dispatch,
    drop_database,
    emit,
    fresh_database,
    pgq_migrate,
)

import pgq

N = 20_000
BATCH = 1_000
#: The CLI drain's backlog: large enough that starting and stopping the processes (about
#: 0.3 s each on this machine) does not decide the figure.
N_CLI = 100_000

app = pgq.App()

#: When the last no-op job returned (time.perf_counter()), for the drain's handler rate.
returned = [0.0]


@app.task
async def noop(ctx: pgq.JobContext, i: int) -> None:
    """A job that does nothing: measures the queue, not the work."""
    returned[0] = time.perf_counter()


async def setup(name: str) -> str:
    dsn = await fresh_database(name)
    await pgq_migrate(dsn)
    return dsn


async def enqueue_many() -> None:
    dsn = await setup("bench_pgq_enqueue_many")
    async with pgq.Client(dsn, app=app) as client:
        await client.enqueue_many([pgq.JobSpec(noop, {"i": -1})] * BATCH)  # warm-up, untimed
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


async def drain(concurrency: int, database: str | None = None) -> None:
    """Drain 20,000 jobs at ``concurrency`` on database ``database`` (dropped first and
    after; by default named after this process, so that drains run side by side on one
    server do not drop each other's)."""
    database = database or f"bench_pgq_drain_{os.getpid()}"
    dsn = await setup(database)
    async with pgq.Client(dsn, app=app) as client:
        for start in range(0, N, 5_000):
            await client.enqueue_many(
                [pgq.JobSpec(noop, {"i": i}) for i in range(start, start + 5_000)]
            )
    # Completions notify pgq_done on commit with the ids: the last one's arrival is when the
    # last outcome was durable.
    listener = await asyncpg.connect(dsn)
    finals = [0, 0.0]
    all_final = anyio.Event()

    def on_done(*args: object) -> None:
        finals[0] += str(args[3]).count(",") + 1
        finals[1] = time.perf_counter()
        if finals[0] >= N:
            all_final.set()

    await listener.add_listener("pgq_done", on_done)
    process_cpu = time.process_time()
    with CpuMeter(database) as cpu, Timer() as t:
        await pgq.Worker(app, dsn, concurrency=concurrency).run(burst=True)
    process_cpu = time.process_time() - process_cpu
    conn = await asyncpg.connect(dsn)
    done = await conn.fetchval("SELECT count(*) FROM pgq_jobs WHERE state = 'completed'")
    await conn.close()
    with anyio.fail_after(10):
        await all_final.wait()
    await listener.close()
    assert done == N, f"only {done} of {N} jobs completed"
    # Rates over the time from the worker's start to its last handler's return (handler
    # rate), to its last outcome's commit (durable rate), and to its return (rate, with
    # its shut-down): outcomes that keep up with the handlers leave the first two close.
    handlers_s = returned[0] - t.start
    durable_s = finals[1] - t.start
    emit(
        {
            "system": "pgq",
            "workload": "drain",
            "jobs": N,
            "seconds": t.seconds,
            "rate": N / t.seconds,
            "handler_rate": N / handlers_s,
            "durable_rate": N / durable_s,
            # The worker process's CPU time over the drain's: how busy it was.
            "busy": process_cpu / t.seconds,
            **cpu.per_job_us(N),
            "settings": {"concurrency": concurrency},
        }
    )
    await drop_database(database)


@app.task
async def io_job(ctx: pgq.JobContext, i: int) -> None:
    """A job that waits on I/O for IO_SECONDS."""
    await anyio.sleep(IO_SECONDS)


async def io() -> None:
    """IO_JOBS jobs of IO_SECONDS each at concurrency IO_CONCURRENCY, timed as the drain
    is (bench_io.py measures pgq alone on the database's clock)."""
    dsn = await setup("bench_pgq_io")
    async with pgq.Client(dsn, app=app) as client:
        for start in range(0, IO_JOBS, 5_000):
            await client.enqueue_many(
                [pgq.JobSpec(io_job, {"i": i}) for i in range(start, start + 5_000)]
            )
    with CpuMeter("bench_pgq_io") as cpu, Timer() as t:
        await pgq.Worker(app, dsn, concurrency=IO_CONCURRENCY).run(burst=True)
    conn = await asyncpg.connect(dsn)
    done = await conn.fetchval("SELECT count(*) FROM pgq_jobs WHERE state = 'completed'")
    await conn.close()
    assert done == IO_JOBS, f"only {done} of {IO_JOBS} jobs completed"
    emit(
        {
            "system": "pgq",
            "workload": "io",
            "jobs": IO_JOBS,
            "seconds": t.seconds,
            "rate": IO_JOBS / t.seconds,
            **cpu.per_job_us(IO_JOBS),
            "settings": {"concurrency": IO_CONCURRENCY},
        }
    )
    await drop_database("bench_pgq_io")


async def drain_cli(concurrency: int | None, processes: int) -> None:
    """The drain as users run it: ``processes`` `pgq worker --burst` processes started by
    the CLI (default settings unless ``concurrency``), timed from their start until the
    last job is completed (database clock: first attempt to last finish, and wall clock
    until every process has exited)."""
    import subprocess
    import sys

    name = f"bench_pgq_drain_cli_{processes}"
    dsn = await fresh_database(name)
    await pgq_migrate(dsn)
    async with pgq.Client(dsn, app=app) as client:
        for start in range(0, N_CLI, 5_000):
            await client.enqueue_many(
                [pgq.JobSpec(noop, {"i": i}) for i in range(start, start + 5_000)]
            )
    argv = [sys.executable, "-m", "pgq", "worker", "bench_pgq:app", "--burst", "--dsn", dsn]
    if concurrency is not None:
        argv += ["--concurrency", str(concurrency)]
    env = cli_environment(str(Path(__file__).resolve().parent))
    with Timer() as t:
        procs = [
            subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            for _ in range(processes)
        ]
        for proc in procs:
            _, err = await anyio.to_thread.run_sync(proc.communicate)
            assert proc.returncode == 0, err.decode()[-2000:]
    conn = await asyncpg.connect(dsn)
    done = await conn.fetchval("SELECT count(*) FROM pgq_jobs WHERE state = 'completed'")
    span = await conn.fetchval(
        "SELECT extract(epoch FROM max(finalized_at) - min(attempted_at)) FROM pgq_jobs"
    )
    await conn.close()
    assert done == N_CLI, f"only {done} of {N_CLI} jobs completed"
    emit(
        {
            "system": "pgq",
            "workload": f"drain_cli_{processes}",
            "jobs": N_CLI,
            "seconds": t.seconds,
            "rate": N_CLI / t.seconds,
            "rate_db_clock": N_CLI / float(span),
            "settings": {"concurrency": concurrency or "default", "processes": processes},
        }
    )
    await drop_database(name)


async def enqueue_one() -> None:
    dsn = await setup("bench_pgq_enqueue")
    async with pgq.Client(dsn, app=app) as client:
        for i in range(50):  # warm-up, untimed
            await client.enqueue(noop, {"i": -i})
        with Timer() as t:
            for i in range(1_000):
                await client.enqueue(noop, {"i": i})
    emit(
        {
            "system": "pgq",
            "workload": "enqueue",
            "jobs": 1_000,
            "seconds": t.seconds,
            "rate": 1_000 / t.seconds,
        }
    )
    await drop_database("bench_pgq_enqueue")


async def latency() -> None:
    import latency as driver

    dsn = await setup("bench_pgq_latency")
    async with pgq.Client(dsn, app=app) as client:

        async def enqueue(seq: int) -> None:
            await client.enqueue(stamp, {"seq": seq})

        out = Path(tempfile.mkdtemp()) / "pgq.json"
        result = await driver.drive(Path(__file__), dsn, enqueue, out)
    emit({"system": "pgq", "workload": "latency", **result})
    await drop_database("bench_pgq_latency")


started: dict[int, float] = {}


@app.task
async def stamp(ctx: pgq.JobContext, seq: int) -> None:
    """Record when the job started (latency benchmark)."""
    started[seq] = time.time()
    if len(started) >= _expected[0]:
        _worker[0].stop()


_expected = [0]
_worker: list[pgq.Worker] = []


async def latency_worker(dsn: str, out: str, n: int) -> None:
    _expected[0] = n
    worker = pgq.Worker(app, dsn, concurrency=100)
    _worker.append(worker)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        await worker.started.wait()
        print("READY", flush=True)
    Path(out).write_text(json.dumps(started))


if __name__ == "__main__":
    dispatch(
        {
            "enqueue_many": enqueue_many,
            "enqueue": enqueue_one,
            "drain": lambda concurrency="100", *database: drain(int(concurrency), *database),
            "drain-cli": lambda concurrency="default", processes="1": drain_cli(
                None if concurrency == "default" else int(concurrency), int(processes)
            ),
            "io": io,
            "latency": latency,
            "latency-worker": lambda dsn, out, n: latency_worker(dsn, out, int(n)),
        }
    )
