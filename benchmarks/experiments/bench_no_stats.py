"""Does the claim stay fast on a jobs table without column statistics?

Answer: on the claim connections, yes: a claim of 10 from 100,000 waiting jobs took 0.50 ms
on a table vacuumed but never analyzed, against 35 ms at the server's defaults
(docs/performance.md).

The claim on a jobs table without column statistics (docs/performance.md, "Keep the jobs
table analyzed"; the leader analyzes such a table, src/pgq/_worker/leader/services.py).

`python benchmarks/experiments/bench_no_stats.py [AVAILABLE]` (default 100,000) fills a fresh
database's jobs table with AVAILABLE jobs of one queue, with autovacuum off for the table, and
times the claim statement (10 jobs, as a worker at its defaults claims) 50 times in each of
four states of the table's statistics, on a connection with the settings of the worker's claim
connections (index scans only) and on one with the server's defaults:

- `never vacuumed or analyzed`: the planner knows only the table's size (its row count was
  never taken), as in a new deployment before autovacuum's first visit;
- `vacuumed, never analyzed`: after `VACUUM` without `ANALYZE`, the table's size is known
  to the planner but no column has statistics (as where autovacuum vacuums the table while
  its analyze thresholds hold autoanalyze off);
- `analyzed`: after `ANALYZE`;
- `analyzed with no job waiting, then filled`: statistics taken from 1,000 finished jobs,
  then AVAILABLE jobs enqueued (the table emptied first).

Prints the p50 and p99 of each, and how many jobs a second one claimer could take at that
p50.
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, run

import asyncpg
from common import drop_database, emit, fresh_database, pgq_migrate, run, summary_ms

from pgq._db import sql
from pgq._db.connections import CLAIM_SESSION_SETTINGS

CLAIMS = 50
LIMIT = 10


async def claim_times(conn: asyncpg.Connection[asyncpg.Record]) -> list[float]:
    producer = uuid.uuid4()
    times = []
    for _ in range(CLAIMS):
        t = time.perf_counter()
        rows = await conn.fetch(
            sql.CLAIM_JOBS, "default", ["noop"], LIMIT, producer, [None], [20], "bench", False
        )
        times.append(time.perf_counter() - t)
        assert len(rows) == LIMIT, f"claimed {len(rows)} of {LIMIT}"
    return times


FILL = (
    "INSERT INTO pgq_jobs (task, args) SELECT 'noop', jsonb_build_object('i', g)"
    " FROM generate_series(1, $1::int) g"
)
#: Finished jobs the third state's statistics are taken from, before the backlog arrives.
QUIET = (
    "INSERT INTO pgq_jobs (task, args, state, attempt, max_attempts, attempted_at,"
    " finalized_at) SELECT 'noop', '{}', 'completed', 1, 20, now(), now()"
    " FROM generate_series(1, 1000)"
)


async def main(available: int = 100_000) -> None:
    dsn = await fresh_database("bench_pgq_no_stats")
    await pgq_migrate(dsn)
    conn = await asyncpg.connect(dsn)
    claimers = {
        "worker's claim connection": await asyncpg.connect(
            dsn, server_settings=CLAIM_SESSION_SETTINGS
        ),
        "server's defaults": await asyncpg.connect(dsn),
    }
    result: dict[str, object] = {"system": "pgq", "workload": "no_stats", "available": available}

    async def measure(state: str) -> None:
        for name, claimer in claimers.items():
            times = summary_ms(await claim_times(claimer))
            result[f"{state}, {name}"] = times
            rate = LIMIT / (times["p50_ms"] / 1000)
            print(
                f"{state:>41}, {name:>25}: claim of {LIMIT} p50 {times['p50_ms']:8.2f} ms,"
                f" p99 {times['p99_ms']:8.2f} ms (about {rate:,.0f} jobs/s for one claimer)",
                flush=True,
            )

    try:
        await conn.execute("ALTER TABLE pgq_jobs SET (autovacuum_enabled = false)")
        await conn.execute(FILL, available)
        await measure("never vacuumed or analyzed")
        await conn.execute("VACUUM pgq_jobs")
        await measure("vacuumed, never analyzed")
        await conn.execute("ANALYZE pgq_jobs")
        await measure("analyzed")
        await conn.execute("TRUNCATE pgq_jobs")
        await conn.execute(QUIET)
        await conn.execute("ANALYZE pgq_jobs")
        await conn.execute(FILL, available)
        await measure("analyzed with no job waiting, then filled")
        emit(result)
    finally:
        for c in (conn, *claimers.values()):
            await c.close()
        await drop_database("bench_pgq_no_stats")


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    run(lambda: main(count))
