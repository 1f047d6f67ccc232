"""Efficiency with I/O-bound jobs: one worker draining jobs that each await ``DURATION``
(10 ms), at concurrency 10, 100 and 1,000, against the ideal (concurrency / duration).

`python benchmarks/bench_io.py [ROUNDS [CONCURRENCY ...]]` (defaults: 3 rounds; 10 100
1000) enqueues, per run, enough jobs for about three seconds of ideal work (3,000 to
60,000), drains them with an in-process worker (uvloop when installed), and takes the rate
from the database's own clock: jobs / (last finalized_at - first attempted_at), so the
worker's start and stop are not counted. Each round runs every concurrency twice, with
claiming ahead as by default and with it off (claim_ahead=0). Prints each run and the
median per concurrency and mode.
"""

from __future__ import annotations

import asyncio
import statistics
import sys

import anyio
from common import emit, fresh_database, pgq_backlog

import pgq
from pgq import migrate

DURATION = 0.010
app = pgq.App()


@app.task
async def io_job(ctx: pgq.JobContext, i: int) -> None:
    """A job that waits on I/O for DURATION."""
    await asyncio.sleep(DURATION)


async def run_once(dsn: str, concurrency: int, claim_ahead: int) -> tuple[int, float]:
    ideal = concurrency / DURATION
    n = min(60_000, max(3_000, int(ideal * 3)))
    await pgq_backlog(dsn, app, io_job, n)
    worker = pgq.Worker(app, dsn, concurrency=concurrency, claim_ahead=claim_ahead, metrics=False)
    await worker.run(burst=True)
    async with pgq.Client(dsn) as client:
        span = await client.pool.fetchval(
            "SELECT extract(epoch FROM max(finalized_at) - min(attempted_at)) FROM pgq_jobs"
        )
        done = await client.pool.fetchval("SELECT count(*) FROM pgq_jobs WHERE state = 'completed'")
    assert done == n, f"{done} of {n} completed"
    return n, n / float(span)


async def main(rounds: int, levels: list[int]) -> None:
    dsn = await fresh_database("pgq_bench_io")
    await migrate.upgrade_async(dsn)
    modes = {"ahead auto": -1, "ahead off": 0}
    rates: dict[tuple[int, str], list[float]] = {(c, m): [] for c in levels for m in modes}
    for r in range(rounds):
        for c in levels:
            for mode, ahead in modes.items():
                n, rate = await run_once(dsn, c, ahead)
                rates[c, mode].append(rate)
                print(
                    f"round {r + 1}: concurrency {c}, {mode}: {n:,} jobs, {rate:,.0f}/s",
                    flush=True,
                )
    print(
        f"\n{'concurrency':>11} {'mode':>10} {'jobs/s (median)':>16} {'ideal':>8} "
        f"{'efficiency':>10}"
    )
    medians = {}
    for (c, mode), values in rates.items():
        median = statistics.median(values)
        ideal = c / DURATION
        print(f"{c:11} {mode:>10} {median:16,.0f} {ideal:8,.0f} {median / ideal:10.2f}")
        medians[f"{c} {mode}"] = median
    emit({"system": "pgq", "workload": "io_10ms", "rounds": rounds, "medians": medians})


if __name__ == "__main__":
    args = sys.argv[1:]
    rounds = int(args[0]) if args else 3
    levels = [int(a) for a in args[1:]] or [10, 100, 1000]
    try:
        import uvloop
    except ImportError:
        anyio.run(main, rounds, levels)
    else:
        anyio.run(main, rounds, levels, backend_options={"use_uvloop": True})
        del uvloop
