"""Workers survive a restart of Postgres: no job lost, none completed twice."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import anyio.abc
import anyio.lowlevel
import asyncpg
import pytest

from pgq import migrate
from tests.faults.checks import all_completed, assert_exactly_once, enqueue
from tests.faults.cluster import Server, lone_server
from tests.faults.workers import (
    SHORT,
    WorkerProcess,
    wait_registered,
)
from tests.tests_support import until

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.timeout(180)]


@pytest.fixture
async def restartable() -> AsyncIterator[Server]:
    """A migrated server of this test's own, which it may restart without cutting off the
    tests running beside it."""
    with lone_server() as server:
        await migrate.upgrade_async(server.dsn)
        yield server


async def test_workers_survive_a_postgres_restart(
    restartable: Server, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    dsn = restartable.dsn
    conn = await asyncpg.connect(dsn)
    await conn.execute("""
        CREATE TABLE starts (job_id bigint, attempt int, worker text, at timestamptz DEFAULT now());
        CREATE TABLE effects (job_id bigint, attempt int, worker text, at timestamptz DEFAULT now());
    """)
    await conn.close()
    # A long poll interval: after the restart only LISTEN can wake the workers promptly.
    settings = {**SHORT, "poll_interval": 60.0}
    one = WorkerProcess("one", dsn, tmp_path, settings)
    two = WorkerProcess("two", dsn, tmp_path, settings)
    workers += [one, two]
    one.start()
    two.start()
    conn = await asyncpg.connect(dsn)
    try:
        await wait_registered(conn, "one", "two")
        before = await enqueue(dsn, 20, 1.0)

        async def mid_run() -> bool:  # jobs are running when the server goes down
            return bool(
                await conn.fetchval("SELECT count(*) FROM pgq_jobs WHERE state = 'running'")
            )

        await until(mid_run, limit_s=30)
    finally:
        await conn.close()
    await anyio.to_thread.run_sync(restartable.restart)
    conn = await asyncpg.connect(dsn)
    try:
        await until(lambda: all_completed(conn, before), limit_s=90)
        await assert_exactly_once(conn, before)

        async def listening_again() -> bool:
            n = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pgq listen %'"
                " AND datname = current_database()"
            )
            return bool(n == 2)

        await until(listening_again, limit_s=30)
        after = await enqueue(dsn, 5, 0.1)
        # Well inside the 60 s poll interval: only a NOTIFY can have woken them.
        await until(lambda: all_completed(conn, after), limit_s=20)
        await assert_exactly_once(conn, after)
    finally:
        await conn.close()
