"""Liveness in a fleet as it runs in production: workers with different settings side by
side, an application transaction holding a job's row, a leader that dies, a restarted worker
under its stable name, jobs of a task no worker serves. Real worker processes throughout."""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import asyncpg
import pytest

import pgq
from tests.faults.checks import all_completed, assert_exactly_once, enqueue, running_under
from tests.faults.workers import HERE, ROOT, SHORT, WorkerProcess, wait_registered
from tests.tests_support import until

if TYPE_CHECKING:
    from tests.tests_support import Conn

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.timeout(180)]

#: Short bounds: beats every 0.5 s, fenced after 1.9 s, stale after 3 s.
SHORT_BOUNDS: dict[str, float] = {
    **SHORT,
    "heartbeat_interval": 0.5,
    "heartbeat_timeout": 0.4,
    "max_heartbeat_failures": 3,
    "stale_after": 3.0,
    "rescue_interval": 0.5,
    "rescue_grace": 1.0,
}

#: Long bounds, valid on their own (fenced after 4 x 2 + 1 = 9 s, stale after 12 s), whose
#: beats are further apart (4 s) than SHORT_BOUNDS' stale_after.
LONG_BOUNDS: dict[str, float] = {
    **SHORT,
    "heartbeat_interval": 4.0,
    "heartbeat_timeout": 1.0,
    "max_heartbeat_failures": 2,
    "stale_after": 12.0,
    "rescue_interval": 1.0,
}


async def leads(db: Conn, name: str) -> None:
    """Return once worker ``name`` holds the leader's lease."""

    async def holds() -> bool:
        held = await db.fetchval(
            "SELECT worker_name FROM pgq_leader WHERE name = 'default' AND expires_at > now()"
        )
        return bool(held == name)

    await until(holds, limit_s=30)


async def rescues(db: Conn, ids: list[int]) -> list[dict[str, object]]:
    """The first rescue entry of each job of ``ids`` that has one."""
    rows = await db.fetch(
        "SELECT (SELECT e FROM jsonb_array_elements(errors) e WHERE e ->> 'kind' = 'rescued'"
        " LIMIT 1) AS entry FROM pgq_jobs WHERE id = ANY($1) ORDER BY id",
        ids,
    )
    return [json.loads(r["entry"]) for r in rows if r["entry"] is not None]


async def both_rescued(db: Conn, ids: list[int]) -> bool:
    return len(await rescues(db, ids)) == len(ids)


def side_worker(name: str, dsn: str, tmp_path: Path, settings: dict[str, float]) -> WorkerProcess:
    """A worker that serves only queue ``side`` (none of the tests' jobs go there): a leader
    that judges the others without claiming their jobs."""
    return WorkerProcess(name, dsn, tmp_path, settings, extra_args=("--queue", "side:1"))


