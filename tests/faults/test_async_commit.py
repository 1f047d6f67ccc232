"""The worker's ``async_commit`` against a real crash of the database server: its claims and
outcomes commit without waiting for the disk, a crash takes back the last of them, and
pgq runs those jobs again (docs/liveness.md, "Committing without waiting for the disk").

What a crash loses is made certain, not hoped for: the server's WAL writer (which writes
asynchronously committed WAL out within a fifth of a second) is stopped with SIGSTOP, so
the statements' commit records stay in the server's memory, and then killed, which makes
the postmaster end every process and recover from what reached the files. Nothing else may
write WAL out meanwhile: the server runs no autovacuum, background writer or timed
checkpoint, and in the worker's test the tables its heartbeats, leader lease and rollup
write are locked (a waiting statement commits nothing).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import asyncpg
import pytest

import pgq
from pgq import migrate
from pgq._db import claims
from pgq._db.connections import create_pool
from pgq._worker.attempt import Outcome, error_entry
from pgq._worker.recovery import LOST_REPLY_OR_OUTCOME
from tests.faults.cluster import Server, lone_server
from tests.tests_support import until

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.timeout(180)]

#: Nothing but the test's statements writes WAL out while the WAL writer is stopped.
QUIET = {
    "autovacuum": "off",
    "bgwriter_lru_maxpages": "0",
    "checkpoint_timeout": "'1d'",
    "max_wal_size": "'1GB'",
}

Crash = Callable[[], Awaitable[None]]


@pytest.fixture
async def quiet_server() -> AsyncIterator[Server]:
    """A migrated server of the test's own, which it may crash."""
    with lone_server(QUIET) as server:
        await migrate.upgrade_async(server.dsn)
        yield server


@contextlib.asynccontextmanager
async def wal_writer_stopped(dsn: str) -> AsyncIterator[Crash]:
    """Stop the server's WAL writer; yields the crash: kill it, then wait until the server
    has recovered and takes connections again. Left without a crash, it goes on."""
    conn = await asyncpg.connect(dsn)
    try:
        pid = await conn.fetchval(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'"
        )
    finally:
        await conn.close()
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    crashed = False

    async def crash() -> None:
        nonlocal crashed
        os.kill(pid, signal.SIGKILL)
        crashed = True

        async def recovered() -> bool:
            # A connection may be let in just before the server ends every backend to
            # recover, and lost in its first query: not recovered yet either.
            try:
                conn = await asyncpg.connect(dsn, timeout=5)
                try:
                    new_pid = await conn.fetchval(
                        "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'"
                    )
                finally:
                    conn.terminate()
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError):
                return False
            return bool(new_pid is not None and new_pid != pid)

        await until(recovered, limit_s=60, every_s=0.2)

    try:
        yield crash
    finally:
        if not crashed:
            os.kill(pid, signal.SIGCONT)


def plan(queue: str) -> claims.ClaimPlan:
    return claims.ClaimPlan(queue, ("work",), (None,), (5,))


async def test_async_claims_and_outcomes_are_lost_in_a_crash_and_the_others_are_not(
    quiet_server: Server,
) -> None:
    """Every statement async_commit changes commits without waiting for the disk: after a
    crash, its claims are gone (the jobs available again) and its outcomes too (the jobs
    running again under the claim that reached the disk); a claim and an outcome that
    waited for the disk (before the WAL writer stopped) survive it."""
    dsn = quiet_server.dsn
    conn = await asyncpg.connect(dsn)
    await conn.execute("""
        INSERT INTO pgq_queues (name, concurrency) VALUES ('limited', 10);
        INSERT INTO pgq_queues (name, key_concurrency) VALUES ('keyed', 10);
        INSERT INTO pgq_jobs (task, args) SELECT 'work', '{}' FROM generate_series(1, 7);
        INSERT INTO pgq_jobs (queue, task, args) SELECT 'limited', 'work', '{}'
            FROM generate_series(1, 2);
        INSERT INTO pgq_jobs (queue, task, args, limit_key) SELECT 'keyed', 'work', '{}', 'k'
            FROM generate_series(1, 2);
    """)
    await conn.close()
    pool = await create_pool(dsn, min_size=1, max_size=2)
    producer = uuid.uuid4()
    try:
        durable = await claims.claim(pool, plan("default"), producer, "test", 5)
        assert len(durable) == 5
        kept, *rest = durable
        assert (
            await claims.complete_successes(pool, [kept.id], [kept.attempt_token], [None])
        ).states
        async with wal_writer_stopped(dsn) as crash:
            lost_claims = await claims.claim(
                pool, plan("default"), producer, "test", 5, async_commit=True
            )
            for queue in ("limited", "keyed"):
                jobs, _, _ = await claims.claim_limited(
                    pool, plan(queue), producer, "test", 5, async_commit=True
                )
                lost_claims += jobs
            one, two, three, four = rest
            written = set(
                (
                    await claims.complete_successes(
                        pool, [one.id], [one.attempt_token], [None], async_commit=True
                    )
                ).states
            )
            written |= set(
                (
                    await claims.complete_successes(
                        pool, [two.id], [two.attempt_token], ['{"a": 1}'], async_commit=True
                    )
                ).states
            )
            retry = Outcome.of(three, "retryable", delay_s=0.0, error=error_entry(1, "e", "m"))
            written |= set((await claims.write_outcomes(pool, [retry], async_commit=True)).states)
            failed = error_entry(1, "outcome", "refused")
            if await claims.fail_attempt(
                pool, four.id, four.attempt_token, failed, async_commit=True
            ):
                written.add(four.id)
            assert written == {one.id, two.id, three.id, four.id}
            assert len(lost_claims) == 6
            # Committed and seen by everyone before the crash, not yet on disk.
            assert await states(pool) == {
                kept.id: "completed",
                one.id: "completed",
                two.id: "completed",
                three.id: "retryable",
                four.id: "retryable",
                **{j.id: "running" for j in lost_claims},
            }
            await pool.close()
            await crash()
    finally:
        pool.terminate()
    pool = await create_pool(dsn, min_size=1, max_size=1)
    try:
        assert await states(pool) == {
            kept.id: "completed",
            **{j.id: "running" for j in rest},
            **{j.id: "available" for j in lost_claims},
        }
        tokens = {r["id"]: r["attempt_token"] for r in await pool.fetch(
            "SELECT id, attempt_token FROM pgq_jobs WHERE state = 'running'"
        )}  # fmt: skip
        assert tokens == {j.id: j.attempt_token for j in rest}
    finally:
        await pool.close()


