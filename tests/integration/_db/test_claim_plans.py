"""The claim of a queue without limits runs on connections that keep Postgres's cached
plans; the worker's other statements plan afresh (docs/architecture.md)."""

import uuid

import asyncpg
import pytest

import pgq
from pgq._db import claims, queues, sql
from pgq._db.claims import ClaimPlan, QueueLimits

pytestmark = pytest.mark.anyio

PLAN = ClaimPlan("q", ("noop",), (None,), (3,))
#: Postgres tries custom plans for a prepared statement's first five runs, then compares.
RUNS_BEFORE_GENERIC = 5


async def _enqueue(conn: "asyncpg.Connection[asyncpg.Record]", n: int = 1) -> None:
    await conn.execute(
        "INSERT INTO pgq_jobs (queue, task, args) SELECT 'q', 'noop', '{}'"
        " FROM generate_series(1, $1::int)",
        n,
    )


async def test_claims_reuse_a_cached_plan_and_still_skip_paused_and_limited_queues(
    dsn: str, conn: "asyncpg.Connection[asyncpg.Record]"
) -> None:
    """The worker's claim connections keep Postgres's default plan cache (the generic plan
    of the claim is its custom plan, without planning it again on every claim), while its
    other connections plan each statement for its parameters. The cached plan still
    claims nothing from a paused queue, nor from a queue with limits (claimed under the
    queue's lock, on the other connections)."""
    app = pgq.App()

    @app.task(queue="q")
    async def noop(ctx: pgq.JobContext) -> None:
        """Never runs: the test claims by hand."""

    worker = pgq.Worker(app, dsn)
    pools = await worker._open()
    assert pools is not None
    try:
        assert pools.claims is not pools.main
        async with pools.claims.acquire() as c:
            assert await c.fetchval("SHOW plan_cache_mode") == "auto"
        async with pools.main.acquire() as c:
            assert await c.fetchval("SHOW plan_cache_mode") == "force_custom_plan"
        producer = uuid.uuid4()
        for _ in range(RUNS_BEFORE_GENERIC + 3):
            await _enqueue(conn)
            assert len(await claims.claim(pools.claims, PLAN, producer, "w", 50)) == 1
        async with pools.claims.acquire() as c:
            generic = await c.fetchval(
                "SELECT generic_plans FROM pg_prepared_statements WHERE statement = $1",
                sql.CLAIM_JOBS,
            )
        assert generic is not None and generic >= 1

        await queues.pause(conn, "q")
        await _enqueue(conn)
        assert await claims.claim(pools.claims, PLAN, producer, "w", 50) == []
        await queues.resume(conn, "q")
        await queues.set_limits(conn, "q", QueueLimits(concurrency=100))
        assert await claims.claim(pools.claims, PLAN, producer, "w", 50) == []
        await queues.set_limits(conn, "q", QueueLimits())
        assert len(await claims.claim(pools.claims, PLAN, producer, "w", 50)) == 1
    finally:
        await pools.close()


async def test_the_claims_generic_plan_walks_the_queues_index_and_updates_by_primary_key(
    conn: "asyncpg.Connection[asyncpg.Record]",
) -> None:
    """The plan a claim connection caches, planned without its parameters' values: the
    queue's available jobs read through the fetch index in claim order, the locked rows
    updated through the primary key; no scan of the table, no hash of it, no sort of the
    queue's backlog (a generic plan that sorted it would read every available job of the
    queue on every claim)."""
    await conn.execute(
        "INSERT INTO pgq_jobs (queue, task, args, priority)"
        " SELECT CASE WHEN i % 3 = 0 THEN 'q' ELSE 'other' END, 'noop', '{}', i % 3"
        " FROM generate_series(1, 30000) i"
    )
    await conn.execute(
        "UPDATE pgq_jobs SET state = 'completed', finalized_at = now() WHERE id % 2 = 0"
    )
    await conn.execute("VACUUM ANALYZE pgq_jobs")
    async with conn.transaction():
        await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        await conn.execute(
            "PREPARE claim(text, text[], int, uuid, float8[], int[], text, bool) AS "
            + sql.CLAIM_JOBS.strip().rstrip(";")
        )
        rows = await conn.fetch(
            "EXPLAIN (FORMAT JSON) EXECUTE claim('q', '{noop}', 50, gen_random_uuid(),"
            " '{NULL}', '{3}', 'w', false)"
        )
        await conn.execute("DEALLOCATE claim")
    plan = rows[0][0]
    assert "$1" in plan, "not the generic plan"
    assert "pgq_jobs_fetch_idx" in plan and "pgq_jobs_pkey" in plan, plan
    assert "Seq Scan" not in plan and "Hash" not in plan and "Bitmap" not in plan, plan


async def test_plans_cached_while_the_table_was_small_scan_no_table_once_it_has_grown(
    dsn: str, conn: "asyncpg.Connection[asyncpg.Record]"
) -> None:
    """A claim connection caches its plans while the jobs table is still small (a fresh
    database, never analyzed): once the table has grown, with no ANALYZE or VACUUM to make
    them again, the claims of both kinds still find their jobs through indexes. A generic
    plan made on a small table scans it whole (its rows looked up by id): each claim then
    read every row of the grown table."""
    app = pgq.App()

    @app.task(queue="q")
    async def noop(ctx: pgq.JobContext) -> None:
        """Never runs: the test claims by hand."""

    limited = ClaimPlan("lim", ("noop",), (None,), (3,))
    await queues.set_limits(conn, "lim", QueueLimits(concurrency=1_000_000))
    pools = await pgq.Worker(app, dsn)._open()
    assert pools is not None
    try:
        async with pools.claims.acquire() as c:
            producer = uuid.uuid4()
            for _ in range(RUNS_BEFORE_GENERIC + 3):
                await conn.execute(
                    "INSERT INTO pgq_jobs (queue, task, args) VALUES ('q', 'noop', '{}'),"
                    " ('lim', 'noop', '{}')"
                )
                assert len(await claims.claim(c, PLAN, producer, "w", 50)) == 1
                jobs, _, _ = await claims.claim_limited(c, limited, producer, "w", 50)
                assert len(jobs) == 1
            await conn.execute(
                "INSERT INTO pgq_jobs (queue, task, args, state, finalized_at)"
                " SELECT 'q', 'noop', '{}', 'completed', now() FROM generate_series(1, 20000)"
            )
            await conn.execute(
                "INSERT INTO pgq_jobs (queue, task, args) VALUES ('q', 'noop', '{}'),"
                " ('lim', 'noop', '{}')"
            )
            assert await c.fetchval(
                "SELECT generic_plans FROM pg_prepared_statements WHERE statement = $1",
                sql.CLAIM_JOBS,
            )
            # The connection's table scans not yet reported (of the claims on the small
            # table) go to the server when this statement ends: from here it counts anew.
            await c.execute("SELECT pg_stat_force_next_flush()")
            # In one transaction, so that nothing is reported before it is read (the
            # limited claim's queue lock is held until then: no other claimer here).
            async with c.transaction():
                assert len(await claims.claim(c, PLAN, producer, "w", 50)) == 1
                jobs, _, _ = await claims.claim_limited(c, limited, producer, "w", 50)
                assert len(jobs) == 1
                scanned = await c.fetch(
                    "SELECT relname, seq_scan FROM pg_stat_xact_user_tables"
                    " WHERE relname LIKE 'pgq%' AND seq_scan > 0"
                )
            assert scanned == [], scanned
    finally:
        await pools.close()
