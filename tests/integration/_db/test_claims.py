"""The limited claim, one call of pgq_claim_limited per claim: claimers racing on separate
connections never take more than the limits leave, because each counts after the queue's
lock with a snapshot of its own."""

from __future__ import annotations

import uuid

import anyio
import anyio.lowlevel
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