async def states(db: asyncpg.Pool[Any]) -> dict[int, str]:
    return {r["id"]: r["state"] for r in await db.fetch("SELECT id, state::text FROM pgq_jobs")}


#: Liveness patient enough that up to ten seconds without heartbeats (the window before the
#: crash, then the recovery) neither fences the producer nor makes it stale; strays are
#: checked every 15 s.
SETTINGS: dict[str, Any] = {
    "heartbeat_interval": 2.0,
    "heartbeat_timeout": 2.0,
    "max_heartbeat_failures": 4,
    "stale_after": 15.0,
    "rescue_interval": 1.0,
    "leader_ttl": 5.0,
    "reap_after": 60.0,
    "poll_interval": 0.2,
}


@pytest.mark.parametrize("claims_on_disk", [True, False], ids=["outcomes-lost", "claims-lost"])
async def test_a_worker_with_async_commit_runs_again_the_jobs_a_crash_took_back(
    quiet_server: Server, claims_on_disk: bool
) -> None:
    """A worker with async_commit claims and completes jobs; the server crashes before
    their commits reached the disk. Jobs whose claims were lost are available again and run
    again; jobs whose claims had reached the disk but whose outcomes were lost are running
    again under the worker's live producer, which is not running them: the worker hands
    them back (saying why) and runs them again. Every job ends completed, having run twice."""
    dsn = quiet_server.dsn
    runs: list[int] = []
    all_started, release = anyio.Event(), anyio.Event()
    app = pgq.App()

    @app.task()
    async def work(ctx: pgq.JobContext) -> None:
        runs.append(ctx.id)
        if len(runs) == 4:
            all_started.set()
        await release.wait()

    conn = await asyncpg.connect(dsn)
    locks = await asyncpg.connect(dsn)
    try:
        async with pgq.Worker(app, dsn, async_commit=True, **SETTINGS):

            async def led() -> bool:
                return bool(await conn.fetchval("SELECT count(*) FROM pgq_leader"))

            await until(led, limit_s=30)
            # Heartbeats, the leader's lease and the throughput rollup wait on these locks
            # until the crash ends them: no commit of theirs writes the WAL out.
            locks_held = locks.transaction()
            await locks_held.start()
            await locks.execute(
                "LOCK TABLE pgq_producers, pgq_leader, pgq_throughput IN EXCLUSIVE MODE"
            )
            async with wal_writer_stopped(dsn) as crash:
                # The enqueue waits for its flush, as a caller's commit does.
                ids = [
                    r["id"]
                    for r in await conn.fetch(
                        "INSERT INTO pgq_jobs (task, args) SELECT 'work', '{}'"
                        " FROM generate_series(1, 4) RETURNING id"
                    )
                ]
                with anyio.fail_after(30):
                    await all_started.wait()
                if claims_on_disk:
                    # A commit that wrote and waits for its flush writes out all the WAL
                    # before it (one that only drew a transaction id would not wait).
                    await conn.execute("CREATE TABLE flushed ()")
                release.set()

                async def completed() -> bool:
                    n = await conn.fetchval(
                        "SELECT count(*) FROM pgq_jobs WHERE state = 'completed'"
                    )
                    return bool(n == 4)

                await until(completed, limit_s=30)
                await crash()
            await conn.close()
            conn = await asyncpg.connect(dsn)

            async def completed_again() -> bool:
                n = await conn.fetchval("SELECT count(*) FROM pgq_jobs WHERE state = 'completed'")
                return bool(n == 4) and len(runs) == 8

            await until(completed_again, limit_s=90)
        assert sorted(runs) == sorted(ids * 2)
        rows = await conn.fetch("SELECT attempt, errors::text FROM pgq_jobs ORDER BY id")
        assert [r["attempt"] for r in rows] == [1] * 4
        errors = [[(e["kind"], e["message"]) for e in json.loads(r["errors"])] for r in rows]
        if claims_on_disk:
            assert errors == [[("lost_reply", LOST_REPLY_OR_OUTCOME)]] * 4
        else:
            assert errors == [[]] * 4
    finally:
        for c in (conn, locks):
            with contextlib.suppress(Exception):
                await c.close()
