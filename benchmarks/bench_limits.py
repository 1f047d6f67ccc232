"""What flow control costs the claim: the no-op drain of one worker on a queue without
limits, with limits that never bind, with limits that do, per key, and with dependencies.

`python benchmarks/bench_limits.py [ROUNDS] [MODE ...]` drains 20,000 no-op jobs per run
(default concurrency 10), in interleaved rounds (default 5), each from a table of exactly
those jobs with fresh statistics, and prints the median jobs/s of each mode. Modes:
`unlimited`, `limited` (concurrency 10,000 and a rate of 1,000,000 a second: the limited
claim's own cost), `concurrency-5` (a limit below the worker's 10 slots), `keyed-100`
(jobs spread over 100 limit keys, a per-key limit that never binds: the per-key claim's
own cost), `keyed-1000-1` (1,000 keys, at most 1 running per key), `chained` (2,000
chains of 10 jobs, each waiting for the one before: the dependency trigger's cost; the
table's jobs are enqueued as chains, one statement each).
Run it with PYTHONPATH pointing at another checkout's src to compare two versions of the
unlimited claim.
"""

from __future__ import annotations

import statistics
import sys
import time

import anyio
from common import fresh_database, pgq_migrate, reset_jobs

import pgq

N = 20_000
app = pgq.App()


@app.task
async def noop(ctx: pgq.JobContext, i: int) -> None:
    """Nothing: the queue's own cost."""


async def fill(dsn: str, mode: str) -> None:
    await reset_jobs(dsn)
    keys = {"keyed-100": 100, "keyed-1000-1": 1_000}.get(mode)
    async with pgq.Client(dsn, app=app) as client:
        if mode == "chained":
            for start in range(0, N, 10):
                await client.enqueue_chain(
                    [pgq.JobSpec(noop, {"i": i}) for i in range(start, start + 10)]
                )
        for start in range(0, N if mode != "chained" else 0, 5_000):
            await client.enqueue_many(
                [
                    pgq.JobSpec(noop, {"i": i}, limit_key=str(i % keys) if keys else None)
                    if keys
                    else pgq.JobSpec(noop, {"i": i})
                    for i in range(start, start + 5_000)
                ]
            )
    await reset_jobs(dsn, analyze=True)


async def drain(dsn: str, mode: str) -> float:
    async with pgq.Client(dsn) as client:
        if mode == "limited":
            await client.set_queue_limits("default", concurrency=10_000, rate=(1_000_000, 1.0))
        elif mode == "concurrency-5":
            await client.set_queue_limits("default", concurrency=5)
        elif mode == "keyed-100":
            await client.set_queue_limits("default", key_concurrency=10_000)
        elif mode == "keyed-1000-1":
            await client.set_queue_limits("default", key_concurrency=1)
        elif hasattr(client, "set_queue_limits"):
            await client.set_queue_limits("default")
    await fill(dsn, mode)
    worker = pgq.Worker(app, dsn, metrics=False) if _has_metrics() else pgq.Worker(app, dsn)
    started = time.perf_counter()
    await worker.run(burst=True)
    return N / (time.perf_counter() - started)


def _has_metrics() -> bool:
    return "metrics" in pgq.WorkerSettings.__dataclass_fields__


async def main(rounds: int, modes: list[str]) -> None:
    dsn = await fresh_database("pgq_bench_limits")
    await pgq_migrate(dsn)  # in a process of its own: alembic is not the worker's
    rates: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(rounds):
        for mode in modes:
            rates[mode].append(await drain(dsn, mode))
        print(f"round {r + 1}: " + ", ".join(f"{m}: {v[-1]:,.0f}" for m, v in rates.items()))
    base = statistics.median(rates[modes[0]])
    print(f"\n{'mode':16} {'jobs/s (median)':>16} {'vs ' + modes[0]:>16}")
    for mode, values in rates.items():
        median = statistics.median(values)
        print(f"{mode:16} {median:16,.0f} {median / base:16.3f}")


if __name__ == "__main__":
    args = sys.argv[1:]
    n = int(args.pop(0)) if args and args[0].isdigit() else 5
    anyio.run(main, n, args or ["unlimited", "limited", "concurrency-5"])
