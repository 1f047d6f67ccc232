"""Big backlogs: `python bench_backlog.py [claim|enqueue|all] [ROUNDS]`.

- `claim`: the claim statement (10 jobs, as a producer with free slots sends it) timed on
  a table holding 1,000,000 available jobs and 5,000,000 finished ones, beside the same
  claim on a small table (50,000 available, nothing finished), one claim on each in turn
  so that the machine's noise falls on both alike; prints p50/p99 of each and the ratio of
  the p99s (target: at most 1.5).
- `enqueue`: `enqueue_many` of 1,000,000 jobs in batches of 10,000, pgq and PgQueuer in
  turn for ROUNDS rounds (default 3), each into a fresh database; prints the median rate
  of each and their ratio (target: pgq at least 1.5 times PgQueuer).
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import asyncpg
from bench_pgq_table import claim_timings, fill, table_size
from common import drop_database, emit, fresh_database, pgq_migrate, run, summary_ms

import pgq

BIG_AVAILABLE = 1_000_000
BIG_FINISHED = 5_000_000
SMALL_AVAILABLE = 50_000
ENQUEUE_JOBS = 1_000_000
ENQUEUE_BATCH = 10_000

app = pgq.App()


@app.task
async def noop(ctx: pgq.JobContext, i: int) -> None:
    """Does nothing."""


async def claim() -> dict[str, Any]:
    dsns = {}
    sizes = {}
    for name, finished, available in (
        ("small", 0, SMALL_AVAILABLE),
        ("big", BIG_FINISHED, BIG_AVAILABLE),
    ):
        started = time.perf_counter()
        dsns[name] = await fresh_database(f"bench_backlog_{name}")
        await pgq_migrate(dsns[name])
        await fill(dsns[name], finished, available)
        conn = await asyncpg.connect(dsns[name])
        sizes[name] = await table_size(conn)
        await conn.close()
        print(
            f"{name}: {finished:,} finished + {available:,} available, filled in "
            f"{time.perf_counter() - started:.0f} s; heap {sizes[name]['heap_mb']:,.0f} MB,"
            f" indexes {sizes[name]['indexes_mb']:,.0f} MB",
            flush=True,
        )
    samples = await claim_timings(dsns, rounds=3_000, warmup=200)
    results = {name: summary_ms(s) for name, s in samples.items()}
    for name in dsns:
        await drop_database(f"bench_backlog_{name}")
    ratio = results["big"]["p99_ms"] / results["small"]["p99_ms"]
    for name, r in results.items():
        print(
            f"claim of 10 on the {name} table: p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms"
        )
    print(
        f"p99 big / small: {ratio:.2f} (target at most 1.5): {'met' if ratio <= 1.5 else 'NOT met'}"
    )
    return {"workload": "backlog_claim", **results, "sizes": sizes, "p99_ratio": ratio}


async def enqueue_pgq() -> float:
    dsn = await fresh_database("bench_backlog_enqueue_pgq")
    await pgq_migrate(dsn)
    async with pgq.Client(dsn, app=app) as client:
        await client.enqueue_many([pgq.JobSpec(noop, {"i": -1})] * 100)  # warm-up, untimed
        started = time.perf_counter()
        for start in range(0, ENQUEUE_JOBS, ENQUEUE_BATCH):
            await client.enqueue_many(
                [pgq.JobSpec(noop, {"i": i}) for i in range(start, start + ENQUEUE_BATCH)]
            )
        seconds = time.perf_counter() - started
    await drop_database("bench_backlog_enqueue_pgq")
    return ENQUEUE_JOBS / seconds


async def enqueue_pgqueuer() -> float:
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    dsn = await fresh_database("bench_backlog_enqueue_pgqueuer")
    conn = await asyncpg.connect(dsn)
    queries = Queries(AsyncpgDriver(conn))
    await queries.install()
    await queries.enqueue(["noop"] * 100, [b"-1"] * 100, [0] * 100)  # warm-up, untimed
    started = time.perf_counter()
    for start in range(0, ENQUEUE_JOBS, ENQUEUE_BATCH):
        await queries.enqueue(
            ["noop"] * ENQUEUE_BATCH,
            [str(i).encode() for i in range(start, start + ENQUEUE_BATCH)],
            [0] * ENQUEUE_BATCH,
        )
    seconds = time.perf_counter() - started
    await conn.close()
    await drop_database("bench_backlog_enqueue_pgqueuer")
    return ENQUEUE_JOBS / seconds


async def enqueue(rounds: int) -> dict[str, Any]:
    rates: dict[str, list[float]] = {"pgq": [], "pgqueuer": []}
    for r in range(rounds):
        for name, measure in (("pgq", enqueue_pgq), ("pgqueuer", enqueue_pgqueuer)):
            rates[name].append(await measure())
            print(f"round {r + 1}: {name} enqueue_many of 1M: {rates[name][-1]:,.0f}/s", flush=True)
    med = {name: statistics.median(v) for name, v in rates.items()}
    ratio = med["pgq"] / med["pgqueuer"]
    print(
        f"medians: pgq {med['pgq']:,.0f}/s, PgQueuer {med['pgqueuer']:,.0f}/s, ratio {ratio:.2f}"
        f" (target at least 1.5): {'met' if ratio >= 1.5 else 'NOT met'}"
    )
    return {"workload": "backlog_enqueue", "rates": rates, "medians": med, "ratio": ratio}


async def main() -> None:
    what = sys.argv[1] if len(sys.argv) > 1 else "all"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    if what not in ("claim", "enqueue", "all"):
        raise SystemExit("usage: bench_backlog.py [claim|enqueue|all] [ROUNDS]")
    if what in ("claim", "all"):
        emit({"system": "pgq", **await claim()})
    if what in ("enqueue", "all"):
        emit({"system": "pgq", **await enqueue(rounds)})


if __name__ == "__main__":
    run(lambda: main())