async def test_a_leader_with_shorter_bounds_never_rescues_a_healthy_peer_with_longer_ones(
    dsn: str, db: Conn, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    lead = side_worker("lead", dsn, tmp_path, SHORT_BOUNDS)
    workers.append(lead)
    lead.start()
    await leads(db, "lead")
    peer = WorkerProcess("long", dsn, tmp_path, LONG_BOUNDS, concurrency=4)
    workers.append(peer)
    peer.start()
    await wait_registered(db, "long")
    # Each job outlasts a gap between the peer's beats (4 s) longer than the leader's
    # stale_after (3 s): judged by the leader's bounds, all four would be taken from it.
    ids = await enqueue(dsn, 4, 7.0)

    async def holds_all() -> bool:
        return await running_under(db, "long") == 4

    await until(holds_all, limit_s=30)
    await until(lambda: all_completed(db, ids), limit_s=60)
    assert await rescues(db, ids) == []
    assert await db.fetchval("SELECT max(attempt) FROM pgq_jobs WHERE id = ANY($1)", ids) == 1
    await assert_exactly_once(db, ids)


async def kill_a_peer_holding_two_jobs(
    dsn: str,
    db: Conn,
    workers: list[WorkerProcess],
    tmp_path: Path,
    lead_settings: dict[str, float],
    peer: tuple[str, dict[str, float]],
) -> list[int]:
    """A leader serving only ``side``, and a peer (name, settings) holding two jobs that
    never end on it, killed with -9; returns the jobs' ids."""
    lead = side_worker("lead", dsn, tmp_path, lead_settings)
    workers.append(lead)
    lead.start()
    await leads(db, "lead")
    name, settings = peer
    victim = WorkerProcess(name, dsn, tmp_path, settings, concurrency=2)
    workers.append(victim)
    victim.start()
    await wait_registered(db, name)
    async with pgq.Client(dsn) as client:
        jobs = await client.enqueue_many(
            [pgq.JobSpec("effect", {"seconds": 1.0, "hold_on": name}) for _ in range(2)]
        )
    ids = [j.id for j in jobs]

    async def holds_both() -> bool:
        return await running_under(db, name) == 2

    await until(holds_both, limit_s=30)
    victim.kill9()
    return ids


async def test_a_dead_peer_with_shorter_bounds_is_rescued_after_its_own_stale_after(
    dsn: str, db: Conn, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    peer = ("short", SHORT_BOUNDS)
    ids = await kill_a_peer_holding_two_jobs(dsn, db, workers, tmp_path, LONG_BOUNDS, peer)
    # Its own stale_after (3 s) and a rescue round (1 s), far from the leader's 12 s.
    await until(lambda: both_rescued(db, ids), limit_s=9)
    for entry in await rescues(db, ids):
        assert entry["reason"] == "producer stale"
        assert 3.0 <= float(str(entry["silent_s"])) < 12.0, entry
    # A first rescue applies no backoff: runnable at once, by any worker.
    states = await db.fetch("SELECT state::text FROM pgq_jobs WHERE id = ANY($1)", ids)
    assert {r["state"] for r in states} == {"available"}


async def test_a_killed_peer_with_longer_bounds_keeps_its_jobs_until_its_own_stale_after(
    dsn: str, db: Conn, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    peer = ("long", LONG_BOUNDS)
    ids = await kill_a_peer_holding_two_jobs(dsn, db, workers, tmp_path, SHORT_BOUNDS, peer)
    await until(lambda: both_rescued(db, ids), limit_s=40)
    for entry in await rescues(db, ids):
        assert entry["reason"] == "producer stale"
        # Judged by its own stale_after (12 s), not the leader's (3 s).
        assert float(str(entry["silent_s"])) >= 12.0, entry


async def test_outcomes_never_wait_for_a_lock_an_open_transaction_holds(
    dsn: str, db: Conn, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    worker = WorkerProcess("w", dsn, tmp_path, {**SHORT, "rescue_grace": 1.0}, concurrency=40)
    workers.append(worker)
    worker.start()
    await wait_registered(db, "w")
    (parent,) = await enqueue(dsn, 1, 2.0)

    async def parent_started() -> bool:
        return bool(await db.fetchval("SELECT count(*) FROM starts WHERE job_id = $1", parent))

    await until(parent_started, limit_s=30)
    app_conn = await asyncpg.connect(dsn)
    try:
        # The application enqueues a dependent of the running parent in its transaction (which
        # updates the parent's row) and keeps that transaction open.
        tx = app_conn.transaction()
        await tx.start()
        async with pgq.Client(dsn) as client:
            await client.enqueue(
                "effect", {"seconds": 0.0}, depends_on=[parent], connection=app_conn
            )

            async def outcome_waits() -> bool:
                n = await db.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND datname = current_database() AND query LIKE '%pgq_jobs%'"
                )
                return bool(n)

            # The parent's outcome is written, and waits for the transaction's lock.
            await until(outcome_waits, limit_s=30)
            quick = await client.enqueue_many(
                [pgq.JobSpec("timed_effect", {"seconds": 0.1}) for _ in range(30)]
            )
        ids = [j.id for j in quick]
        # Their outcomes land while the parent's waits for the transaction: none is held
        # up past its 2 s timeout, so none is rescued as an overrun and run again.
        await until(lambda: all_completed(db, ids), limit_s=30)

        async def parent_waits() -> bool:
            return "waits for its row, locked by another transaction" in worker.output()

        await until(parent_waits, limit_s=30)
        assert await db.fetchval("SELECT state::text FROM pgq_jobs WHERE id = $1", parent) == (
            "running"
        )
        await tx.commit()
    finally:
        await app_conn.close()
    # The parent's outcome, waiting on the row, gets it once the transaction ends.
    await until(lambda: all_completed(db, [parent]), limit_s=30)
    assert await db.fetchval("SELECT attempt FROM pgq_jobs WHERE id = $1", parent) == 1
    runs = await db.fetch(
        "SELECT job_id, count(*) AS n FROM starts WHERE job_id = ANY($1) GROUP BY job_id", ids
    )
    assert sorted((r["job_id"], r["n"]) for r in runs) == [(i, 1) for i in sorted(ids)]
    await assert_exactly_once(db, [*ids, parent])


async def test_a_restarted_worker_reruns_its_predecessors_jobs_while_the_dead_lease_holds(
    dsn: str, db: Conn, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    # Fenced after 1 x 2 + 0.5 = 2.5 s; the dead run led, with a lease of 30 s.
    settings = {**SHORT, "max_heartbeat_failures": 2, "stale_after": 20.0, "leader_ttl": 30.0}
    first = WorkerProcess("stable-1", dsn, tmp_path, settings, concurrency=3)
    workers.append(first)
    first.start()
    await leads(db, "stable-1")
    ids = await enqueue(dsn, 3, 60.0)

    async def holds_all() -> bool:
        return await running_under(db, "stable-1") == 3

    await until(holds_all, limit_s=30)
    first.kill9()
    killed_at: datetime = await db.fetchval("SELECT clock_timestamp()")
    again = WorkerProcess("stable-1", dsn, tmp_path, settings, concurrency=3)
    workers.append(again)
    again.start()

    async def rerun() -> bool:
        n = await db.fetchval(
            "SELECT count(DISTINCT job_id) FROM starts WHERE job_id = ANY($1) AND attempt = 2",
            ids,
        )
        return bool(n == 3)

    # The takeover makes them runnable at once: no promotion by a leader, which no one can
    # be until the dead run's lease ends, 30 s after its last renewal.
    await until(rerun, limit_s=20)
    started: datetime = await db.fetchval(
        "SELECT max(at) FROM starts WHERE job_id = ANY($1) AND attempt = 2", ids
    )
    assert (started - killed_at).total_seconds() < 20
    leader = await db.fetchval("SELECT worker_name FROM pgq_leader WHERE expires_at > now()")
    assert leader == "stable-1", "the dead run's lease is still held"


async def test_a_job_due_while_the_leader_is_dead_starts_on_time(
    dsn: str, db: Conn, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    settings = {**SHORT, "leader_ttl": 30.0}
    lead = WorkerProcess("lead", dsn, tmp_path, settings)
    workers.append(lead)
    lead.start()
    await leads(db, "lead")
    other = WorkerProcess("other", dsn, tmp_path, settings)
    workers.append(other)
    other.start()
    await wait_registered(db, "other")
    async with pgq.Client(dsn) as client:
        job = await client.enqueue("effect", {"seconds": 0.0}, delay=3)
    lead.kill9()

    async def started() -> bool:
        return bool(await db.fetchval("SELECT count(*) FROM starts WHERE job_id = $1", job.id))

    await until(started, limit_s=20)
    late = await db.fetchval(
        "SELECT extract(epoch FROM s.at - j.scheduled_at)::float8 FROM starts s"
        " JOIN pgq_jobs j ON j.id = s.job_id WHERE s.job_id = $1",
        job.id,
    )
    # Promoted by the live worker (every 0.2 s), not after the dead leader's lease (30 s).
    assert late < 10, late
    assert await db.fetchval("SELECT worker FROM starts WHERE job_id = $1", job.id) == "other"


async def test_jobs_no_worker_serves_are_reported_by_the_leader_stats_and_burst(
    dsn: str, db: Conn, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    worker = WorkerProcess("w", dsn, tmp_path, SHORT)
    workers.append(worker)
    worker.start()
    await leads(db, "w")
    # A service that enqueues by name, without the App: no worker registers this task.
    async with pgq.Client(dsn) as client:
        await client.enqueue_many([pgq.JobSpec("send_invoice_v1", {}) for _ in range(3)])
        served = await client.enqueue("effect", {"seconds": 0.0})
    await until(lambda: all_completed(db, [served.id]), limit_s=30)
    said = "3 job(s) of task 'send_invoice_v1' wait on queue 'default'"

    async def warned() -> bool:
        return said in worker.output()

    # Due for longer than stale_after (4 s), seen by the leader's next look (every 4 s).
    await until(warned, limit_s=30)
    assert worker.output().count(said) == 1, "warned once, not every round"
    env = {
        **os.environ,
        "PGQ_DSN": dsn,
        "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT / "src")]),
        "FAULT_DSN": dsn,
        "FAULT_WORKER": "b",
    }
    with anyio.fail_after(60):
        stats = await anyio.run_process(
            [sys.executable, "-m", "pgq", "stats", "--json"],
            env={**env, "PGQ_STALE_AFTER": "4"},
            cwd=HERE,
        )
    (default,) = [q for q in json.loads(stats.stdout) if q["queue"] == "default"]
    assert default["unrunnable"] == {"send_invoice_v1": 3}
    assert "no live worker of that queue serves the task" in stats.stderr.decode()
    with anyio.fail_after(90):
        burst = await anyio.run_process(
            [sys.executable, "-m", "pgq", "worker", "fault_app:app", "--burst", "--name", "b"],
            env=env,
            cwd=HERE,
            check=False,
        )
    said_by_burst = burst.stderr.decode()
    assert burst.returncode == 0, said_by_burst
    assert "burst: no runnable job left" in said_by_burst
    assert "burst: 3 job(s) of task 'send_invoice_v1' wait on queue 'default'" in said_by_burst
    left = await db.fetchval("SELECT count(*) FROM pgq_jobs WHERE task = 'send_invoice_v1'")
    assert left == 3, "reported, never discarded"
