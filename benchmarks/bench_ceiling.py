"""The practical limit of this machine for this design: bare asyncpg, no framework.

Two connections, each claiming 100 jobs with one SKIP LOCKED statement and completing them
with one UPDATE, until the 20,000 queued no-op jobs are done. `python bench_ceiling.py drain`
"""

from __future__ import annotations

import asyncio
import sys

import asyncpg
from common import Timer, drop_database, emit, fresh_database, pgq_migrate, run

N = 20_000
CLAIM = """
WITH locked AS (
    SELECT id FROM pgq_jobs WHERE state = 'available' AND queue = 'default'
    ORDER BY priority DESC, scheduled_at, id LIMIT 100 FOR UPDATE SKIP LOCKED
)
UPDATE pgq_jobs j SET state = 'running', attempt = j.attempt + 1, attempted_at = now()
FROM locked WHERE j.id = locked.id
RETURNING j.id, j.args::text
"""
COMPLETE = """
UPDATE pgq_jobs SET state = 'completed', finalized_at = now()
WHERE id = ANY($1::bigint[]) AND state = 'running'
"""


async def drain() -> None:
    dsn = await fresh_database("bench_ceiling")
    await pgq_migrate(dsn)
    conn = await asyncpg.connect(dsn)
    for start in range(0, N, 5_000):
        await conn.execute(
            "INSERT INTO pgq_jobs (task, args) SELECT 'noop', jsonb_build_object('i', g)"
            " FROM generate_series($1::int, $2::int) g",
            start,
            start + 4_999,
        )
    await conn.close()

    async def consumer() -> None:
        c = await asyncpg.connect(dsn)
        try:
            while rows := await c.fetch(CLAIM):
                await c.execute(COMPLETE, [r[0] for r in rows])
        finally:
            await c.close()

    with Timer() as t:
        await asyncio.gather(consumer(), consumer())
    emit(
        {
            "system": "ceiling",
            "workload": "drain",
            "jobs": N,
            "seconds": t.seconds,
            "rate": N / t.seconds,
        }
    )
    await drop_database("bench_ceiling")


if __name__ == "__main__":
    if sys.argv[1:] != ["drain"]:
        raise SystemExit("usage: bench_ceiling.py drain")
    run(lambda: drain())
