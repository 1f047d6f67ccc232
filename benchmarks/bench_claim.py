"""The database side of the worker's hot path, one statement at a time: how long pgq's claim
of 500 jobs and the write of their 500 completions take, from a table of each size given.

`python benchmarks/bench_claim.py [ROWS ...]` (default 20000 100000) fills a fresh database
with ROWS available no-op jobs (analyzed, as a drain starts), then empties it with
`claims.claim` of 500 at a time on one connection, writing each batch's completions with
`claims.complete_successes` before the next claim, and prints the median and p90 of each
statement as the client saw it, and whether the claim's plan scans the whole table. Run it
with `PYTHONPATH=TREE/src` to compare two versions of the SQL in one sitting.
"""

from __future__ import annotations

import statistics
import sys
import time
import uuid

import asyncpg
from common import drop_database, emit, fresh_database, percentile, pgq_backlog, pgq_migrate, run

import pgq
from pgq._store import claims, sql
from pgq._store.connections import WORKER_SESSION_SETTINGS

BATCH = 500
app = pgq.App()


@app.task
async def noop(ctx: pgq.JobContext, i: int) -> None:
    """A job that does nothing."""


async def measure(rows: int) -> dict[str, float | int | bool]:
    name = "pgq_bench_claim"
    dsn = await fresh_database(name)
    await pgq_migrate(dsn)
    await pgq_backlog(dsn, app, noop, rows)
    plan = claims.ClaimPlan("default", ("noop",), (None,), (25,))
    conn = await asyncpg.connect(dsn, server_settings=WORKER_SESSION_SETTINGS)
    try:
        explained = await conn.fetchval(
            "EXPLAIN (FORMAT JSON) " + sql.CLAIM_JOBS,
            plan.queue, list(plan.tasks), BATCH, uuid.uuid4(), list(plan.timeouts),
            list(plan.max_attempts), "bench",
        )  # fmt: skip
        claim_s: list[float] = []
        complete_s: list[float] = []
        producer = uuid.uuid4()
        while True:
            started = time.perf_counter()
            jobs = await claims.claim(conn, plan, producer, "bench", BATCH)
            claim_s.append(time.perf_counter() - started)
            if not jobs:
                break
            started = time.perf_counter()
            await claims.complete_successes(
                conn, [j.id for j in jobs], [j.attempt_token for j in jobs], [None] * len(jobs)
            )
            complete_s.append(time.perf_counter() - started)
    finally:
        await conn.close()
    await drop_database(name)
    claim_s.pop()  # the last, empty claim
    return {
        "rows": rows,
        "claims": len(claim_s),
        "claim_median_ms": statistics.median(claim_s) * 1000,
        "claim_p90_ms": percentile(claim_s, 90) * 1000,
        "complete_median_ms": statistics.median(complete_s) * 1000,
        "complete_p90_ms": percentile(complete_s, 90) * 1000,
        "claim_scans_table": "Seq Scan" in explained,
    }


async def main(sizes: list[int]) -> None:
    for rows in sizes:
        r = await measure(rows)
        print(
            f"{rows:>9,} rows: claim of {BATCH} median {r['claim_median_ms']:.2f} ms "
            f"(p90 {r['claim_p90_ms']:.2f}), its completions {r['complete_median_ms']:.2f} ms "
            f"(p90 {r['complete_p90_ms']:.2f}); claim plan scans the table: "
            f"{r['claim_scans_table']}",
            flush=True,
        )
        emit({"system": "pgq", "workload": "claim_statements", **r})


if __name__ == "__main__":
    run(lambda: main([int(a) for a in sys.argv[1:]] or [20_000, 100_000]))
