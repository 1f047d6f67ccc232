"""Real faults against real worker processes and a real Postgres: the jobs of a worker
killed outright run again once and promptly, a healthy worker's never, a killed leader is
replaced within its lease, and a job cancelled while its dead worker awaits rescue never
runs again. Each test checks, on the jobs' recorded side effects, that no job is lost and
none completes twice."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import anyio
import anyio.abc
import anyio.lowlevel
import asyncpg
import pytest

import pgq
from tests.faults.checks import all_completed, assert_exactly_once, enqueue, running_under
from tests.faults.workers import (
    SHORT,
    WorkerProcess,
    wait_registered,
)
from tests.tests_support import until

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.timeout(180)]


async def test_kill9_jobs_run_again_once_and_promptly(
    dsn: str, db: asyncpg.Connection[asyncpg.Record], workers: list[WorkerProcess], tmp_path: Path
) -> None:
    a = WorkerProcess("victim", dsn, tmp_path, SHORT)
    b = WorkerProcess("survivor", dsn, tmp_path, SHORT)
    workers += [a, b]
    b.start()
    await wait_registered(db, "survivor")
    a.start()
    await wait_registered(db, "victim")
    ids = await enqueue(dsn, 10, 3.0)

    async def victim_busy() -> bool:
        return await running_under(db, "victim") >= 2

    await until(victim_busy, limit_s=30)
    held = [
        r[0]
        for r in await db.fetch(
            "SELECT j.id FROM pgq_jobs j JOIN pgq_producers p ON p.id = j.producer_id"
            " WHERE j.state = 'running' AND p.worker_name = 'victim'"
        )
    ]
    a.kill9()
    killed_at: datetime = await db.fetchval("SELECT now()")
    await until(lambda: all_completed(db, ids), limit_s=60)
    await assert_exactly_once(db, ids)
    reclaims = await db.fetch(
        "SELECT id, attempted_at, errors FROM pgq_jobs WHERE id = ANY($1)", held
    )
    bound = SHORT["stale_after"] + SHORT["rescue_interval"] + 2.0
    for r in reclaims:
        errors = json.loads(r["errors"])
        assert errors[0]["kind"] == "rescued" and errors[0]["worker_name"] == "victim"
        delay = (r["attempted_at"] - killed_at).total_seconds()
        assert delay <= bound, (
            f"job {r['id']} re-claimed {delay:.1f}s after the kill (bound {bound}s)"
        )
    finished = await db.fetch("SELECT DISTINCT worker FROM effects WHERE job_id = ANY($1)", held)
    assert {r[0] for r in finished} == {"survivor"}


async def test_a_healthy_worker_running_one_long_job_is_never_rescued(
    dsn: str, db: asyncpg.Connection[asyncpg.Record], workers: list[WorkerProcess], tmp_path: Path
) -> None:
    settings = {
        **SHORT,
        "heartbeat_interval": 0.4,
        "heartbeat_timeout": 0.3,
        "stale_after": 2.0,
        "rescue_interval": 0.5,
    }
    w = WorkerProcess("steady", dsn, tmp_path, settings)
    workers.append(w)
    w.start()
    await wait_registered(db, "steady")
    ids = await enqueue(dsn, 1, 5 * settings["stale_after"])
    await until(lambda: all_completed(db, ids), limit_s=60)
    await assert_exactly_once(db, ids)
    job = await db.fetchrow("SELECT attempt, errors::text FROM pgq_jobs WHERE id = $1", ids[0])
    assert job is not None and job["attempt"] == 1 and job["errors"] == "[]"


async def test_a_killed_leader_is_replaced_within_its_ttl(
    dsn: str, db: asyncpg.Connection[asyncpg.Record], workers: list[WorkerProcess], tmp_path: Path
) -> None:
    leader = WorkerProcess("leader", dsn, tmp_path, SHORT)
    follower = WorkerProcess("follower", dsn, tmp_path, SHORT)
    workers += [leader, follower]
    leader.start()
    await wait_registered(db, "leader")
    follower.start()
    await wait_registered(db, "follower")
    assert await db.fetchval("SELECT worker_name FROM pgq_leader") == "leader"
    ids = await enqueue(dsn, 10, 3.0)

    async def leader_busy() -> bool:
        return await running_under(db, "leader") >= 1

    await until(leader_busy, limit_s=30)
    leader.kill9()
    killed = anyio.current_time()

    async def taken_over() -> bool:
        return bool(
            await db.fetchval(
                "SELECT worker_name = 'follower' FROM pgq_leader WHERE expires_at > now()"
            )
        )

    await until(
        taken_over,
        limit_s=30,
    )
    bound = SHORT["leader_ttl"] + SHORT["leader_ttl"] / 3 + 1.0
    assert anyio.current_time() - killed <= bound
    await until(lambda: all_completed(db, ids), limit_s=60)
    await assert_exactly_once(db, ids)


async def test_jobs_cancelled_while_their_dead_worker_awaits_rescue_never_run_again(
    dsn: str, db: asyncpg.Connection[asyncpg.Record], workers: list[WorkerProcess], tmp_path: Path
) -> None:
    victim = WorkerProcess("victim", dsn, tmp_path, SHORT)
    workers.append(victim)
    victim.start()
    await wait_registered(db, "victim")
    ids = await enqueue(dsn, 3, 60.0)

    async def all_started() -> bool:
        return bool(await db.fetchval("SELECT count(*) FROM starts") == 3)

    await until(all_started, limit_s=30)
    victim.kill9()
    async with pgq.Client(dsn) as client:
        for job_id in ids:
            job = await client.cancel(job_id)
            assert job is not None and job.state is pgq.JobState.RUNNING, "a request, for now"
        peer = WorkerProcess("peer", dsn, tmp_path, SHORT)
        workers.append(peer)
        peer.start()
        for job_id in ids:
            done = await client.wait(job_id, timeout=60)
            assert done.state is pgq.JobState.CANCELLED
            assert [e["kind"] for e in done.errors[-2:]] == ["rescued", "cancel"]
    starts = await db.fetch("SELECT job_id, worker FROM starts ORDER BY job_id")
    assert [(r["job_id"], r["worker"]) for r in starts] == [(i, "victim") for i in ids]
