"""CPU time the worker's process spends per job, and the client's per job enqueued: steadier
figures than rates on a shared machine, for comparing two versions of the hot paths.

`python benchmarks/bench_cpu_per_job.py [ROUNDS [CONCURRENCY]]` (defaults: 5 rounds, 1000)
drains 60,000 jobs per round with an in-process worker (uvloop when installed, metrics
off), no-op jobs and jobs that await 10 ms in turn, and prints the process's CPU time
(user + system, `time.process_time`) per job during `run(burst=True)`, with the drain's
rate beside it; then the client's CPU time per job of `enqueue_many` (20,000 jobs in
batches of 1,000, specs built in the timed loop as in bench_pgq.py). To compare two trees, run it twice in turn with `PYTHONPATH=TREE/src`
pointing at each (the migrations come from that tree too).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

from common import emit, fresh_database, pgq_backlog, pgq_migrate, run

import pgq

N = 60_000
app = pgq.App()


@app.task
async def noop(ctx: pgq.JobContext, i: int) -> None:
    """A job that does nothing."""


@app.task
async def io_job(ctx: pgq.JobContext, i: int) -> None:
    """A job that waits on I/O for 10 ms."""
    await asyncio.sleep(0.010)


async def drain(dsn: str, task: pgq.Task, n: int, concurrency: int) -> tuple[float, float]:
    """CPU microseconds per job and jobs/s of one burst drain of ``n`` jobs of ``task``."""
    await pgq_backlog(dsn, app, task, n)
    worker = pgq.Worker(app, dsn, concurrency=concurrency, metrics=False)
    cpu, wall = time.process_time(), time.perf_counter()
    await worker.run(burst=True)
    return (time.process_time() - cpu) / n * 1e6, n / (time.perf_counter() - wall)


async def enqueue(dsn: str) -> tuple[float, float]:
    """Client CPU microseconds per job and jobs/s of ``enqueue_many``, 20,000 in batches of
    1,000 (the database's time is not in the CPU figure: it runs in its own processes)."""
    async with pgq.Client(dsn, app=app) as client:
        cpu, wall = time.process_time(), time.perf_counter()
        for start in range(0, 20_000, 1_000):
            await client.enqueue_many(
                [pgq.JobSpec(noop, {"i": i}) for i in range(start, start + 1_000)]
            )
        return (time.process_time() - cpu) / 20_000 * 1e6, 20_000 / (time.perf_counter() - wall)


def report(name: str, label: str, runs: list[tuple[float, float]]) -> dict[str, float]:
    """Print one line of a workload's rounds; returns its medians."""
    cpu = [c for c, _ in runs]
    rate = [r for _, r in runs]
    print(
        f"{name:8} {label}: CPU per job "
        + " ".join(f"{c:.1f}" for c in cpu)
        + f" us (median {statistics.median(cpu):.1f}); rate median "
        + f"{statistics.median(rate):,.0f}/s"
    )
    return {"cpu_us": statistics.median(cpu), "rate": statistics.median(rate)}


async def main(rounds: int, concurrency: int) -> None:
    dsn = await fresh_database("pgq_bench_cpu")
    await pgq_migrate(dsn)  # in a process of its own: alembic is not the worker's
    await drain(dsn, noop, 20_000, concurrency)  # warm-up, untimed
    medians = {}
    for name, task in (("noop", noop), ("io_10ms", io_job)):
        runs = [await drain(dsn, task, N, concurrency) for _ in range(rounds)]
        medians[name] = report(name, f"concurrency {concurrency}", runs)
    await enqueue(dsn)  # warm-up, untimed
    runs = [await enqueue(dsn) for _ in range(rounds)]
    medians["enqueue_many"] = report("enqueue", "many, batches of 1,000", runs)
    print(f"pgq from {pgq.__file__}")
    emit({"system": "pgq", "workload": "cpu_per_job", "rounds": rounds, "medians": medians})


if __name__ == "__main__":
    args = sys.argv[1:]
    run(lambda: main(int(args[0]) if args else 5, int(args[1]) if len(args) > 1 else 1000))
