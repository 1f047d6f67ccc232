"""Efficiency with I/O-bound jobs: one worker draining jobs that each await ``DURATION``
(10 ms), at concurrency 10, 100 and 1,000, against the ideal (concurrency / duration).

`python benchmarks/bench_io.py [--cli | --auto-only] [ROUNDS [CONCURRENCY ...]]` (defaults:
3 rounds; 10 100 1000) enqueues, per run, enough jobs for about three seconds of ideal work
(3,000 to 60,000), drains them with an in-process worker (uvloop when installed), and takes the rate
from the database's own clock: jobs / (last finalized_at - first attempted_at), so the
worker's start and stop are not counted. Each round runs every concurrency twice, with
claiming ahead as by default and with it off (claim_ahead=0). Prints each run and the
median per concurrency and mode. With ``--cli`` the worker is a `pgq worker --burst
--concurrency N` process started by the CLI instead, as users run it (its collector tuned,
the CLI's default), with claiming ahead as by default only. With ``--auto-only`` the worker
runs in process with claiming ahead as by default only (round2.py runs concurrency 1,000 so
in each of its rounds, beside the ceiling). With ``BENCH_GC=tuned`` the process's garbage
collector is set up first as `pgq worker` sets up its own (``pgq.tune_gc()``); by default it is left as
an embedded worker leaves its host's.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
from pathlib import Path

import anyio
from common import (
    cli_environment,
    emit,
    fresh_database,
    pgq_backlog,
    pgq_migrate,
    tune_gc_if_asked,
)

import pgq

DURATION = 0.010
app = pgq.App()


@app.task
async def io_job(ctx: pgq.JobContext, i: int) -> None:
    """A job that waits on I/O for DURATION."""
    await asyncio.sleep(DURATION)


async def run_once(dsn: str, concurrency: int, claim_ahead: int | None) -> tuple[int, float]:
    """Drain one backlog: in this process (``claim_ahead``), or, with ``claim_ahead`` None,
    in a `pgq worker` process started by the CLI at its defaults but for the concurrency."""
    ideal = concurrency / DURATION
    n = min(60_000, max(3_000, int(ideal * 3)))
    await pgq_backlog(dsn, app, io_job, n)
    if claim_ahead is None:
        await run_cli(dsn, concurrency)
    else:
        worker = pgq.Worker(
            app, dsn, concurrency=concurrency, claim_ahead=claim_ahead, metrics=False
        )
        await worker.run(burst=True)
    async with pgq.Client(dsn) as client:
        span = await client.pool.fetchval(
            "SELECT extract(epoch FROM max(finalized_at) - min(attempted_at)) FROM pgq_jobs"
        )
        done = await client.pool.fetchval("SELECT count(*) FROM pgq_jobs WHERE state = 'completed'")
    assert done == n, f"{done} of {n} completed"
    return n, n / float(span)


async def run_cli(dsn: str, concurrency: int) -> None:
    """``pgq worker bench_io:app --burst --concurrency N``, until it exits."""
    env = cli_environment(str(Path(__file__).resolve().parent))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pgq", "worker", "bench_io:app", "--burst", "--dsn", dsn,
        "--concurrency", str(concurrency),
        env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"pgq worker exited with {proc.returncode}: {err.decode()[-2000:]}")


async def main(rounds: int, levels: list[int], cli: bool, auto_only: bool) -> None:
    dsn = await fresh_database("pgq_bench_io")
    await pgq_migrate(dsn)  # in a process of its own: alembic is not the worker's
    modes: dict[str, int | None] = {"ahead auto": -1, "ahead off": 0}
    if cli:
        modes = {"cli": None}
    elif auto_only:
        modes = {"ahead auto": -1}
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
    workload = "io_10ms_cli" if cli else "io_10ms"
    result: dict[str, object] = {"system": "pgq", "workload": workload, "rounds": rounds}
    result["medians"] = medians
    if len(medians) == 1:  # one concurrency, one mode: its rate, as the other benchmarks give
        (result["rate"],) = medians.values()
    emit(result)


if __name__ == "__main__":
    args = sys.argv[1:]
    cli = "--cli" in args
    auto_only = "--auto-only" in args
    args = [a for a in args if a not in ("--cli", "--auto-only")]
    rounds = int(args[0]) if args else 3
    levels = [int(a) for a in args[1:]] or [10, 100, 1000]
    tune_gc_if_asked()
    try:
        import uvloop
    except ImportError:
        anyio.run(main, rounds, levels, cli, auto_only)
    else:
        anyio.run(main, rounds, levels, cli, auto_only, backend_options={"use_uvloop": True})
        del uvloop
