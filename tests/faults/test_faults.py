"""Real faults against real worker processes and a real Postgres.

Each test checks, on the jobs' recorded side effects, that no job is lost and none
completes twice.
"""

from __future__ import annotations

import contextlib
import json
import signal
import urllib.request
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
import asyncpg
import pytest

import pgq
from pgq import migrate
from pgq._db.connections import Pool, create_pool
from pgq._worker import recovery
from pgq._worker import worker as worker_module
from pgq._worker.recovery import CHECK_ERRORS, RescueReports, Strays, Successor, Unsure
from tests.faults.cluster import Server, lone_server
from tests.faults.proxy import Proxy
from tests.faults.workers import (
    SHORT,
    WorkerProcess,
    free_port,
    upstream,
    via_proxy,
    wait_registered,
)
from tests.integration._worker.test_liveness import (
    StandInProducer,
    claimed_jobs,
    fake_producer,
    running_job,
)
from tests.tests_support import until

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.timeout(180)]


async def enqueue(dsn: str, n: int, seconds: float) -> list[int]:
    async with pgq.Client(dsn) as client:
        jobs = await client.enqueue_many(
            [pgq.JobSpec("effect", {"seconds": seconds}) for _ in range(n)]
        )
    return [j.id for j in jobs]


async def all_completed(conn: asyncpg.Connection[asyncpg.Record], ids: list[int]) -> bool:
    done = await conn.fetchval(
        "SELECT count(*) FROM pgq_jobs WHERE id = ANY($1) AND state = 'completed'", ids
    )
    return bool(done == len(ids))


async def assert_exactly_once(conn: asyncpg.Connection[asyncpg.Record], ids: list[int]) -> None:
    """No job lost, none completed twice: one fenced effect per job, every job completed."""
    rows = await conn.fetch(
        "SELECT j.id, j.state::text, count(e.job_id) AS effects FROM pgq_jobs j"
        " LEFT JOIN effects e ON e.job_id = j.id WHERE j.id = ANY($1) GROUP BY j.id, j.state",
        ids,
    )
    assert len(rows) == len(ids)
    bad = [dict(r) for r in rows if r["state"] != "completed" or r["effects"] != 1]
    assert bad == []


async def running_under(conn: asyncpg.Connection[asyncpg.Record], name: str) -> int:
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM pgq_jobs j JOIN pgq_producers p ON p.id = j.producer_id"
            " WHERE j.state = 'running' AND p.worker_name = $1",
            name,
        )
    )


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


def health(port: int) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


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


# Holds each claim inside the server, past its parse and plan, while the test holds the
# advisory lock: a claim's row update waits for it.
HOLD_CLAIMS = """
CREATE FUNCTION hold_claims() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state = 'available' AND NEW.state = 'running' THEN
        PERFORM pg_advisory_xact_lock_shared(4242);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER hold_claims BEFORE UPDATE ON pgq_jobs
    FOR EACH ROW EXECUTE FUNCTION hold_claims();
"""
CLAIM_WAITS = """
SELECT count(*) FROM pg_stat_activity
WHERE wait_event_type = 'Lock' AND wait_event = 'advisory' AND datname = current_database()
  AND query LIKE '%attempt_token = gen_random_uuid()%'
"""


async def test_the_jobs_of_a_claim_whose_reply_was_lost_are_handed_back_and_run_once(
    dsn: str, db: asyncpg.Connection[asyncpg.Record]
) -> None:
    """The connection breaks after a claim committed and before its reply arrived: its job
    is left running under a producer that is alive, so no peer may rescue it, and the
    worker never starts it. The worker finds it and hands it back; then it runs once."""
    app = pgq.App()
    runs: list[int] = []
    rescued: list[pgq.JobEvent] = []
    app.on("job_rescued")(rescued.append)

    @app.task
    async def note(ctx: pgq.JobContext) -> None:
        runs.append(ctx.id)

    await db.execute(HOLD_CLAIMS)
    settings: dict[str, Any] = {**SHORT, "poll_interval": 0.1}
    proxy = Proxy(*upstream(dsn))
    async with anyio.create_task_group() as tg, pgq.Client(dsn) as client:
        port = await tg.start(proxy.run)
        async with pgq.Worker(app, via_proxy(dsn, port), **settings) as worker:
            await db.execute("SELECT pg_advisory_lock(4242)")
            job = await client.enqueue("note")

            async def claim_waits() -> bool:
                return bool(await db.fetchval(CLAIM_WAITS) == 1)

            await until(claim_waits)
            proxy.cut()  # new connections are refused too: no other claim competes
            await db.execute("SELECT pg_advisory_unlock(4242)")
            # The server runs the claim to its commit; the reply has nowhere to go.

            async def stranded() -> bool:
                row = await db.fetchrow(
                    "SELECT state::text, attempt FROM pgq_jobs WHERE id = $1", job.id
                )
                return row is not None and (row["state"], row["attempt"]) == ("running", 1)

            await until(stranded)
            proxy.heal()
            assert runs == []
            await until(lambda: _completed(client, job.id), limit_s=60)
            assert worker.stats()["strays_handed_back"] == 1
            # Reported as a rescue: what the job became, and why.
            assert [(e.job.id, e.job.task, e.state, e.reason) for e in rescued] == [
                (job.id, "note", pgq.JobState.AVAILABLE, "claim reply lost")
            ]
        tg.cancel_scope.cancel()
    stored = await db.fetchrow("SELECT attempt, errors::text FROM pgq_jobs WHERE id = $1", job.id)
    assert stored is not None and stored["attempt"] == 1
    (entry,) = json.loads(stored["errors"])
    assert entry["kind"] == "lost_reply" and "reply to the claim" in entry["message"]
    assert runs == [job.id]


