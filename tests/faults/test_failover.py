"""Failover to a promoted standby under running workers: a primary with a synchronous
standby on loopback, two `pgq worker` processes on a multi-host DSN, the primary stopped
immediately mid-drain and the standby promoted. Every job completes on the new primary,
none is left running, and the workers carry on without a restart."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import asyncpg
import pytest

import pgq
from pgq.errors import DatabaseUnavailable
from tests.faults.cluster import Cluster, primary_and_standby
from tests.faults.workers import SHORT, WorkerProcess, wait_registered
from tests.tests_support import until

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.timeout(240)]

JOBS = 600


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with primary_and_standby() as c:
        yield c


@pytest.fixture
async def migrated(cluster: Cluster) -> Cluster:
    with anyio.fail_after(60):
        done = await anyio.run_process(
            [sys.executable, "-m", "pgq", "migrate", "--dsn", cluster.dsn], check=False
        )
    assert done.returncode == 0, done.stderr.decode()
    conn = await asyncpg.connect(cluster.primary_dsn)
    try:
        await conn.execute("""
            CREATE TABLE starts (job_id bigint, attempt int, worker text, at timestamptz DEFAULT now());
            CREATE TABLE effects (job_id bigint, attempt int, worker text, at timestamptz DEFAULT now());
        """)
    finally:
        await conn.close()
    return cluster


async def test_a_standby_alone_is_refused_with_the_reason(migrated: Cluster) -> None:
    with pytest.raises(DatabaseUnavailable, match=r"standby \(read-only\)"):
        async with pgq.Client(migrated.standby_dsn):
            pass


async def test_clients_pass_over_a_standby_listed_first(migrated: Cluster) -> None:
    standby_first = (
        f"postgresql://postgres@127.0.0.1:{migrated.standby_port},"
        f"127.0.0.1:{migrated.primary_port}/postgres"
    )
    async with pgq.Client(standby_first) as client:
        assert (await client.enqueue("effect", {"seconds": 0})).id > 0
    with pgq.SyncClient(standby_first) as sync:
        assert sync.enqueue("effect", {"seconds": 0}).id > 0


async def test_workers_carry_on_through_a_failover_to_the_promoted_standby(
    migrated: Cluster, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    cluster = migrated
    a = WorkerProcess("ha-a", cluster.dsn, tmp_path, SHORT)
    b = WorkerProcess("ha-b", cluster.dsn, tmp_path, SHORT)
    workers += [a, b]
    a.start()
    b.start()
    conn = await asyncpg.connect(cluster.primary_dsn)
    try:
        await wait_registered(conn, "ha-a", "ha-b")
        async with pgq.Client(cluster.dsn) as client:
            ids = [
                j.id
                for j in await client.enqueue_many(
                    [pgq.JobSpec("effect", {"seconds": 0.2})] * JOBS  # ~12 s of work
                )
            ]

        async def some_done() -> bool:
            n = await conn.fetchval("SELECT count(*) FROM pgq_jobs WHERE state = 'completed'")
            return bool(n >= JOBS // 10)

        await until(some_done, limit_s=60)
    finally:
        await conn.close()
    cluster.stop_primary_immediately()
    cluster.promote_standby()
    promoted = time.monotonic()
    new = await asyncpg.connect(cluster.dsn)
    try:
        assert await new.fetchval("SELECT inet_server_port()") == cluster.standby_port
        before = await new.fetchval("SELECT count(*) FROM pgq_jobs WHERE state = 'completed'")
        assert before < JOBS, "the drain ended before the failover: nothing left to resume"

        async def resumed() -> bool:
            n = await new.fetchval("SELECT count(*) FROM pgq_jobs WHERE state = 'completed'")
            return bool(n > before)

        await until(resumed, limit_s=60)
        print(f"work resumed {time.monotonic() - promoted:.2f} s after the promotion")

        async def all_completed() -> bool:
            n = await new.fetchval(
                "SELECT count(*) FROM pgq_jobs WHERE id = ANY($1) AND state = 'completed'", ids
            )
            return bool(n == len(ids))

        await until(all_completed, limit_s=120)
        assert await new.fetchval("SELECT count(*) FROM pgq_jobs WHERE state = 'running'") == 0
        without_effect = await new.fetchval(
            "SELECT count(*) FROM unnest($1::bigint[]) id"
            " WHERE NOT EXISTS (SELECT 1 FROM effects e WHERE e.job_id = id)",
            ids,
        )
        assert without_effect == 0
    finally:
        await new.close()
    for w in (a, b):
        assert w.proc is not None and w.proc.poll() is None, f"{w.name} exited"
        assert w.output().count(" started: ") == 1, w.output()[-3000:]
    assert a.stop() == 0 and b.stop() == 0
