"""The limited claim, one call of pgq_claim_limited per claim: claimers racing on separate
connections never take more than the limits leave, because each counts after the queue's
lock with a snapshot of its own."""

from __future__ import annotations

import uuid

import anyio
import anyio.lowlevel
import asyncpg
import pytest

import pgq
from pgq._db import claims
from pgq._db.connections import Pool, create_pool

pytestmark = pytest.mark.anyio

CLAIMERS = 8
PLAN = claims.ClaimPlan("limited", ("work",), (None,), (5,))


async def race(pool: Pool, start: anyio.Event, ask: int) -> tuple[int, int]:
    """Every claimer waits for ``start``, then claims up to ``ask`` jobs at once, each on a
    connection of its own; returns the jobs claimed in all and the claims held back."""
    claimed = held = 0

    async def one() -> None:
        nonlocal claimed, held
        await start.wait()
        jobs, held_back, _ = await claims.claim_limited(pool, PLAN, uuid.uuid4(), "test", ask)
        claimed += len(jobs)
        held += held_back

    async with anyio.create_task_group() as tg:
        for _ in range(CLAIMERS):
            tg.start_soon(one)
        await anyio.lowlevel.checkpoint()
        start.set()
    return claimed, held


async def test_racing_claimers_never_take_more_than_the_limits_leave(
    client: pgq.Client, dsn: str
) -> None:
    await client.enqueue_many([pgq.JobSpec("work", {"i": i}, queue="limited") for i in range(200)])
    pool = await create_pool(dsn, min_size=CLAIMERS, max_size=CLAIMERS)
    try:
        # 5 at once: eight claimers of 3 take 5 in all, whichever wins; the rest are held.
        await client.set_queue_limits("limited", concurrency=5)
        claimed, held = await race(pool, anyio.Event(), 3)
        assert claimed == 5 and held >= CLAIMERS - 2
        # Two finish: two slots come back, and no more.
        await pool.execute(
            "UPDATE pgq_jobs SET state = 'completed', finalized_at = now()"
            " WHERE id IN (SELECT id FROM pgq_jobs WHERE state = 'running' LIMIT 2)"
        )
        claimed, _ = await race(pool, anyio.Event(), 3)
        assert claimed == 2
        # A rate of 7 a minute: the starts logged count whatever finished since.
        await pool.execute("UPDATE pgq_jobs SET state = 'completed', finalized_at = now()"
                           " WHERE state = 'running'")  # fmt: skip
        await client.set_queue_limits("limited", rate=(7, 60))
        assert (await race(pool, anyio.Event(), 3))[0] == 7
        await pool.execute("UPDATE pgq_jobs SET state = 'completed', finalized_at = now()"
                           " WHERE state = 'running'")  # fmt: skip
        assert (await race(pool, anyio.Event(), 3))[0] == 0
        # Per key: 2 at once for each of the keys the jobs carry.
        await client.enqueue_many(
            [
                pgq.JobSpec("work", {"i": i}, queue="limited", limit_key=f"k{i % 3}")
                for i in range(60)
            ]
        )
        await client.set_queue_limits("limited", key_concurrency=2)
        await pool.execute("DELETE FROM pgq_jobs WHERE queue = 'limited' AND limit_key IS NULL")
        claimed, _ = await race(pool, anyio.Event(), 3)
        assert claimed == 6
        running = await pool.fetch(
            "SELECT limit_key, count(*) AS n FROM pgq_jobs WHERE state = 'running'"
            " GROUP BY limit_key"
        )
        assert {r["limit_key"]: r["n"] for r in running} == {"k0": 2, "k1": 2, "k2": 2}
    finally:
        await pool.close()


async def test_a_paused_limited_queue_gives_nothing_until_resumed(
    client: pgq.Client, dsn: str
) -> None:
    await client.enqueue_many([pgq.JobSpec("work", {"i": i}, queue="limited") for i in range(3)])
    await client.set_queue_limits("limited", concurrency=5)
    await client.pause_queue("limited")
    pool = await create_pool(dsn, min_size=1, max_size=1)
    try:
        jobs, held_back, limits = await claims.claim_limited(pool, PLAN, uuid.uuid4(), "t", 3)
        assert (jobs, held_back, limits.concurrency) == ([], False, 5)
        await client.resume_queue("limited")
        jobs, held_back, _ = await claims.claim_limited(pool, PLAN, uuid.uuid4(), "t", 3)
        assert len(jobs) == 3 and not held_back
    finally:
        await pool.close()