# Holds the commit of each transaction that takes a job out of 'running' while the test
# holds advisory lock 4343 (a deferred trigger runs at commit, after the statement replied).
HOLD_RESCUE_COMMITS = """
CREATE FUNCTION hold_rescue_commits() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(4343);
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER hold_rescue_commits AFTER UPDATE ON pgq_jobs
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (OLD.state = 'running' AND NEW.state <> 'running')
    EXECUTE FUNCTION hold_rescue_commits();
"""


# Run after HOLD_RESCUE_COMMITS: only the first such commit is held (a sequence's count
# survives the abort of the commit it held).
ONLY_THE_FIRST = """
CREATE SEQUENCE held_commits;
CREATE OR REPLACE FUNCTION hold_rescue_commits() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF nextval('held_commits') = 1 THEN PERFORM pg_advisory_xact_lock_shared(4343); END IF;
    RETURN NULL;
END $$;
"""


async def test_a_rescue_whose_commit_reply_was_lost_is_reported_once_seen_to_have_landed(
    dsn: str, db: asyncpg.Connection[asyncpg.Record]
) -> None:
    """The leader rescues a dead peer's job; its connection breaks while the rescue's
    commit is held up in the server. The leader, reaching the database again, rounds on
    without knowing: the commit is still in progress. Once it lands, the leader's next
    round finds it committed and reports it: one ``job_rescued`` event, one rescue
    counted, no second rescue of the job."""
    app, rescued, job_id = await _a_dead_peers_job_whose_rescue_commits_are_held(db)
    proxy = Proxy(*upstream(dsn))
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.run)
        settings: dict[str, Any] = dict(SHORT)
        async with pgq.Worker(app, via_proxy(dsn, port), **settings) as worker:

            def rounds() -> int:
                return int(worker.stats()["leader_services"]["rescuer"]["runs"])

            assert worker._parts is not None
            unsure = worker._parts.rescuer._unsure
            await _lose_the_held_commits_reply(db, proxy, unsure)
            assert await _rescue_commit_waits(db)  # still held: the leader could not know
            assert rescued == [] and unsure.waiting
            await db.execute("SELECT pg_advisory_unlock(4343)")

            async def reported() -> bool:
                return bool(rescued)

            await until(reported, limit_s=60)
            since = rounds()

            async def two_more_rounds() -> bool:
                return rounds() >= since + 2

            await until(two_more_rounds, limit_s=30)
            assert [(e.job.id, e.reason) for e in rescued] == [(job_id, "producer stale")]
            assert worker.stats()["rescued"] == 1
        tg.cancel_scope.cancel()
    errors = json.loads(await db.fetchval("SELECT errors FROM pgq_jobs WHERE id = $1", job_id))
    assert [e["kind"] for e in errors] == ["rescued"]


