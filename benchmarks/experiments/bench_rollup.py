"""What does the leader's throughput rollup cost per round on a busy queue?

Answer: at 5,000 jobs a second, 275,000-450,000 rows in 113-165 ms, against 625,000-750,000
rows in 210-269 ms for a recount of the two minutes before the current one
(docs/dashboard.md).

`python benchmarks/experiments/bench_rollup.py [RATE]` fills a fresh database with the jobs a queue
finishing RATE jobs a second (default 5,000) leaves in the last 150 seconds, as the soak
does with a retention of two minutes, then times one rollup round (the median of 7) two
ways, each on the same rows:

- a round 15 s after the previous one, as pgq counts now: from the start of the minute
  ``15 + LATE_S`` seconds ago (pgq._worker.leader.services);
- the same round as pgq counted before: the current minute and the two before
  it (one more for late outcomes).

Which minute the rounds fall in decides how many rows the first reads (from just under one
minute's jobs to just under two), so each is timed with "now" at second 5, 30 and 55 of a
minute; the second always reads two to three minutes'.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, run

import asyncpg
from common import fresh_database

from pgq import migrate
from pgq._worker.leader.services import LATE_S

ROUNDS = 7
SPAN_S = 150

FILL = """
INSERT INTO pgq_jobs (queue, task, args, state, attempt, max_attempts, scheduled_at,
                      attempted_at, finalized_at, created_at)
SELECT 'default', 'noop', '{}', 'completed', 1, 20, t, t, t, t
FROM generate_series(1, $1::int) AS i,
     LATERAL (SELECT $2::timestamptz - make_interval(secs => $3 * (1 - i::float8 / $1)) AS t) AS x
"""

# The rollup's count (sql.THROUGHPUT_ROLLUP without its INSERT) from $1, and the rows read.
COUNT = """
SELECT sum(completed)::bigint FROM (
    SELECT date_trunc('minute', finalized_at), queue,
           count(*) FILTER (WHERE state = 'completed') AS completed,
           count(*) FILTER (WHERE state = 'discarded') AS discarded,
           count(*) FILTER (WHERE state = 'cancelled') AS cancelled
    FROM pgq_jobs
    WHERE state IN ('completed', 'discarded', 'cancelled') AND finalized_at >= $1
    GROUP BY 1, 2
) AS minutes
"""


async def timed(conn: asyncpg.Connection[asyncpg.Record], since: object) -> tuple[float, int]:
    times, rows = [], 0
    for _ in range(ROUNDS):
        started = time.perf_counter()
        rows = await conn.fetchval(COUNT, since)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000, rows


async def main(rate: int) -> None:
    dsn = await fresh_database("pgq_bench_rollup")
    await migrate.upgrade_async(dsn)
    conn = await asyncpg.connect(dsn)
    print(
        f"{'now at second':>14} {'pgq now: rows':>14} {'ms':>7} {'until 12-04: rows':>18} {'ms':>7}"
    )
    for second in (5, 30, 55):
        now = await conn.fetchval(
            "SELECT date_trunc('minute', now()) + make_interval(secs => $1)", second
        )
        await conn.execute("TRUNCATE pgq_jobs")
        await conn.execute(FILL, rate * SPAN_S, now, SPAN_S)
        await conn.execute(
            "ANALYZE pgq_jobs"
        )  # no VACUUM: a busy table's pages are not all-visible
        new_since = await conn.fetchval(
            "SELECT date_trunc('minute', $1::timestamptz - make_interval(secs => $2))",
            now,
            15 + LATE_S,
        )
        old_since = await conn.fetchval(
            "SELECT date_trunc('minute', $1::timestamptz) - interval '2 minutes'", now
        )
        new_ms, new_rows = await timed(conn, new_since)
        old_ms, old_rows = await timed(conn, old_since)
        print(f"{second:>14} {new_rows:>14,} {new_ms:>7.1f} {old_rows:>18,} {old_ms:>7.1f}")
    await conn.close()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 5_000))
