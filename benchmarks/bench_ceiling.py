"""The practical limit of this machine for this design: bare asyncpg, no framework.

`python bench_ceiling.py drain`: two connections, each claiming 100 jobs with one SKIP
LOCKED statement (the locked rows joined back to the table) and completing them with one
UPDATE, until the 20,000 queued no-op jobs are done. This is the ceiling the targets of
docs/performance.md are stated against.

`python bench_ceiling.py drain-500`: the same two connections, each claiming 500 jobs (the
most one claim of pgq's takes at concurrency 1,000) and updating the locked rows through
the primary key (``id = ANY(ARRAY(...))``, the statement shape of pgq's claim since
9488413); pgq itself has one claim in flight at a time. A stricter reference: what the
database and the driver allow when the work per job in Python is nearly nil. (Both time
the two connections' opening too, a few milliseconds.)

`python bench_ceiling.py drain-N`: the same with claims of N (drain-1000: claims as large as
pgq's outcome batches, the bare loop experiments/bench_outcomes.py holds pgq's drain to).
"""

from __future__ import annotations

import asyncio
import os
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
CLAIM_BY_ID = """
WITH locked AS (
    SELECT id FROM pgq_jobs WHERE state = 'available' AND queue = 'default'
    ORDER BY priority DESC, scheduled_at, id LIMIT $1 FOR UPDATE SKIP LOCKED
)
UPDATE pgq_jobs j SET state = 'running', attempt = j.attempt + 1, attempted_at = now()
WHERE j.id = ANY(ARRAY(SELECT id FROM locked))
RETURNING j.id, j.args::text
"""
COMPLETE = """
UPDATE pgq_jobs SET state = 'completed', finalized_at = now()
WHERE id = ANY($1::bigint[]) AND state = 'running'
"""


async def drain(batch: int | None) -> None:
    """Drain N jobs with two connections: claims of 100 joined back to the table
    (``batch`` None), or claims of ``batch`` through the primary key."""
    name = f"bench_ceiling_{os.getpid()}"  # not dropped by another run on the same server
    dsn = await fresh_database(name)
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
            while rows := await (c.fetch(CLAIM) if batch is None else c.fetch(CLAIM_BY_ID, batch)):
                await c.execute(COMPLETE, [r[0] for r in rows])
        finally:
            await c.close()

    with Timer() as t:
        await asyncio.gather(consumer(), consumer())
    emit(
        {
            "system": "ceiling",
            "workload": "drain" if batch is None else f"drain_{batch}",
            "jobs": N,
            "seconds": t.seconds,
            "rate": N / t.seconds,
        }
    )
    await drop_database(name)


if __name__ == "__main__":
    if sys.argv[1:] == ["drain"]:
        run(lambda: drain(None))
    elif len(sys.argv) == 2 and sys.argv[1].startswith("drain-") and sys.argv[1][6:].isdigit():
        run(lambda: drain(int(sys.argv[1][6:])))
    else:
        raise SystemExit("usage: bench_ceiling.py drain | drain-N (N jobs a claim, e.g. 500)")