async def test_a_rescue_whose_commit_reply_was_lost_is_reported_by_its_leader_deposed_since(
    dsn: str, db: asyncpg.Connection[asyncpg.Record]
) -> None:
    """The same, but another worker takes the lease before the commit lands (a leader cut
    off long enough to lose a reply often loses its lease too). Off the lead, the worker
    runs no rescue round, yet still asks what became of its own, and reports it once."""
    app, rescued, job_id = await _a_dead_peers_job_whose_rescue_commits_are_held(db)
    proxy = Proxy(*upstream(dsn))
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.run)
        settings: dict[str, Any] = dict(SHORT)
        async with pgq.Worker(app, via_proxy(dsn, port), **settings) as worker:
            assert worker._parts is not None
            unsure = worker._parts.rescuer._unsure
            await _lose_the_held_commits_reply(db, proxy, unsure)
            await db.execute(
                "UPDATE pgq_leader SET leader_id = $1, worker_name = 'usurper',"
                " expires_at = now() + interval '1 hour' WHERE name = 'default'",
                uuid.uuid4(),
            )

            async def deposed() -> bool:
                return not worker.stats()["leader"]

            await until(deposed, limit_s=30)
            asked = unsure.in_progress

            async def asked_off_the_lead() -> bool:
                # Twice: a round begun while it led may ask once more, but rounds and
                # questions take turns in one loop, so the second is off the lead.
                return unsure.in_progress >= asked + 2

            await until(asked_off_the_lead, limit_s=30)
            rounds = worker.stats()["leader_services"]["rescuer"]["runs"]
            assert rescued == [] and unsure.waiting
            await db.execute("SELECT pg_advisory_unlock(4343)")

            async def reported() -> bool:
                return bool(rescued)

            await until(reported, limit_s=60)
            assert [(e.job.id, e.reason) for e in rescued] == [(job_id, "producer stale")]
            assert worker.stats()["rescued"] == 1 and not unsure.waiting
            assert worker.stats()["leader_services"]["rescuer"]["runs"] == rounds
        tg.cancel_scope.cancel()


async def test_a_rescue_whose_commit_reply_was_lost_is_reported_as_its_worker_stops(
    dsn: str, db: asyncpg.Connection[asyncpg.Record]
) -> None:
    """The commit lands after the leader's last rescue round: the worker, stopping, asks
    before its last reports go out (rounds run here only when the test wakes them)."""
    app, rescued, job_id = await _a_dead_peers_job_whose_rescue_commits_are_held(db)
    proxy = Proxy(*upstream(dsn))
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.run)
        settings: dict[str, Any] = {**SHORT, "rescue_interval": 3600.0}
        async with pgq.Worker(app, via_proxy(dsn, port), **settings) as worker:
            assert worker._parts is not None and worker.stats()["leader"]
            leader, rescuer = worker._parts.leader, worker._parts.rescuer
            status = leader.status["rescuer"]
            woken = [status.runs]
            leader.wake("rescuer")
            await until(lambda: _rescue_commit_waits(db), limit_s=30)
            proxy.cut()
            proxy.heal()

            async def asked_while_in_progress() -> bool:
                if rescuer._unsure.in_progress >= 1:
                    return True
                if status.runs > woken[-1]:  # one round at a time, none left queued
                    woken.append(status.runs)
                    leader.wake("rescuer")
                return False

            await until(asked_while_in_progress, limit_s=30)
            await db.execute("SELECT pg_advisory_unlock(4343)")

            await until(lambda: _rescue_landed(db, job_id), limit_s=30)
            assert rescued == [] and rescuer._unsure.waiting, "no round has asked since"
        tg.cancel_scope.cancel()
    assert [(e.job.id, e.reason) for e in rescued] == [(job_id, "producer stale")]
    assert rescuer.rescued == 1 and not rescuer._unsure.waiting


@pytest.mark.parametrize("now", [False, True], ids=["graceful", "at once"])
async def test_a_stopping_worker_says_how_many_rescues_it_could_not_settle(
    dsn: str,
    db: asyncpg.Connection[asyncpg.Record],
    caplog: pytest.LogCaptureFixture,
    now: bool,
) -> None:
    """The commit is still held when the worker stops: the rescue cannot be reported, and
    the worker says so. Stopped at once, it does not even ask."""
    app, rescued, job_id = await _a_dead_peers_job_whose_rescue_commits_are_held(db)
    proxy = Proxy(*upstream(dsn))
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.run)
        settings: dict[str, Any] = {**SHORT, "rescue_interval": 3600.0}
        async with pgq.Worker(app, via_proxy(dsn, port), **settings) as worker:
            assert worker._parts is not None and worker.stats()["leader"]
            unsure = worker._parts.rescuer._unsure
            worker._parts.leader.wake("rescuer")
            await until(lambda: _rescue_commit_waits(db), limit_s=30)
            proxy.cut()
            proxy.heal()

            async def unknown() -> bool:
                return bool(unsure.waiting)

            await until(unknown, limit_s=30)
            worker.stop(now=now)
        tg.cancel_scope.cancel()
    said = [r.getMessage() for r in caplog.records if "could not be settled" in r.getMessage()]
    reason = "stopping at once" if now else "still in progress, or no answer, after 5 s"
    assert said == [f"1 job(s) rescued by the leader by a commit whose reply was lost could not"
                    f" be settled ({reason}): those that landed are not reported"]  # fmt: skip
    # Graceful, it asked again and again while the commit was held; at once, not at all.
    assert (unsure.in_progress > 1) if not now else (unsure.in_progress == 0)
    assert rescued == []
    await db.execute("SELECT pg_advisory_unlock(4343)")
    # As the warning said: landed, and not reported.
    await until(lambda: _rescue_landed(db, job_id), limit_s=30)
    assert rescued == []


