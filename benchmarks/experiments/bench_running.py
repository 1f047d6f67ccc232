"""Do outcome writes and limited claims stay cheap while many jobs run, with statistics taken
before they ran?

Answer: yes: with 100,000 jobs running, a limited claim of 10 took 2.7-3.1 ms at the median
(per-key limits 4.7-5.4 ms), and a write that finds its job by primary key stays near 0.1 ms
where one through the running index took 75 ms (docs/flow-control.md, docs/liveness.md).

Outcome writes while many jobs run: `python benchmarks/experiments/bench_running.py [RUNNING]`.

Fills a fresh database with 2 × RUNNING jobs (default 100,000 running), takes the table's
statistics while none of them runs (as autovacuum would on a quiet queue before a burst of
long jobs), then marks RUNNING of them running, each with its own attempt token, with
autovacuum off for the table so that the statistics stay as taken. It then times, through
pgq's own store functions (so it measures the tree it imports: `PYTHONPATH=TREE/src` to
compare two), 40 writes of each kind on running jobs not written before:

- `complete_successes` of 100 jobs (the worker's common outcome write),
- `write_outcomes` of 100 jobs (every other outcome: failures, snoozes, hand-backs),
- `fail_attempt` of one job (the last resort for an outcome refused in every other form),

and 40 claims of 10 jobs of each of two other queues while those jobs run:

- `limited_claim` from a queue with a concurrency limit (that never binds),
- `keyed_claim` from a queue with a per-key concurrency limit (10 keys; it never binds),

once with those stale statistics and once after `VACUUM ANALYZE`, and prints p50/p99 of each
in milliseconds. A write that finds its jobs by primary key costs about the same in both; one
planned from the partial index of running jobs reads every running job in the stale case.
A limited claim that counts its queue's running jobs producer by producer costs a probe per
producer of the other queues, however many jobs they run; one that counts them by queue
reads them all.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, run

import asyncpg
from common import drop_database, emit, fresh_database, pgq_migrate, summary_ms

from pgq._db import claims
from pgq._db.claims import ClaimPlan
from pgq._worker.attempt import Outcome, error_entry

WRITES = 40
BATCH = 100
CLAIM = 10
#: The producers of the limited queues (their rows are what a limited claim counts through).
PRODUCERS = {"limited": uuid.uuid4(), "keyed": uuid.uuid4()}


async def _running(conn: asyncpg.Connection, offset: int, n: int) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT id, attempt_token FROM pgq_jobs WHERE state = 'running'"
        " ORDER BY id OFFSET $1 LIMIT $2",
        offset,
        n,
    )


async def _timings(conn: asyncpg.Connection) -> dict[str, list[float]]:
    """40 writes of each kind, each on running jobs no write touched before."""
    out: dict[str, list[float]] = {
        "complete_successes": [],
        "write_outcomes": [],
        "fail_attempt": [],
    }
    for _ in range(WRITES):
        # Each write takes the first running jobs: those written before are running no more.
        rows = await _running(conn, 0, BATCH)
        started = time.perf_counter()
        done = await claims.complete_successes(
            conn, [r["id"] for r in rows], [r["attempt_token"] for r in rows], [None] * len(rows)
        )
        out["complete_successes"].append(time.perf_counter() - started)
        assert len(done.states) == len(rows), "the fence refused a running attempt"

        rows = await _running(conn, 0, BATCH)
        outcomes = [
            Outcome(r["id"], r["attempt_token"], 1, "default", "retryable", 60.0,
                    error_entry(1, "exception", "bench"))
            for r in rows
        ]  # fmt: skip
        started = time.perf_counter()
        written = await claims.write_outcomes(conn, outcomes)
        out["write_outcomes"].append(time.perf_counter() - started)
        assert len(written.states) == len(rows), "the fence refused a running attempt"

        (row,) = await _running(conn, 0, 1)
        started = time.perf_counter()
        ok = await claims.fail_attempt(
            conn, row["id"], row["attempt_token"], error_entry(1, "internal", "bench")
        )
        out["fail_attempt"].append(time.perf_counter() - started)
        assert ok, "the fence refused a running attempt"
    return out


async def _claim_timings(pool: asyncpg.Pool) -> dict[str, list[float]]:
    """40 claims of 10 from each limited queue (the jobs claimed stay running)."""
    out: dict[str, list[float]] = {"limited_claim": [], "keyed_claim": []}
    for _ in range(WRITES):
        for queue in ("limited", "keyed"):
            plan = ClaimPlan(queue, ("noop",), (None,), (1,))
            started = time.perf_counter()
            jobs, held, _ = await claims.claim_limited(pool, plan, PRODUCERS[queue], "bench", CLAIM)
            out[f"{queue}_claim"].append(time.perf_counter() - started)
            assert len(jobs) == CLAIM and not held, "a limit held the claim back"
    return out


async def _limited_queues(conn: asyncpg.Connection) -> None:
    """The two limited queues, their jobs and their producers (other queues' jobs run)."""
    await conn.execute(
        "INSERT INTO pgq_queues (name, concurrency, key_concurrency)"
        " VALUES ('limited', 1000000, NULL), ('keyed', NULL, 1000000)"
    )
    await conn.execute(
        "INSERT INTO pgq_jobs (task, args, queue, limit_key)"
        " SELECT 'noop', '{}', q, CASE WHEN q = 'keyed' THEN 'k' || (i % 10) END"
        " FROM generate_series(1, $1::int) AS i, unnest(ARRAY['limited', 'keyed']) AS q",
        WRITES * CLAIM,
    )
    for queue, producer_id in PRODUCERS.items():
        await conn.execute(
            "INSERT INTO pgq_producers (id, worker_id, worker_name, queue, concurrency)"
            " VALUES ($1, $1, 'bench', $2, $3)",
            producer_id,
            queue,
            WRITES * CLAIM,
        )


async def main(running: int) -> dict[str, Any]:
    dsn = await fresh_database("bench_running")
    await pgq_migrate(dsn)
    conn = await asyncpg.connect(dsn)
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
    try:
        await conn.execute("ALTER TABLE pgq_jobs SET (autovacuum_enabled = off)")
        await conn.execute(
            "INSERT INTO pgq_jobs (task, args) SELECT 'noop', '{}' FROM generate_series(1, $1::int)",
            2 * running,
        )
        await conn.execute("ANALYZE pgq_jobs")  # the statistics: nothing running
        # They run under one producer of the default queue, registered as a worker's are.
        busy = uuid.uuid4()
        await conn.execute(
            "INSERT INTO pgq_producers (id, worker_id, worker_name, queue, concurrency)"
            " VALUES ($1, $1, 'bench', 'default', $2)",
            busy,
            running,
        )
        await conn.execute(
            "UPDATE pgq_jobs SET state = 'running', attempt = 1, attempted_at = now(),"
            " attempt_token = gen_random_uuid(), producer_id = $2 WHERE id <= $1",
            running,
            busy,
        )
        result: dict[str, Any] = {"system": "pgq", "workload": "outcome_writes", "running": running}
        for phase in ("stale", "analyzed"):
            if phase == "analyzed":
                await conn.execute("DELETE FROM pgq_jobs WHERE queue IN ('limited', 'keyed')")
                await conn.execute("DELETE FROM pgq_producers WHERE queue <> 'default'")
                await conn.execute("DELETE FROM pgq_queues")
                await conn.execute("VACUUM ANALYZE pgq_jobs")
            await _limited_queues(conn)
            timings = await _timings(conn)
            timings.update(await _claim_timings(pool))
            for kind, samples in timings.items():
                figures = summary_ms(samples)
                result[f"{phase}_{kind}"] = figures
                print(
                    f"{phase:9s} {kind:19s} p50 {figures['p50_ms']:8.2f} ms"
                    f"   p99 {figures['p99_ms']:8.2f} ms",
                    flush=True,
                )
        return result
    finally:
        await pool.close()
        await conn.close()
        await drop_database("bench_running")


if __name__ == "__main__":
    emit(asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000)))
