"""A worker cut off from Postgres, or held up past its fencing bound, fences itself: it
claims nothing until it beats again, and starts none of the attempts a peer may have rescued
meanwhile."""

from __future__ import annotations

import signal
from datetime import datetime
from pathlib import Path

import anyio
import anyio.abc
import anyio.lowlevel
import asyncpg
import pytest

import pgq
from tests.faults.checks import (
    CLAIM_WAITS,
    HOLD_CLAIMS,
    all_completed,
    assert_exactly_once,
    enqueue,
    health,
    running_under,
)
from tests.faults.proxy import Proxy
from tests.faults.workers import (
    SHORT,
    WorkerProcess,
    free_port,
    upstream,
    via_proxy,
    wait_registered,
)
from tests.tests_support import until

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.timeout(180)]


async def first_attempts_rescued(db: asyncpg.Connection[asyncpg.Record], ids: list[int]) -> bool:
    """Whether every job of ``ids`` has its first attempt rescued."""
    n = await db.fetchval(
        "SELECT count(*) FROM pgq_jobs WHERE id = ANY($1)"
        ' AND errors @> \'[{"kind": "rescued", "attempt": 1}]\'',
        ids,
    )
    return bool(n == len(ids))


async def stop_until_rescued(
    db: asyncpg.Connection[asyncpg.Record],
    victim: WorkerProcess,
    lead: WorkerProcess,
    ids: list[int],
) -> datetime:
    """Start ``lead``, SIGSTOP ``victim`` until every job of ``ids`` has its first attempt
    rescued, then SIGCONT it; returns when it was stopped (the database's clock)."""
    lead.start()
    await wait_registered(db, lead.name)
    assert victim.proc is not None
    victim.proc.send_signal(signal.SIGSTOP)
    stopped_at: datetime = await db.fetchval("SELECT clock_timestamp()")
    try:
        await until(lambda: first_attempts_rescued(db, ids), limit_s=60)
    finally:
        victim.proc.send_signal(signal.SIGCONT)
    return stopped_at


async def rescued_attempts_started(
    db: asyncpg.Connection[asyncpg.Record], since: datetime
) -> list[tuple[int, int]]:
    """Attempts 1 the victim started after ``since``: rescued while it was stopped. (Attempt
    2 may well run on the woken worker: it claims the retries as any worker does.)"""
    rows = await db.fetch(
        "SELECT job_id, attempt FROM starts WHERE worker = 'victim' AND attempt = 1 AND at > $1",
        since,
    )
    return [(r["job_id"], r["attempt"]) for r in rows]


async def assert_each_once_and_no_rescued_attempt_started(
    db: asyncpg.Connection[asyncpg.Record], ids: list[int], stopped_at: datetime
) -> None:
    """Every job of ``ids`` completes, each once, and the victim stopped at ``stopped_at``
    started none of the attempts rescued from it meanwhile."""
    await until(lambda: all_completed(db, ids), limit_s=60)
    await assert_exactly_once(db, ids)
    assert await rescued_attempts_started(db, stopped_at) == [], "a rescued attempt started"


async def outcomes_refused(worker: WorkerProcess, n: int) -> bool:
    """Whether ``worker`` logged at least ``n`` outcomes the fence refused."""
    return worker.output().count("rejected: the job is no longer running this attempt") >= n