async def test_a_rescue_the_stop_cuts_short_is_asked_about_until_it_is_settled(
    dsn: str, db: asyncpg.Connection[asyncpg.Record], caplog: pytest.LogCaptureFixture
) -> None:
    """The worker stops while its rescue's commit waits in the server: the stop cancels
    the round, whose outcome is then unknown for a moment (the server has not yet
    aborted the commit it was told to cancel). The stop asks again until it knows: the
    rescue did not land, so nothing is reported, and nothing is left unsettled."""
    app, rescued, job_id = await _a_dead_peers_job_whose_rescue_commits_are_held(db)
    settings: dict[str, Any] = {**SHORT, "rescue_interval": 3600.0}
    async with pgq.Worker(app, dsn, **settings) as worker:
        assert worker._parts is not None and worker.stats()["leader"]
        rescuer = worker._parts.rescuer
        worker._parts.leader.wake("rescuer")
        await until(lambda: _rescue_commit_waits(db), limit_s=30)
    assert not [r for r in caplog.records if "could not be settled" in r.getMessage()]
    assert rescued == [] and rescuer.rescued == 0 and not rescuer.unsure
    assert await db.fetchval("SELECT state FROM pgq_jobs WHERE id = $1", job_id) == "running"
    assert not await _rescue_commit_waits(db)
    await db.execute("SELECT pg_advisory_unlock(4343)")


async def _a_dead_peers_job_whose_rescue_commits_are_held(
    db: asyncpg.Connection[asyncpg.Record],
) -> tuple[pgq.App, list[pgq.JobEvent], int]:
    """An app recording its ``job_rescued`` events, and a running job of a producer silent
    for an hour, whose rescue's commit will wait until the test unlocks 4343."""
    app = pgq.App()
    rescued: list[pgq.JobEvent] = []
    app.on("job_rescued")(rescued.append)

    @app.task
    async def note(ctx: pgq.JobContext) -> None: ...

    dead = await fake_producer(db, silent_s=3600)
    job_id = await running_job(db, dead, started_s_ago=3600)
    await db.execute(HOLD_RESCUE_COMMITS)
    await db.execute("SELECT pg_advisory_lock(4343)")
    return app, rescued, job_id


async def test_a_restarted_workers_takeover_whose_commit_reply_was_lost_is_reported_once(
    dsn: str, db: asyncpg.Connection[asyncpg.Record]
) -> None:
    """The same for a worker restarted under its stable name, taking over its previous
    run's job: the takeover's commit is held up, the connection breaks, the commit lands
    later; the successor reports the job once, as taken over from its previous run."""
    job_id = await _a_previous_runs_job_whose_takeover_commits_are_held(db)
    events: list[pgq.JobEvent] = []
    proxy = Proxy(*upstream(dsn))
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.run)
        pool = await create_pool(via_proxy(dsn, port), min_size=1, max_size=2)
        successor = _successor_of_stable_1(pool, events)
        finished = anyio.Event()

        async def watch() -> None:
            await successor.run()
            finished.set()

        tg.start_soon(watch)
        await _lose_the_held_commits_reply(db, proxy, successor._unsure)
        assert events == [] and await _rescue_commit_waits(db)
        await db.execute("SELECT pg_advisory_unlock(4343)")
        with anyio.fail_after(30):
            await finished.wait()  # nothing left to watch, no outcome left unknown
        await pool.close()
        tg.cancel_scope.cancel()
    assert [(e.job.id, e.reason) for e in events] == [(job_id, "worker restarted")]
    assert successor.rescued == 1


async def test_a_takeover_whose_commit_reply_was_lost_is_reported_when_asked_at_the_stop(
    dsn: str, db: asyncpg.Connection[asyncpg.Record]
) -> None:
    """The same, but the successor's watch ends (its worker stops) before it asked again:
    the question the stopping worker asks reports the takeover once."""
    job_id = await _a_previous_runs_job_whose_takeover_commits_are_held(db)
    events: list[pgq.JobEvent] = []
    proxy = Proxy(*upstream(dsn))
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.run)
        pool = await create_pool(via_proxy(dsn, port), min_size=1, max_size=2)
        successor = _successor_of_stable_1(pool, events)
        async with anyio.create_task_group() as watching:
            watching.start_soon(successor.run)
            await _lose_the_held_commits_reply(db, proxy, successor._unsure)
            watching.cancel_scope.cancel()  # the worker stops: nothing watches any more
        await db.execute("SELECT pg_advisory_unlock(4343)")

        await until(lambda: _rescue_landed(db, job_id), limit_s=30)
        assert events == [] and successor.unsure == 1
        await successor.ask_unsure()
        await pool.close()
        tg.cancel_scope.cancel()
    assert [(e.job.id, e.reason) for e in events] == [(job_id, "worker restarted")]
    assert successor.rescued == 1 and successor.unsure == 0


