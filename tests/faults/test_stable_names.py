"""Fast recovery for stable worker names: a worker restarted under its name after kill -9
takes over its previous run's jobs once that run's fencing bound has passed, long before the
leader's stale_after; two live workers with one name never rescue each other's jobs."""

from __future__ import annotations

import json
from pathlib import Path

import asyncpg
import pytest

from tests.faults.checks import all_completed, assert_exactly_once, enqueue, running_under
from tests.faults.workers import WorkerProcess, wait_registered
from tests.tests_support import until

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.timeout(180)]

#: A fencing bound of 1 x 2 + 0.5 = 2.5 s, far below stale_after (20 s): a take-over within
#: 15 s of the kill can only be the restarted worker's.
SETTINGS: dict[str, float] = {
    "heartbeat_interval": 1.0,
    "heartbeat_timeout": 0.5,
    "max_heartbeat_failures": 2,
    "stale_after": 20.0,
    "rescue_interval": 1.0,
    "leader_ttl": 3.0,
    "reap_after": 60.0,
    "schedule_interval": 0.2,
    "poll_interval": 0.5,
    "shutdown_timeout": 5.0,
}


async def test_a_worker_restarted_under_its_name_takes_over_its_jobs_before_stale_after(
    dsn: str, db: asyncpg.Connection[asyncpg.Record], workers: list[WorkerProcess], tmp_path: Path
) -> None:
    first = WorkerProcess("stable-1", dsn, tmp_path, SETTINGS)
    workers.append(first)
    first.start()
    await wait_registered(db, "stable-1")
    ids = await enqueue(dsn, 3, 3.0)

    async def holds_all() -> bool:
        return await running_under(db, "stable-1") == 3

    await until(holds_all, limit_s=30)
    first.kill9()
    again = WorkerProcess("stable-1", dsn, tmp_path, SETTINGS)
    workers.append(again)
    again.start()

    async def taken_over() -> bool:
        n = await db.fetchval(
            "SELECT count(*) FROM pgq_jobs WHERE id = ANY($1) AND attempt = 2", ids
        )
        return bool(n == 3)

    await until(taken_over, limit_s=15)
    for errors in await db.fetch("SELECT errors FROM pgq_jobs WHERE id = ANY($1)", ids):
        entry = json.loads(errors[0])[0]
        assert entry["kind"] == "rescued" and entry["reason"] == "worker restarted"
    await until(lambda: all_completed(db, ids), limit_s=30)
    await assert_exactly_once(db, ids)
    assert "took over 3 job(s) of its previous run" in again.output()


async def test_two_live_workers_with_one_name_never_rescue_each_others_jobs(
    dsn: str, db: asyncpg.Connection[asyncpg.Record], workers: list[WorkerProcess], tmp_path: Path
) -> None:
    a = WorkerProcess("twin", dsn, tmp_path, SETTINGS, concurrency=2)
    workers.append(a)
    a.start()
    await wait_registered(db, "twin")
    ids = await enqueue(dsn, 2, 8.0)

    async def a_holds_both() -> bool:
        return await running_under(db, "twin") == 2

    await until(a_holds_both, limit_s=30)
    b = WorkerProcess("twin", dsn, tmp_path, SETTINGS, concurrency=2)
    b.log_path = tmp_path / "twin-b.log"
    workers.append(b)
    b.start()

    async def reported() -> bool:
        return "another live worker is named twin" in b.output()

    await until(reported, limit_s=20)
    rows = await db.fetch(
        "SELECT state::text, attempt, errors FROM pgq_jobs WHERE id = ANY($1)", ids
    )
    assert all(r["attempt"] == 1 and json.loads(r["errors"]) == [] for r in rows), rows
    await until(lambda: all_completed(db, ids), limit_s=30)
    assert await db.fetchval("SELECT max(attempt) FROM pgq_jobs WHERE id = ANY($1)", ids) == 1