@pytest.mark.parametrize("fault", ["stall", "cut"])
async def test_a_worker_cut_off_from_postgres_fences_itself_and_resumes(
    fault: str,
    dsn: str,
    db: asyncpg.Connection[asyncpg.Record],
    workers: list[WorkerProcess],
    tmp_path: Path,
) -> None:
    proxy = Proxy(*upstream(dsn))
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.run)
        peer = WorkerProcess("peer", dsn, tmp_path, SHORT)
        workers.append(peer)
        peer.start()
        await wait_registered(db, "peer")  # first: the peer leads and judges
        health_port = free_port()
        cut_off = WorkerProcess(
            "cut-off", via_proxy(dsn, port), tmp_path, SHORT, health_port=health_port
        )
        workers.append(cut_off)
        cut_off.start()
        await wait_registered(db, "cut-off")
        ids = await enqueue(dsn, 10, 2.5)

        async def busy() -> bool:
            return await running_under(db, "cut-off") >= 1

        await until(busy, limit_s=30)
        held = [
            r[0]
            for r in await db.fetch(
                "SELECT j.id FROM pgq_jobs j JOIN pgq_producers p ON p.id = j.producer_id"
                " WHERE j.state = 'running' AND p.worker_name = 'cut-off'"
            )
        ]
        faulted_at = anyio.current_time()
        proxy.stall() if fault == "stall" else proxy.cut()

        async def fenced() -> bool:
            status, body = await anyio.to_thread.run_sync(health, health_port)
            return status == 503 and body.get("status") == "unhealthy"

        await until(fenced, limit_s=SHORT["stale_after"])
        fenced_after = anyio.current_time() - faulted_at
        assert fenced_after < SHORT["stale_after"], "fenced before peers may judge it stale"

        # Its jobs are rescued by the peer, only after stale_after.
        await until(lambda: all_completed(db, ids), limit_s=60)
        rescue_times = await db.fetch(
            "SELECT (errors -> 0 ->> 'silent_s')::float8 FROM pgq_jobs WHERE id = ANY($1)", held
        )
        assert all(r[0] >= SHORT["stale_after"] for r in rescue_times)

        proxy.heal()

        async def rejected_late_outcomes() -> bool:
            status, body = await anyio.to_thread.run_sync(health, health_port)
            producers = body.get("producers") or []
            assert isinstance(producers, list)
            return status == 200 and sum(p["rejected_outcomes"] for p in producers) >= 1

        await until(rejected_late_outcomes, limit_s=30)
        await assert_exactly_once(db, ids)

        # Healed, it claims again: the peer stops, the cut-off worker runs the new jobs.
        assert peer.stop() == 0
        more = await enqueue(dsn, 3, 0.1)
        await until(lambda: all_completed(db, more), limit_s=30)
        await assert_exactly_once(db, more)
        ran = await db.fetch("SELECT DISTINCT worker FROM effects WHERE job_id = ANY($1)", more)
        assert {r[0] for r in ran} == {"cut-off"}
        # Stopped while its proxy still passes traffic (in a thread: the proxy runs on this
        # loop), not once the proxy is gone, when a stop waits out its flush and pool
        # timeouts (about 15 s), which this test does not check.
        await anyio.to_thread.run_sync(cut_off.stop)
        tg.cancel_scope.cancel()


async def test_a_worker_stopped_past_stale_after_starts_none_of_the_attempts_rescued_meanwhile(
    dsn: str, db: asyncpg.Connection[asyncpg.Record], workers: list[WorkerProcess], tmp_path: Path
) -> None:
    """SIGSTOP of a worker running 2 jobs with 4 more claimed ahead, until another worker
    (the leader by then) has rescued all 6; then SIGCONT. The stopped worker, finding itself
    silent past its fencing bound, hands the 4 held jobs back (fenced out, since rescued)
    instead of starting attempts that run elsewhere already; every job completes once."""
    victim = WorkerProcess(
        "victim", dsn, tmp_path, SHORT, concurrency=2, extra_args=("--claim-ahead", "4")
    )
    lead = WorkerProcess("lead", dsn, tmp_path, SHORT, concurrency=8)
    workers += [victim, lead]
    victim.start()
    await wait_registered(db, "victim")
    ids = await enqueue(dsn, 6, 4.0)

    async def all_held() -> bool:
        return await running_under(db, "victim") == 6

    await until(all_held, limit_s=30)
    stopped_at = await stop_until_rescued(db, victim, lead, ids)

    # The 2 attempts it was running when stopped, and the 4 it held: each outcome it sends
    # back (a result, or a hand-back) is refused by the fence.
    await until(lambda: outcomes_refused(victim, 6), limit_s=60)
    await assert_each_once_and_no_rescued_attempt_started(db, ids, stopped_at)
    assert "passed without a heartbeat" in victim.output() or "no heartbeat for" in (
        victim.output()
    )