async def test_a_takeover_whose_commit_reply_was_lost_is_reported_by_its_worker_stopping(
    dsn: str, db: asyncpg.Connection[asyncpg.Record], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker restarted under its stable name takes its previous run's job over; the
    commit's reply is lost, and the commit lands while the successor waits an hour to look
    again: the stopping worker asks, and reports the takeover once."""
    monkeypatch.setattr(recovery, "TAKEOVER_RETRY_S", 3600.0)
    job_id = await _a_previous_runs_job_whose_takeover_commits_are_held(db)
    app = pgq.App()
    rescued: list[pgq.JobEvent] = []
    app.on("job_rescued")(rescued.append)

    @app.task
    async def note(ctx: pgq.JobContext) -> None: ...

    proxy = Proxy(*upstream(dsn))
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.run)
        settings: dict[str, Any] = {**SHORT, "rescue_interval": 3600.0}
        async with pgq.Worker(app, via_proxy(dsn, port), name="stable-1", **settings) as worker:
            assert worker._parts is not None and worker._parts.successor is not None
            successor = worker._parts.successor
            await until(lambda: _rescue_commit_waits(db), limit_s=30)
            proxy.cut()
            proxy.heal()

            async def unknown() -> bool:
                return successor.unsure == 1

            await until(unknown, limit_s=30)
            await db.execute("SELECT pg_advisory_unlock(4343)")

            await until(lambda: _rescue_landed(db, job_id), limit_s=30)
            assert rescued == [] and successor.unsure == 1, "nothing has asked since"
        tg.cancel_scope.cancel()
    assert [(e.job.id, e.reason) for e in rescued] == [(job_id, "worker restarted")]
    assert successor.rescued == 1 and successor.unsure == 0


async def test_a_stray_hand_back_whose_commit_reply_was_lost_is_reported_once_it_landed(
    dsn: str, db: asyncpg.Connection[asyncpg.Record]
) -> None:
    """A worker hands back a stray (a job of a claim whose reply was lost); the connection
    breaks while the hand-back's commit is held up in the server. The worker asks later:
    still in progress, so nothing yet; once the commit has landed, the hand-back is counted
    and reported once, as its error entry (which names it) shows it landed."""
    async with _a_stray_whose_hand_back_lost_its_reply(dsn, db) as (strays, job_id, events):
        assert strays.unsure == 1 and strays.handed_back == 0
        await strays.ask_unsure()
        assert strays._unsure.in_progress == 1 and strays.unsure == 1  # held: cannot know
        await db.execute("SELECT pg_advisory_unlock(4343)")
        await until(lambda: _rescue_landed(db, job_id), limit_s=30)
        assert events == []
        assert await strays.check() == []  # each check asks first; nothing is stray now
        assert await strays.check() == []
    assert [(e.job.id, e.state, e.reason) for e in events] == [
        (job_id, pgq.JobState.AVAILABLE, "claim reply lost")
    ]
    assert strays.handed_back == 1 and strays.unsure == 0
    errors = json.loads(await db.fetchval("SELECT errors FROM pgq_jobs WHERE id = $1", job_id))
    assert [e["kind"] for e in errors] == ["lost_reply"] and errors[0]["rescue"]


async def test_a_stray_hand_back_whose_commit_was_lost_and_aborted_is_not_reported(
    dsn: str, db: asyncpg.Connection[asyncpg.Record]
) -> None:
    """The same, but the held commit never lands (its server process is ended): nothing is
    reported, nothing counted, and the stray, still running under the producer, is found
    and handed back again."""
    async with _a_stray_whose_hand_back_lost_its_reply(dsn, db) as (strays, job_id, events):
        (pid,) = await _held_commits(db)
        assert await db.fetchval("SELECT pg_terminate_backend($1)", pid)

        async def aborted() -> bool:  # the process gone, its transaction has ended
            return not await db.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid
            )

        await until(aborted, limit_s=30)
        await db.execute("SELECT pg_advisory_unlock(4343)")
        await strays.ask_unsure()
        assert strays.unsure == 0 and strays.handed_back == 0 and events == []
        assert await db.fetchval("SELECT state FROM pgq_jobs WHERE id = $1", job_id) == "running"
        assert await strays.sweep() == [job_id]  # still a stray: handed back, this time for good
    assert [(e.job.id, e.reason) for e in events] == [(job_id, "claim reply lost")]
    assert strays.handed_back == 1


async def test_a_stray_hand_back_whose_commit_reply_was_lost_is_reported_as_its_worker_stops(
    dsn: str, db: asyncpg.Connection[asyncpg.Record], caplog: pytest.LogCaptureFixture
) -> None:
    """A stopping worker hands back a stray; the hand-back's commit is held up and its reply
    lost. The stop asks about it before its last reports go out, and once the commit has
    landed reports it: no warning of anything left unsettled."""
    app = pgq.App()
    rescued: list[pgq.JobEvent] = []
    app.on("job_rescued")(rescued.append)

    @app.task
    async def note(ctx: pgq.JobContext) -> None: ...

    await db.execute(HOLD_RESCUE_COMMITS)
    await db.execute("SELECT pg_advisory_lock(4343)")
    proxy = Proxy(*upstream(dsn))
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.run)
        settings: dict[str, Any] = dict(SHORT)
        worker = pgq.Worker(app, via_proxy(dsn, port), **settings)
        stopped, strays, job_id = await _a_running_workers_stray(tg, worker, db)
        worker.stop()  # its sweep hands the stray back
        await _lose_the_held_commits_reply(db, proxy, strays._unsure)
        assert rescued == [] and strays.unsure == 1
        await db.execute("SELECT pg_advisory_unlock(4343)")
        with anyio.fail_after(30):
            await stopped.wait()
        tg.cancel_scope.cancel()
    assert [(e.job.id, e.state, e.reason) for e in rescued] == [
        (job_id, pgq.JobState.AVAILABLE, "claim reply lost")
    ]
    assert strays.handed_back == 1 and strays.unsure == 0
    assert not [r for r in caplog.records if "could not be settled" in r.getMessage()]


async def test_a_stray_hand_back_the_stop_cuts_short_is_settled_and_the_stray_handed_back_once(
    dsn: str,
    db: asyncpg.Connection[asyncpg.Record],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker's check hands a stray back while the commit is held; the worker stops. The
    stop ends the check first (its commit is cut short, its outcome unknown for a moment),
    then its own sweep hands the stray back, and it asks about the cut commit before it
    stops: the hand-back is counted and reported once, nothing is left unsettled."""
    app = pgq.App()
    rescued: list[pgq.JobEvent] = []
    app.on("job_rescued")(rescued.append)

    @app.task
    async def note(ctx: pgq.JobContext) -> None: ...

    # The sweep's bound shorter than the check's (stale_after): were the check not ended
    # first, the sweep would wait for its row lock past its bound and hand nothing back.
    monkeypatch.setattr(worker_module, "SWEEP_S", 2.0)
    await db.execute(HOLD_RESCUE_COMMITS + ONLY_THE_FIRST)
    await db.execute("SELECT pg_advisory_lock(4343)")
    settings: dict[str, Any] = dict(SHORT)
    worker = pgq.Worker(app, dsn, **settings)
    async with anyio.create_task_group() as tg:
        stopped, strays, job_id = await _a_running_workers_stray(tg, worker, db)
        await until(lambda: _rescue_commit_waits(db), limit_s=30)  # a check's hand-back
        (check,) = await _held_commits(db)
        worker.stop()

        async def check_cut_short() -> bool:
            return check not in await _held_commits(db)

        await until(check_cut_short, limit_s=30)
        with anyio.fail_after(30):
            await stopped.wait()
    assert [(e.job.id, e.state, e.reason) for e in rescued] == [
        (job_id, pgq.JobState.AVAILABLE, "claim reply lost")
    ]
    assert strays.handed_back == 1 and strays.unsure == 0
    assert not [r for r in caplog.records if "could not be settled" in r.getMessage()]
    assert await db.fetchval("SELECT state FROM pgq_jobs WHERE id = $1", job_id) == "available"


async def _a_running_workers_stray(
    tg: anyio.abc.TaskGroup, worker: pgq.Worker, db: asyncpg.Connection[asyncpg.Record]
) -> tuple[anyio.Event, Strays, int]:
    """Run ``worker`` in ``tg`` and, once it runs, leave a stray under its producer's id (a
    job claimed as a claim whose reply was lost leaves it). Returns an event set when the
    run has ended, the worker's check for strays, and the stray's job id."""
    stopped = anyio.Event()

    async def run() -> None:
        await worker.run()
        stopped.set()

    tg.start_soon(run)
    await worker.started.wait()
    assert worker._parts is not None
    producer = uuid.UUID(worker.stats()["producers"][0]["producer_id"])
    ((job_id, _),) = await claimed_jobs(db, producer, 1)
    return stopped, worker._parts.strays, job_id


async def _held_commits(db: asyncpg.Connection[asyncpg.Record]) -> list[int]:
    """The server processes whose commit HOLD_RESCUE_COMMITS holds, in the test's database."""
    rows = await db.fetch(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = 4343 AND NOT granted"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    )
    return [r["pid"] for r in rows]


@contextlib.asynccontextmanager
async def _a_stray_whose_hand_back_lost_its_reply(
    dsn: str, db: asyncpg.Connection[asyncpg.Record]
) -> AsyncIterator[tuple[Strays, int, list[pgq.JobEvent]]]:
    """A check of strays (over a stand-in producer, through a proxy, reporting into a list)
    whose sweep hands back a stray while commits are held: the connection breaks under the
    commit, and the sweep fails without knowing whether it landed. Yields the check, the
    job's id and the events; the commit waits until the test unlocks 4343."""
    producer = StandInProducer(await fake_producer(db, silent_s=0))
    ((job_id, _),) = await claimed_jobs(db, producer.id, 1)
    await db.execute(HOLD_RESCUE_COMMITS)
    await db.execute("SELECT pg_advisory_lock(4343)")
    events: list[pgq.JobEvent] = []
    proxy = Proxy(*upstream(dsn))
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.run)
        pool = await create_pool(via_proxy(dsn, port), min_size=1, max_size=2)
        reports = RescueReports(None, inline=[events.append])
        strays = Strays(pool, [producer], set, interval_s=60, reports=reports)
        try:
            async with anyio.create_task_group() as sweeping:

                async def sweep() -> None:
                    with pytest.raises(CHECK_ERRORS):
                        await strays.sweep()

                sweeping.start_soon(sweep)
                await until(lambda: _rescue_commit_waits(db), limit_s=30)
                proxy.cut()
                proxy.heal()
            yield strays, job_id, events
        finally:
            await pool.close()
        tg.cancel_scope.cancel()


def _successor_of_stable_1(pool: Pool, events: list[pgq.JobEvent]) -> Successor:
    """A worker named ``stable-1``'s successor, reporting its takeovers into ``events``."""
    return Successor(
        pool,
        "stable-1",
        list,
        margin_s=0.1,
        after_rescue=lambda: None,
        reports=RescueReports(None, inline=[events.append]),
    )


async def _a_previous_runs_job_whose_takeover_commits_are_held(
    db: asyncpg.Connection[asyncpg.Record],
) -> int:
    """A running job under a producer row of worker ``stable-1`` silent for an hour, whose
    takeover's commit will wait until the test unlocks 4343."""
    dead = uuid.uuid4()
    await db.execute(
        "INSERT INTO pgq_producers (id, worker_id, worker_name, queue, concurrency,"
        " heartbeat_at, fence_after_s) VALUES ($1, $2, 'stable-1', 'default', 5,"
        " now() - interval '1 hour', 1.0)",
        dead,
        uuid.uuid4(),
    )
    job_id = await running_job(db, dead, started_s_ago=3600)
    await db.execute(HOLD_RESCUE_COMMITS)
    await db.execute("SELECT pg_advisory_lock(4343)")
    return job_id


async def _lose_the_held_commits_reply(
    db: asyncpg.Connection[asyncpg.Record], proxy: Proxy, unsure: Unsure[Any]
) -> None:
    """Wait until a commit held by HOLD_RESCUE_COMMITS waits, break the connection under
    it, and wait until its party has asked about it and heard that it is in progress."""
    await until(lambda: _rescue_commit_waits(db), limit_s=30)
    proxy.cut()
    proxy.heal()

    async def asked_while_in_progress() -> bool:
        return unsure.in_progress >= 1

    await until(asked_while_in_progress, limit_s=30)


async def _rescue_landed(db: asyncpg.Connection[asyncpg.Record], job_id: int) -> bool:
    """Whether the held rescue (or takeover) of ``job_id`` has landed (or aborted: then
    the job is running still, and this waits on)."""
    state = await db.fetchval("SELECT state FROM pgq_jobs WHERE id = $1", job_id)
    return bool(state != "running")


async def _rescue_commit_waits(db: asyncpg.Connection[asyncpg.Record]) -> bool:
    """Whether a commit held by HOLD_RESCUE_COMMITS waits, in the test's database."""
    return bool(await _held_commits(db))


async def _completed(client: pgq.Client, job_id: int) -> bool:
    job = await client.get_job(job_id)
    return job is not None and job.state is pgq.JobState.COMPLETED


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


@contextlib.asynccontextmanager
async def pool_via_proxy(dsn: str) -> AsyncIterator[tuple[Proxy, Pool]]:
    """A TCP proxy to the server and a pool of two connections through it, for the tests
    of a client's wait(); the proxy is healed before the pool closes."""
    proxy = Proxy(*upstream(dsn))
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.run)
        pool = await asyncpg.create_pool(via_proxy(dsn, port), min_size=1, max_size=2)
        assert pool is not None
        try:
            yield proxy, pool
        finally:
            proxy.heal()
            with anyio.fail_after(30):
                await pool.close()
        tg.cancel_scope.cancel()


