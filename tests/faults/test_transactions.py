"""Tasks that write in their own transaction, under random kills and stops, and cut off
while it is open: each effect lands exactly once, and an open transaction is bounded by the
server's idle timeout."""

from __future__ import annotations

from pathlib import Path

import anyio
import anyio.abc
import anyio.lowlevel
import asyncpg
import pytest

import pgq
from tests.faults.proxy import Proxy
from tests.faults.workers import (
    SHORT,
    WorkerProcess,
    upstream,
    via_proxy,
    wait_registered,
)
from tests.tests_support import until

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.timeout(180)]


# The two tests that hold the most connections (about 41 and 52 at their peak) never run at
# the same time under pytest-xdist: together they came near the server's 100.
@pytest.mark.xdist_group("many-connections")
async def test_random_kills_and_stops_leave_each_transactional_effect_exactly_once(
    dsn: str, tmp_path: Path
) -> None:
    """The chaos harness, short: kill -9 and SIGSTOP/SIGCONT of three workers at random while
    150 jobs write their effect and complete in one transaction."""
    from tests.faults import chaos

    report = await chaos.run(dsn, tmp_path, workers=3, jobs=150, seconds=10)
    print(report.summary())
    assert report.violations == {}, report.summary()
    assert report.completed == report.jobs
    assert report.faults, "the nemesis did its work"


async def test_a_cut_off_workers_open_transaction_is_bounded_by_the_servers_idle_timeout(
    dsn: str, db: asyncpg.Connection[asyncpg.Record], workers: list[WorkerProcess], tmp_path: Path
) -> None:
    """A worker cut off after its task settled in an open transaction keeps the job's row
    locked; the rescuer passes over it (SKIP LOCKED) until the server ends the idle
    transaction (idle_in_transaction_session_timeout); then it is rescued, run elsewhere,
    and the first transaction's effect is gone with it."""
    from tests.faults import chaos

    await chaos.prepare(dsn)  # idle_in_transaction_session_timeout = 2 s on this database
    proxy = Proxy(*upstream(dsn))
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.run)
        cut = WorkerProcess("cut-off", via_proxy(dsn, port), tmp_path, SHORT, concurrency=1)
        workers.append(cut)
        cut.start()
        await wait_registered(db, "cut-off")
        async with pgq.Client(dsn) as client:
            job = await client.enqueue("tx_effect", {"work_s": 0.0, "before_commit_s": 60.0})

            async def settled_open() -> bool:  # its effect written, its transaction open
                return bool(
                    await db.fetchval(
                        "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction'"
                        " AND datname = current_database()"
                    )
                )

            await until(settled_open, limit_s=30)
            peer = WorkerProcess("peer", dsn, tmp_path, SHORT)
            workers.append(peer)
            peer.start()
            await wait_registered(db, "peer")
            proxy.stall()
            faulted = anyio.current_time()
            done = await client.wait(job.id, timeout=60)
            took = anyio.current_time() - faulted
        # Its task still waits to commit for a minute, in a transaction the server ended: the
        # test is over, the process goes as a killed one does (a stop would wait for it).
        cut.kill9()
        proxy.heal()
        tg.cancel_scope.cancel()
    assert done.state is pgq.JobState.COMPLETED and done.attempt == 2
    effects = await db.fetch("SELECT attempt, worker FROM effects WHERE job_id = $1", job.id)
    assert [(r["attempt"]) for r in effects] == [2], "the first transaction's effect rolled back"
    assert (
        took
        <= SHORT["stale_after"] + chaos.IDLE_IN_TRANSACTION_S + 2 * SHORT["rescue_interval"] + 5
    )