async def test_a_per_key_limit_far_from_binding_claims_in_queue_order_and_near_it_per_key(
    client: pgq.Client, dsn: str
) -> None:
    """Where every key has room for the whole claim, the claim takes the queue's next jobs
    (one scan); where a key has less, each key gets no more than its room."""
    await client.enqueue_many(
        [pgq.JobSpec("work", {"i": i}, queue="limited", limit_key="a") for i in range(10)]
        + [pgq.JobSpec("work", {"i": i}, queue="limited", limit_key="b") for i in range(10)]
    )
    await client.set_queue_limits("limited", key_concurrency=5)
    pool = await create_pool(dsn, min_size=1, max_size=1)
    try:
        first, held_back, _ = await claims.claim_limited(pool, PLAN, uuid.uuid4(), "t", 4)
        assert [j.limit_key for j in first] == ["a"] * 4 and not held_back
        second, _, _ = await claims.claim_limited(pool, PLAN, uuid.uuid4(), "t", 4)
        assert sorted(j.limit_key or "" for j in second) == ["a", "b", "b", "b"]
    finally:
        await pool.close()


async def test_per_key_limits_the_whole_queue_fits_within_grant_every_job_asked_for(
    client: pgq.Client, dsn: str
) -> None:
    """While the queue's running jobs and the claim fit within one key's limit, no key can
    be short of room: the claim takes all it asks for, ahead of the free slots too, even
    from one key (halving a key's room for the jobs ahead is for limits near binding)."""
    await client.enqueue_many(
        [pgq.JobSpec("work", {"i": i}, queue="limited", limit_key="a") for i in range(60)]
    )
    await client.set_queue_limits("limited", key_concurrency=40)
    pool = await create_pool(dsn, min_size=1, max_size=1)
    try:
        jobs, held_back, _ = await claims.claim_limited(pool, PLAN, uuid.uuid4(), "t", 5, ahead=20)
        assert len(jobs) == 25 and not held_back
        # 25 of the key run: another claim of 25 no longer fits, and the key's room (15)
        # is what it gets: 5 for the free slots, then half the 10 left ahead of them.
        jobs, _, _ = await claims.claim_limited(pool, PLAN, uuid.uuid4(), "t", 5, ahead=20)
        assert len(jobs) == 10
    finally:
        await pool.close()


async def test_a_rate_counts_the_summed_starts_within_its_window_and_old_code_s_rows(
    client: pgq.Client, dsn: str
) -> None:
    """A rate's starts within the window come from the claims' running sums (the window's
    first sum onwards, not every sum kept), plus the starts that code of a revision before
    the sums logged one row each, unmarked: in a rolling upgrade, both are counted."""
    await client.enqueue_many([pgq.JobSpec("work", {"i": i}, queue="limited") for i in range(30)])
    await client.set_queue_limits("limited", rate=(5, 60))
    pool = await create_pool(dsn, min_size=1, max_size=1)
    try:
        assert len((await claims.claim_limited(pool, PLAN, uuid.uuid4(), "t", 2))[0]) == 2
        # That claim's starts leave the window (as if a minute went by): 5 are allowed again.
        await pool.execute("UPDATE pgq_rate_sums SET started_at = started_at - interval '61 s'")
        await pool.execute("UPDATE pgq_rate_log SET started_at = started_at - interval '61 s'")
        assert len((await claims.claim_limited(pool, PLAN, uuid.uuid4(), "t", 3))[0]) == 3
        assert len((await claims.claim_limited(pool, PLAN, uuid.uuid4(), "t", 5))[0]) == 2
        # The running total goes on from the sum that left the window (2 + 3 + 2).
        assert await pool.fetchval("SELECT max(total) FROM pgq_rate_sums") == 7
        # A minute on again, then two starts that older code logged (no sum, no mark).
        await pool.execute("UPDATE pgq_rate_sums SET started_at = started_at - interval '61 s'")
        await pool.execute("UPDATE pgq_rate_log SET started_at = started_at - interval '61 s'")
        await pool.execute(
            "INSERT INTO pgq_rate_log (queue, limit_key, started_at)"
            " VALUES ('limited', NULL, now()), ('limited', NULL, now())"
        )
        jobs, held_back, _ = await claims.claim_limited(pool, PLAN, uuid.uuid4(), "t", 5)
        assert len(jobs) == 3 and held_back
        # What this code logs, older code counts: one marked row per start.
        assert (
            await pool.fetchval(
                "SELECT count(*) FROM pgq_rate_log WHERE started_at > now() - interval '60 s'"
            )
            == 5
        )
    finally:
        await pool.close()