async def both_connections(pool: Pool) -> None:
    """Take both of the pool's connections at once: a place leaked by a wait would make
    this block."""
    with anyio.fail_after(10):
        async with pool.acquire() as a, pool.acquire() as b:
            assert await a.fetchval("SELECT 1") == await b.fetchval("SELECT 1") == 1


async def test_a_wait_whose_connection_is_cut_as_it_begins_to_listen_listens_on_another(
    dsn: str, db: asyncpg.Connection[asyncpg.Record]
) -> None:
    """The connection a waiter takes from its client's pool is cut by the network just as
    its LISTEN leaves (the bytes never reach the server): the wait gives that connection
    back, listens on a new one, and ends when the job does, rather than fail. (CI once
    found the race by ending the LISTEN's server process mid-statement.)"""
    result: list[pgq.Job] = []
    async with pool_via_proxy(dsn) as (proxy, pool), pgq.Client(pool=pool) as client:
        job = await client.enqueue("email", {"to": "a@example.com"})
        proxy.cut_at = b"LISTEN"

        async def waiting() -> None:
            result.append(await client.wait(job.id, timeout=60))

        async def listening() -> bool:
            return bool(
                await db.fetchval(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND query LIKE 'LISTEN%'"
                    " AND state = 'idle'"
                )
            )

        async with anyio.create_task_group() as waits:
            waits.start_soon(waiting)
            with anyio.fail_after(30):
                await proxy.cut_done.wait()
            await until(listening, limit_s=30)
            with anyio.fail_after(30):
                await client.cancel(job.id)
        # The lost connection's place is back in the pool: the listening one and a new one
        # fit in its two.
        with anyio.fail_after(10):
            async with pool.acquire() as spare:
                assert await spare.fetchval("SELECT 1") == 1
    assert result[0].state == pgq.JobState.CANCELLED
    assert proxy.cut_at is None  # the cut happened, once


