"""pgq behind a real PgBouncer in transaction mode (pooler="transaction"): enqueue by every
path, two worker processes draining through it, a cancel, the leader's lease and a rescue
after kill -9 - nothing lost, and no prepared-statement or startup-parameter error anywhere.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import asyncpg
import pytest

import pgq
from tests.faults.pgbouncer import Bouncer, pgbouncer
from tests.faults.workers import SHORT, WorkerProcess, wait_registered
from tests.tests_support import until

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.timeout(180)]

POOLED = ("--pooler", "transaction")
TROUBLE = ("prepared statement", "unsupported startup parameter", "Traceback")


@pytest.fixture
def bouncer(dsn: str) -> Iterator[Bouncer]:
    with pgbouncer(dsn) as b:
        yield b


async def run_cli(*args: str) -> tuple[int, str]:
    with anyio.fail_after(60):
        done = await anyio.run_process([sys.executable, "-m", "pgq", *args], check=False)
    return done.returncode, done.stderr.decode()


async def test_client_enqueues_by_every_path_and_waits_through_pgbouncer(
    bouncer: Bouncer, dsn: str
) -> None:
    async with pgq.Client(bouncer.dsn, pooler="transaction") as client:
        singles = [await client.enqueue("effect", {"seconds": 0}) for _ in range(20)]
        await client.enqueue_many(  # keyless: the COPY path
            [pgq.JobSpec("effect", {"seconds": 0}) for _ in range(300)]
        )
        keyed = await client.enqueue_many(  # unique keys: the INSERT path
            [pgq.JobSpec("effect", {"seconds": 0}, unique_key=f"k{i % 10}") for i in range(30)]
        )
        assert sum(not j.duplicate for j in keyed) == 10
        cancelled = await client.cancel(singles[0].id)
        assert cancelled is not None and cancelled.state == pgq.JobState.CANCELLED
        # wait() cannot LISTEN through the pooler: it reads until the job is final
        done = await client.wait(singles[0].id, timeout=10)
        assert done.state == pgq.JobState.CANCELLED
        counts = await client.count_by_state()
    assert counts[pgq.JobState.AVAILABLE] == 19 + 300 + 10
    with pgq.SyncClient(bouncer.dsn, pooler="transaction") as sync:
        for _ in range(10):  # past psycopg's prepare threshold (5)
            sync.enqueue("effect", {"seconds": 0})
        one = sync.enqueue("effect", {"seconds": 0})
        for _ in range(6):
            assert sync.get_job(one.id) == one
        sync_cancelled = sync.cancel(one.id)
        assert sync_cancelled is not None and sync_cancelled.state is pgq.JobState.CANCELLED
        assert sync.wait(one, timeout=10).state is pgq.JobState.CANCELLED  # it reads
        assert sync.retry([one.id]) == [one.id]
    with pgq.SyncClient(bouncer.dsn, pooler="transaction", listen_dsn=dsn) as sync:
        sync.cancel(one.id)
        assert sync.wait(one, timeout=10).state is pgq.JobState.CANCELLED  # it listens
        assert sync.retry([one.id]) == [one.id]
    code, err = await run_cli(
        "enqueue", "effect", "--args", '{"seconds": 0}', "--dsn", bouncer.dsn, *POOLED
    )
    assert code == 0, err
    for _ in range(2):  # a second process must not meet the first one's statements
        code, err = await run_cli("migrate", "--dsn", bouncer.dsn, *POOLED)
        assert code == 0, err
    conn = await asyncpg.connect(dsn)
    try:
        assert await conn.fetchval("SELECT count(*) FROM pgq_jobs") == 20 + 300 + 10 + 12
    finally:
        await conn.close()
    assert not [t for t in TROUBLE if t in bouncer.log()]


async def test_two_workers_drain_cancel_and_rescue_through_pgbouncer(
    bouncer: Bouncer,
    dsn: str,
    db: asyncpg.Connection[asyncpg.Record],
    workers: list[WorkerProcess],
    tmp_path: Path,
) -> None:
    def worker(name: str) -> WorkerProcess:
        return WorkerProcess(name, bouncer.dsn, tmp_path, SHORT, extra_args=POOLED, effects_dsn=dsn)

    a, b = worker("bounced-a"), worker("bounced-b")
    workers += [a, b]
    a.start()
    await wait_registered(db, "bounced-a")  # a leads: its death moves the lease
    async with pgq.Client(bouncer.dsn, pooler="transaction") as client:
        # The slow jobs never end on a, which is killed holding some (a starts first, so b
        # cannot have claimed them all); b runs the others, and those rescued from a, at once.
        spec = pgq.JobSpec("effect", {"seconds": 0.01, "hold_on": "bounced-a"})
        slow = await client.enqueue_many([spec] * 10)

        async def a_holds_slow_jobs() -> bool:
            n = await db.fetchval(
                "SELECT count(*) FROM pgq_jobs j JOIN pgq_producers p ON p.id = j.producer_id"
                " WHERE j.state = 'running' AND p.worker_name = 'bounced-a'"
                " AND j.id = ANY($1)",
                [j.id for j in slow],
            )
            return bool(n >= 2)

        await until(a_holds_slow_jobs, limit_s=30)
        b.start()
        await wait_registered(db, "bounced-b")
        fast = await client.enqueue_many([pgq.JobSpec("effect", {"seconds": 0.01})] * 400)
        long = await client.enqueue("effect", {"seconds": 600.0})
        a.kill9()

        async def long_running() -> bool:
            job = await client.get_job(long.id)
            return job is not None and job.state == pgq.JobState.RUNNING

        await until(long_running, limit_s=60)
        await client.cancel(long.id)  # told by the worker's cancel poll: no LISTEN here
        with anyio.fail_after(60):
            final = await client.wait(long.id)
        assert final.state == pgq.JobState.CANCELLED

        ids = [j.id for j in [*slow, *fast]]

        async def all_completed() -> bool:
            n = await db.fetchval(
                "SELECT count(*) FROM pgq_jobs WHERE id = ANY($1) AND state = 'completed'", ids
            )
            return bool(n == len(ids))

        await until(all_completed, limit_s=90)
    missing = await db.fetchval(
        "SELECT count(*) FROM unnest($1::bigint[]) id"
        " WHERE NOT EXISTS (SELECT 1 FROM effects e WHERE e.job_id = id)",
        ids,
    )
    assert missing == 0
    assert await db.fetchval("SELECT count(*) FROM pgq_jobs WHERE state = 'running'") == 0
    rescued = await db.fetchval(
        "SELECT count(*) FROM pgq_jobs WHERE id = ANY($1) AND errors::text LIKE '%rescued%'",
        [j.id for j in slow],
    )
    assert rescued >= 2  # the jobs a held when it was killed, rescued through the pooler
    assert b.stop() == 0
    for log in (a.output(), b.output(), bouncer.log()):
        assert not [t for t in TROUBLE if t in log], log[-3000:]