# --------------------------------------------------------------------------- claims' reads (their plans)


async def test_the_burst_check_finds_what_is_runnable_and_reads_no_finished_job(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    """A burst ends when ``leftovers`` finds nothing its producer could claim: available
    jobs and due retries of its tasks count; jobs scheduled for later, other tasks' jobs and
    finished jobs do not. Right after a drain, with the statistics still counting every job
    as available, it reads the queue's indexes: no scan of the table and its finished rows."""
    from pgq._db import claims, sql

    plan = claims.ClaimPlan("default", ("noop",), (None,), (3,))

    async def runnable() -> bool:
        return (await claims.leftovers(conn, plan, 30.0)).runnable

    assert not await runnable()
    await conn.execute(
        "INSERT INTO pgq_jobs (task, args) SELECT 'noop', '{}' FROM generate_series(1, 20000)"
    )
    await conn.execute("ANALYZE pgq_jobs")  # the statistics: 20,000 available jobs
    assert await runnable()
    await conn.execute("UPDATE pgq_jobs SET state = 'completed', finalized_at = now(), attempt = 1")
    assert not await runnable()
    plan_json = await conn.fetchval(
        "EXPLAIN (FORMAT JSON) " + sql.RUNNABLE_LEFT, "default", ["noop"], 30.0, None, [], None
    )
    assert "Seq Scan" not in plan_json, plan_json

    await conn.execute("INSERT INTO pgq_jobs (task, args) VALUES ('other', '{}')")
    await conn.execute(
        "INSERT INTO pgq_jobs (task, args, state, scheduled_at)"
        " VALUES ('noop', '{}', 'scheduled', now() + interval '1 hour')"
    )
    assert not await runnable()  # another task's job; one not due yet
    await conn.execute(
        "INSERT INTO pgq_jobs (task, args, state, scheduled_at)"
        " VALUES ('noop', '{}', 'scheduled', now() - interval '1 second')"
    )
    assert await runnable()  # a scheduled job now due (the leader will make it available)
    await conn.execute("DELETE FROM pgq_jobs WHERE state = 'scheduled'")
    assert not await runnable()
    await conn.execute(
        "INSERT INTO pgq_jobs (task, args, state, scheduled_at, attempt)"
        " VALUES ('noop', '{}', 'retryable', now() - interval '1 second', 1)"
    )
    assert await runnable()  # a due retry


async def test_a_claim_updates_its_jobs_through_the_primary_key_not_a_table_scan(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    """A claim of hundreds of jobs from a table of tens of thousands updates the jobs it
    locked through the primary key: joined to them instead, the planner hashed the whole
    table on every claim (6 of a 500-job claim's 11 ms at 30,000 rows)."""
    from pgq._db import sql

    await conn.execute(
        "INSERT INTO pgq_jobs (task, args) SELECT 'noop', '{}' FROM generate_series(1, 30000)"
    )
    await conn.execute("VACUUM ANALYZE pgq_jobs")
    args = ("default", ["noop"], 500, uuid.uuid4(), [None], [3], "w", False)
    plan_json = await conn.fetchval("EXPLAIN (FORMAT JSON) " + sql.CLAIM_JOBS, *args)
    assert "Seq Scan" not in plan_json and "Hash" not in plan_json, plan_json
    # Claim order (priority, then schedule time, then id) differs from id order here.
    await conn.execute(
        "UPDATE pgq_jobs SET priority = id % 3,"
        " scheduled_at = scheduled_at - make_interval(secs => (id * 7919) % 1000)"
    )
    first = await conn.fetch(
        "SELECT id FROM pgq_jobs ORDER BY priority DESC, scheduled_at, id LIMIT 500"
    )
    claimed = await conn.fetch(sql.CLAIM_JOBS, *args)
    ids = [r["id"] for r in claimed]
    assert ids == [r["id"] for r in first] and ids != sorted(ids)


async def test_outcome_writes_find_their_jobs_by_id_while_the_statistics_lag(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    """Every statement fenced by a running attempt (the outcome writes, the transactional
    settle, the poll for cancel requests) looks its jobs up by primary key, even when the
    statistics were taken while no job ran and thousands run now. Planned from the partial
    index of running jobs instead, each write read every running job: 134 ms against 2 ms
    for 100 outcomes with 100,000 jobs running."""
    from pgq._db import sql

    await conn.execute("ALTER TABLE pgq_jobs SET (autovacuum_enabled = off)")  # stale stays stale
    await conn.execute(
        "INSERT INTO pgq_jobs (task, args) SELECT 'noop', '{}' FROM generate_series(1, 20000)"
    )
    await conn.execute("ANALYZE pgq_jobs")  # the statistics: no job running
    await conn.execute(
        "UPDATE pgq_jobs SET state = 'running', attempt = 1, attempted_at = now(),"
        " attempt_token = gen_random_uuid(), producer_id = gen_random_uuid() WHERE id <= 10000"
    )
    rows = await conn.fetch(
        "SELECT id, attempt_token FROM pgq_jobs WHERE state = 'running' ORDER BY id LIMIT 100"
    )
    ids, tokens = [r["id"] for r in rows], [r["attempt_token"] for r in rows]
    n = len(ids)
    error = '{"attempt": 1, "kind": "exception", "message": "x", "traceback": null}'
    outcomes = (ids, tokens, ["completed"] * n, [None] * n, [None] * n, [None] * n, [0] * n)
    statements = {
        # Each outcome statement as it is written first, and again passing over locked rows.
        "COMPLETE_JOBS": (sql.COMPLETE_JOBS, (*outcomes, False, False, "50ms")),
        "COMPLETE_JOBS skipping": (sql.COMPLETE_JOBS, (*outcomes, True, True, None)),
        "COMPLETE_SUCCESSES": (
            sql.COMPLETE_SUCCESSES,
            (ids, tokens, ["1"] * n, [], False, False, "50ms"),
        ),
        "COMPLETE_SUCCESSES skipping": (
            sql.COMPLETE_SUCCESSES,
            (ids, tokens, ["1"] * n, [], True, True, None),
        ),
        "COMPLETE_SUCCESSES_NO_RESULT": (
            sql.COMPLETE_SUCCESSES_NO_RESULT,
            (ids, tokens, [], False, False, "50ms"),
        ),
        "COMPLETE_SUCCESSES_NO_RESULT skipping": (
            sql.COMPLETE_SUCCESSES_NO_RESULT,
            (ids, tokens, [], True, True, None),
        ),
        "FAIL_ATTEMPT": (sql.FAIL_ATTEMPT, (ids[0], tokens[0], error, True)),
        "SETTLE_ATTEMPT": (
            sql.SETTLE_ATTEMPT,
            (ids[0], tokens[0], uuid.uuid4(), "completed", None, None, None, 0),
        ),
        "CANCEL_REQUESTED": (sql.CANCEL_REQUESTED, (ids,)),
    }
    for name, (statement, args) in statements.items():
        plan_json = await conn.fetchval("EXPLAIN (FORMAT JSON) " + statement, *args)
        assert "pgq_jobs_running_idx" not in plan_json, (name, plan_json)
        assert "pgq_jobs_pkey" in plan_json, (name, plan_json)
    # The fence still holds in that form: the written jobs are running no more, and a second
    # write of the same attempts changes nothing.
    written = await conn.fetchrow(
        sql.COMPLETE_SUCCESSES_NO_RESULT, ids, tokens, [], False, False, None
    )
    assert written is not None and sorted(written["ids"]) == ids
    again = await conn.fetchrow(
        sql.COMPLETE_SUCCESSES_NO_RESULT, ids, tokens, [], True, False, None
    )
    assert again is not None and again["ids"] == [] and again["passed_over"] == []


async def test_a_limited_claim_counts_its_queues_running_jobs_without_reading_the_others(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    """A limited queue's claim counts its running jobs (in all, and per limit key) producer
    by producer, without reading the jobs other queues' producers run, also with statistics
    taken while none ran; the jobs of a producer whose row is gone count too (a row deleted
    by hand, or at a worker's stop). Counted by queue, every claim of the limited queue read
    all 10,000 jobs running elsewhere (with 100,000: 14 ms per claim against 1.7 ms)."""
    from pgq._db import codec, sql

    await conn.execute("ALTER TABLE pgq_jobs SET (autovacuum_enabled = off)")  # stale stays stale
    await conn.execute(
        "INSERT INTO pgq_jobs (task, args, queue, limit_key)"
        " SELECT 'noop', '{}', CASE WHEN i <= 10000 THEN 'busy' ELSE 'limited' END,"
        "        CASE WHEN i > 10000 THEN (ARRAY['a', 'b', NULL])[i % 3 + 1] END"
        " FROM generate_series(1, 10030) AS i"
    )
    await conn.execute("ANALYZE pgq_jobs")  # the statistics: no job running
    producers = {"busy": uuid.uuid4(), "limited": uuid.uuid4(), "limited2": uuid.uuid4()}
    for name, pid in producers.items():
        await conn.execute(
            "INSERT INTO pgq_producers (id, worker_id, worker_name, queue, concurrency)"
            " VALUES ($1, $1, $2, $3, 10)",
            pid,
            name,
            name.rstrip("2"),
        )
    run = (
        "UPDATE pgq_jobs SET state = 'running', attempt = 1, attempted_at = now(),"
        " attempt_token = gen_random_uuid(), producer_id = $1 WHERE id = ANY($2::bigint[])"
    )
    busy = await conn.fetch("SELECT id FROM pgq_jobs WHERE queue = 'busy'")
    await conn.execute(run, producers["busy"], [r["id"] for r in busy[5:]])
    # Five of the busy queue's jobs run under a producer whose row is gone.
    await conn.execute(run, uuid.uuid4(), [r["id"] for r in busy[:5]])
    # In the limited queue, two workers run 7 jobs, of keys a, b and none; the second
    # one's row is gone.
    mine = await conn.fetch("SELECT id FROM pgq_jobs WHERE queue = 'limited' ORDER BY id LIMIT 7")
    await conn.execute(run, producers["limited"], [r["id"] for r in mine[:4]])
    await conn.execute(run, producers["limited2"], [r["id"] for r in mine[4:]])
    await conn.execute("DELETE FROM pgq_producers WHERE id = $1", producers["limited2"])
    truth = await conn.fetch(
        "SELECT limit_key, count(*)::int AS n FROM pgq_jobs"
        " WHERE queue = 'limited' AND state = 'running' GROUP BY limit_key"
    )
    assert sum(r["n"] for r in truth) == 7

    assert {r["limit_key"]: r["n"] for r in truth} == {None: 3, "a": 2, "b": 2}

    # Each claim in a transaction rolled back: the jobs it leaves room for say what it
    # counted, and the statistics of the transaction what it read of pgq_jobs.
    # (With autovacuum off, no page is all-visible: an index-only scan fetches its rows too.)
    read_so_far = (
        "SELECT seq_tup_read + idx_tup_fetch FROM pg_stat_xact_user_tables"
        " WHERE relname = 'pgq_jobs'"
    )
    for concurrency, key_concurrency in ((9, None), (None, 3)):
        # 9 at once, 7 running: room for 2. 3 per key: a and b have room for one each, the
        # keyless jobs (3 running) none.
        tx = conn.transaction()
        await tx.start()
        try:
            await conn.execute(
                "INSERT INTO pgq_queues (name, concurrency, key_concurrency) VALUES ('limited', $1, $2)",
                concurrency,
                key_concurrency,
            )
            before = await conn.fetchval(read_so_far)
            row = await conn.fetchrow(
                sql.CLAIM_LIMITED, "limited", ["noop"], 10, 0, producers["limited"], [None], [25],
                "test", 1000, False,
            )  # fmt: skip
            read = await conn.fetchval(read_so_far) - before
        finally:
            await tx.rollback()
        assert row is not None and row["held_back"]
        keys = sorted(j[codec.CLAIM_COLUMNS.index("limit_key")] for j in row["jobs"])
        assert keys == ["a", "b"]
        # A probe per producer running jobs, the available jobs' keys, the 7 jobs and the 5
        # of the busy queue's producer without a row: not the 9,995 of its other one.
        assert read < 1000, (concurrency, key_concurrency, read)