async def test_a_wait_cancelled_while_it_begins_to_listen_gives_its_connection_back(
    dsn: str,
) -> None:
    """The network stalls the LISTEN of a waiter's connection, and the wait is cancelled
    meanwhile: the connection is ended and its place handed back, so the pool can still
    give both its connections and close (a leaked place would make close() wait forever)."""
    async with pool_via_proxy(dsn) as (proxy, pool), pgq.Client(pool=pool) as client:
        job = await client.enqueue("email", {"to": "a@example.com"})
        proxy.stall_at = b"LISTEN"
        async with anyio.create_task_group() as waits:
            waits.start_soon(client.wait, job.id)
            with anyio.fail_after(30):
                await proxy.stall_done.wait()
            waits.cancel_scope.cancel()
        proxy.heal()
        await both_connections(pool)


async def test_a_client_closed_while_a_wait_begins_to_listen_ends_that_connection(
    dsn: str,
) -> None:
    """The client is closed while a waiter's LISTEN is stalled by the network: close()
    returns without waiting on the network, the connection being set up is ended (its
    place back in the pool), and the wait raises ConfigError rather than listen again.
    (Before, close() found nothing to give back yet, and the connection stayed taken for
    good once the LISTEN went through.)"""
    failures: list[BaseException] = []
    async with pool_via_proxy(dsn) as (proxy, pool):
        client = pgq.Client(pool=pool)
        await client.open()
        job = await client.enqueue("email", {"to": "a@example.com"})
        proxy.stall_at = b"LISTEN"

        async def waiting() -> None:
            try:
                await client.wait(job.id, timeout=60)
            except pgq.ConfigError as exc:
                failures.append(exc)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as waits:
                waits.start_soon(waiting)
                await proxy.stall_done.wait()
                with anyio.fail_after(10):  # the LISTEN is still stalled
                    await client.close()
        proxy.heal()
        await both_connections(pool)
    assert len(failures) == 1
    assert "closed while a wait() was under way" in str(failures[0])


async def test_a_client_whose_listen_connection_stalls_still_closes(
    dsn: str, db: asyncpg.Connection[asyncpg.Record]
) -> None:
    """The network stalls the connection a client listens on for its waits, and the
    client is closed: its UNLISTEN gets no answer, so close() ends the connection after a
    second instead of waiting on the network, and its place is back in the pool."""
    async with pool_via_proxy(dsn) as (proxy, pool):
        client = pgq.Client(pool=pool)
        await client.open()
        job = await client.enqueue("email", {"to": "a@example.com"})
        await client.cancel(job.id)
        with anyio.fail_after(30):
            assert (await client.wait(job.id)).state is pgq.JobState.CANCELLED
        proxy.stall()
        with anyio.fail_after(10):
            await client.close()
        proxy.heal()
        await both_connections(pool)