async def test_a_claim_whose_reply_comes_after_a_long_stop_starts_nothing_rescued_meanwhile(
    dsn: str, db: asyncpg.Connection[asyncpg.Record], workers: list[WorkerProcess], tmp_path: Path
) -> None:
    """The worker's claim of 2 jobs (enqueued and committed before it began) is held in
    the server by a trigger; the worker is stopped (SIGSTOP); the claim is let go and
    commits, and its 2 jobs, running under the stopped worker, are rescued by the leader.
    On SIGCONT the claim's reply arrives after a silence past the fencing bound: its jobs
    are handed back, not started as the rescued attempt 1; each job completes once."""
    await db.execute(HOLD_CLAIMS)
    lead = WorkerProcess("lead", dsn, tmp_path, SHORT, extra_args=("--queue", "other"))
    victim = WorkerProcess("victim", dsn, tmp_path, SHORT, concurrency=4)
    workers += [lead, victim]
    victim.start()
    await wait_registered(db, "victim")
    await db.execute("SELECT pg_advisory_lock(4242)")
    try:
        ids = await enqueue(dsn, 2, 1.0)

        async def claim_waits() -> bool:
            return bool(
                await db.fetchval(CLAIM_WAITS + " AND application_name = 'pgq worker victim'")
            )

        await until(claim_waits, limit_s=30)
        assert victim.proc is not None
        victim.proc.send_signal(signal.SIGSTOP)
        await until(lambda: _stopped(victim), limit_s=10)
        stopped_at: datetime = await db.fetchval("SELECT clock_timestamp()")
    finally:
        await db.execute("SELECT pg_advisory_unlock(4242)")
    try:
        # The server runs the claim to its commit while the worker is stopped.
        await until(lambda: _running_under_victim(db, 2), limit_s=30)
        lead.start()
        await until(lambda: first_attempts_rescued(db, ids), limit_s=60)
    finally:
        victim.proc.send_signal(signal.SIGCONT)
    await assert_each_once_and_no_rescued_attempt_started(db, ids, stopped_at)


async def _stopped(worker: WorkerProcess) -> bool:
    """Whether the kernel has stopped ``worker``'s process (state T in /proc)."""
    assert worker.proc is not None
    stat = await anyio.Path(f"/proc/{worker.proc.pid}/stat").read_text()
    return stat.rpartition(")")[2].split()[0] == "T"


async def _running_under_victim(db: asyncpg.Connection[asyncpg.Record], n: int) -> bool:
    return await running_under(db, "victim") == n


async def test_a_job_waiting_for_a_thread_when_its_worker_stops_is_not_started_after(
    dsn: str, db: asyncpg.Connection[asyncpg.Record], workers: list[WorkerProcess], tmp_path: Path
) -> None:
    """Two plain ``def`` jobs, one worker thread: one runs, the other has its slot and
    waits for the thread. SIGSTOP past stale_after, the leader rescues both, SIGCONT: the
    waiting job's body never starts on the stopped worker (the fence is asked again once
    the thread is its), and each job completes once, elsewhere."""
    victim = WorkerProcess(
        "victim", dsn, tmp_path, SHORT, concurrency=2,
        extra_args=("--max-threads", "1", "--claim-ahead", "0"),
    )  # fmt: skip
    lead = WorkerProcess("lead", dsn, tmp_path, SHORT, concurrency=4)
    workers += [victim, lead]
    victim.start()
    await wait_registered(db, "victim")
    async with pgq.Client(dsn) as client:
        jobs = await client.enqueue_many(
            [pgq.JobSpec("thread_effect", {"seconds": 2.0}) for _ in range(2)]
        )
    ids = [j.id for j in jobs]

    async def one_in_the_thread() -> bool:
        started = await db.fetchval("SELECT count(*) FROM starts")
        return await running_under(db, "victim") == 2 and started == 1

    await until(one_in_the_thread, limit_s=30)
    stopped_at = await stop_until_rescued(db, victim, lead, ids)

    await until(lambda: outcomes_refused(victim, 2), limit_s=60)
    await assert_each_once_and_no_rescued_attempt_started(db, ids, stopped_at)
