"""The liveness protocol against real Postgres, in one process: heartbeats, fencing, the
leader, the rescuer's judgement of any peer, the reaper, health."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg
import pytest

import pgq
from pgq._core.hooks import Hooks
from pgq._db import producers as producers_store
from pgq._db.connections import Target
from pgq._db.producers import Beat
from pgq._worker import recovery
from pgq._worker.leader.rescuer import Rescuer
from pgq._worker.liveness import Heartbeater, ProducerHealth, ProducerIdentity
from pgq._worker.recovery import RescueReports, Strays
from pgq.errors import ConfigError
from pgq.settings import WorkerSettings
from tests.tests_support import until

if TYPE_CHECKING:
    from tests.tests_support import Conn

pytestmark = pytest.mark.anyio

FAST: dict[str, Any] = {
    "heartbeat_interval": 0.2,
    "heartbeat_timeout": 0.1,
    "max_heartbeat_failures": 2,
    "stale_after": 1.0,
    "rescue_interval": 0.1,
    "rescue_grace": 0.5,
    "leader_ttl": 1.5,
    "reap_after": 3.0,
    "schedule_interval": 0.05,
    "poll_interval": 0.1,
}


def make_app(record: list[int] | None = None) -> pgq.App:
    app = pgq.App()

    @app.task(backoff=pgq.Backoff(base_s=0.01, jitter=0))
    async def work(ctx: pgq.JobContext, n: int) -> int:
        if record is not None:
            record.append(n)
        return n

    return app


async def fake_producer(conn: Conn, *, silent_s: float, name: str = "ghost:1") -> uuid.UUID:
    """A producer row of another worker, last heard of ``silent_s`` seconds ago."""
    pid = uuid.uuid4()
    await conn.execute(
        "INSERT INTO pgq_producers (id, worker_id, worker_name, queue, concurrency, heartbeat_at)"
        " VALUES ($1, $2, $3, 'default', 5, now() - make_interval(secs => $4))",
        pid,
        uuid.uuid4(),
        name,
        silent_s,
    )
    return pid


async def keep_alive(dsn: str, producer: uuid.UUID) -> None:
    """Heartbeat ``producer`` as a live peer would, until cancelled."""
    conn = await asyncpg.connect(dsn)
    try:
        while True:
            await conn.execute(
                "UPDATE pgq_producers SET heartbeat_at = now() WHERE id = $1", producer
            )
            await anyio.sleep(0.1)
    finally:
        with anyio.CancelScope(shield=True):
            await conn.close()


async def running_job(
    conn: Conn,
    producer: uuid.UUID,
    *,
    attempt: int = 1,
    max_attempts: int = 5,
    started_s_ago: float = 0,
    deadline_s: float | None = None,
    n: int = 1,
) -> int:
    """A job claimed by ``producer``: running, as a claim leaves it."""
    return int(
        await conn.fetchval(
            "INSERT INTO pgq_jobs (task, args, state, attempt, max_attempts, producer_id,"
            " attempted_at, deadline_at) VALUES ('work', jsonb_build_object('n', $6::int), 'running',"
            " $2, $3, $1, now() - make_interval(secs => $4),"
            " now() + make_interval(secs => $5)) RETURNING id",
            producer,
            attempt,
            max_attempts,
            started_s_ago,
            deadline_s,
            n,
        )
    )


async def test_the_fencing_invariant_is_checked_at_start_up() -> None:
    with pytest.raises(
        ConfigError,
        match=r"heartbeat_interval \(5s\) x max_heartbeat_failures \(3\) \+ heartbeat_timeout \(2s\) = 17s, which must be less than stale_after \(10s\)",
    ):
        pgq.Worker(
            make_app(),
            "postgresql://x/y",
            heartbeat_interval=5,
            heartbeat_timeout=2,
            max_heartbeat_failures=3,
            stale_after=10,
        )
    with pytest.raises(ConfigError, match="reap_after"):
        pgq.Worker(make_app(), "postgresql://x/y", reap_after=10)


async def test_heartbeats_advance_on_the_database_clock(dsn: str, conn: Conn) -> None:
    async with pgq.Worker(make_app(), dsn, **FAST) as worker:
        producer_id = uuid.UUID(worker.stats()["producers"][0]["producer_id"])
        first = await conn.fetchval(
            "SELECT heartbeat_at FROM pgq_producers WHERE id = $1", producer_id
        )

        async def moved() -> bool:
            now = await conn.fetchval(
                "SELECT heartbeat_at FROM pgq_producers WHERE id = $1", producer_id
            )
            return bool(now > first)

        await until(moved)
        stats = worker.stats()
        (p,) = stats["producers"]
        assert p["healthy"] and p["consecutive_failures"] == 0
        assert p["last_heartbeat_ok_at"] is not None
        assert stats["leader"] is True
    assert await conn.fetchval("SELECT count(*) FROM pgq_producers") == 0, "clean stop removes rows"


async def test_exactly_one_leader_and_a_resignation_hands_over_at_once(
    dsn: str, conn: Conn
) -> None:
    # A long TTL: only the NOTIFY on resignation can make the hand-over quick.
    settings = {**FAST, "leader_ttl": 30.0}
    app = make_app()
    async with (
        pgq.Worker(app, dsn, name="w1", **settings) as w1,
        pgq.Worker(app, dsn, name="w2", **settings) as w2,
    ):
        workers = [w1, w2]
        async with pgq.Worker(app, dsn, name="w3", **settings) as w3:
            workers.append(w3)
            leaders = [w for w in workers if w.stats()["leader"]]
            assert len(leaders) == 1
            assert await conn.fetchval("SELECT worker_name FROM pgq_leader") == leaders[0].name
        if w3 is leaders[0]:
            pass
        else:
            leaders[0].stop()
        started = anyio.current_time()

        async def new_leader() -> bool:
            live = [w for w in (w1, w2) if not w._stop_requested.is_set()]
            return any(w.stats()["leader"] for w in live)

        await until(new_leader, limit_s=10)
        assert anyio.current_time() - started < 10 < settings["leader_ttl"]


async def test_rescue_judges_a_stale_peer_in_sql(dsn: str, conn: Conn, client: pgq.Client) -> None:
    ghost = await fake_producer(conn, silent_s=3600, name="ghost-host:4242")
    job_id = await running_job(conn, ghost)
    async with pgq.Worker(make_app(), dsn, **FAST):
        await until(lambda: _state_is(client, job_id, pgq.JobState.COMPLETED))
    job = await client.get_job(job_id)
    assert job is not None and job.attempt == 2
    (error,) = job.errors
    assert error["kind"] == "rescued" and error["attempt"] == 1
    assert "producer stale" in error["message"] and "ghost-host:4242" in error["message"]
    assert error["worker_name"] == "ghost-host:4242" and error["producer_id"] == str(ghost)
    assert error["silent_s"] >= 3600 and error["reason"] == "producer stale"
    assert job.metadata["pgq_rescues"] == 1


async def test_rescue_of_a_job_whose_producer_row_is_gone(
    dsn: str, conn: Conn, client: pgq.Client
) -> None:
    gone = uuid.uuid4()
    old = await running_job(conn, gone, started_s_ago=60)
    fresh = await running_job(conn, gone, started_s_ago=0, n=2)
    async with pgq.Worker(make_app(), dsn, **FAST):
        await until(lambda: _state_is(client, old, pgq.JobState.COMPLETED))
        # A job claimed moments ago may belong to a producer re-registering right now.
        job = await client.get_job(fresh)
        assert job is not None
        if job.state is pgq.JobState.RUNNING:
            assert job.producer_id == gone
    rescued = await client.get_job(old)
    assert rescued is not None and "producer row missing" in rescued.errors[0]["message"]


async def test_a_poison_job_is_discarded_not_looped(
    dsn: str, conn: Conn, client: pgq.Client
) -> None:
    ghost = await fake_producer(conn, silent_s=3600)
    job_id = await running_job(conn, ghost, attempt=3, max_attempts=3)
    async with pgq.Worker(make_app(), dsn, **FAST):
        await until(lambda: _state_is(client, job_id, pgq.JobState.DISCARDED))
    job = await client.get_job(job_id)
    assert job is not None and job.finalized_at is not None and job.errors[0]["kind"] == "rescued"


async def test_a_hung_job_under_a_live_producer_is_rescued(
    dsn: str, conn: Conn, client: pgq.Client
) -> None:
    alive = await fake_producer(conn, silent_s=0)
    hung = await running_job(conn, alive, deadline_s=-60)
    within = await running_job(conn, alive, deadline_s=3600, n=2)
    async with anyio.create_task_group() as peer:
        peer.start_soon(keep_alive, dsn, alive)
        async with pgq.Worker(make_app(), dsn, **FAST) as worker:
            await until(lambda: _state_is(client, hung, pgq.JobState.COMPLETED))
            await until(_more_rounds(worker, _rescue_rounds(worker) + 3))
        peer.cancel_scope.cancel()
    job = await client.get_job(hung)
    assert job is not None and "overran its timeout" in job.errors[0]["message"]
    untouched = await client.get_job(within)
    assert untouched is not None and untouched.state is pgq.JobState.RUNNING
    assert untouched.errors == []


async def test_a_fresh_peer_is_never_rescued(dsn: str, conn: Conn, client: pgq.Client) -> None:
    alive = await fake_producer(conn, silent_s=0)
    job_id = await running_job(conn, alive, started_s_ago=3600)
    async with anyio.create_task_group() as peer:
        peer.start_soon(keep_alive, dsn, alive)
        async with pgq.Worker(make_app(), dsn, **FAST) as worker:
            # Long enough for the peer to be judged stale several times over, were it silent.
            await until(_more_rounds(worker, 25))
            assert worker.stats()["rescued"] == 0
        peer.cancel_scope.cancel()
    job = await client.get_job(job_id)
    assert job is not None and job.state is pgq.JobState.RUNNING


async def leader_rescuer(dsn: str, **settings: Any) -> AsyncIterator[Rescuer]:
    """A rescuer holding the lease, outside any worker: its rounds are driven by hand."""
    leader_id = uuid.uuid4()
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    assert pool is not None
    try:
        await pool.execute(
            "INSERT INTO pgq_leader (name, leader_id, worker_name, expires_at)"
            " VALUES ('default', $1, 'test', now() + interval '1 hour')",
            leader_id,
        )
        sick: list[str] = settings.pop("sick", [])
        yield Rescuer(
            pool,
            WorkerSettings.resolve({**FAST, **settings}),
            leader_id,
            sick_queues=lambda: sick,
        )
    finally:
        await pool.close()


async def test_rescue_passes_over_a_job_being_completed(
    dsn: str, conn: Conn, client: pgq.Client
) -> None:
    ghost = await fake_producer(conn, silent_s=3600)
    job_id = await running_job(conn, ghost)
    async with contextlib.asynccontextmanager(leader_rescuer)(dsn) as rescuer:
        async with conn.transaction():
            # The owner is writing its outcome right now: the row is locked ...
            await conn.execute("SELECT 1 FROM pgq_jobs WHERE id = $1 FOR UPDATE", job_id)
            assert (await rescuer.run_once()).rescued == 0
            await conn.execute(
                "UPDATE pgq_jobs SET state = 'completed', finalized_at = now() WHERE id = $1",
                job_id,
            )
        # ... and once it committed, the job is no longer running: nothing to rescue.
        assert (await rescuer.run_once()).rescued == 0
    job = await client.get_job(job_id)
    assert job is not None and job.state is pgq.JobState.COMPLETED and job.errors == []


async def test_a_deposed_leader_rescues_nothing(dsn: str, conn: Conn, client: pgq.Client) -> None:
    ghost = await fake_producer(conn, silent_s=3600)
    job_id = await running_job(conn, ghost)
    async with contextlib.asynccontextmanager(leader_rescuer)(dsn) as rescuer:
        await conn.execute("UPDATE pgq_leader SET leader_id = $1", uuid.uuid4())
        assert (await rescuer.run_once()).rescued == 0
    job = await client.get_job(job_id)
    assert job is not None and job.state is pgq.JobState.RUNNING


async def test_a_late_outcome_is_rejected_counted_and_logged(
    dsn: str, conn: Conn, client: pgq.Client, caplog: pytest.LogCaptureFixture
) -> None:
    app = pgq.App()
    started, release = anyio.Event(), anyio.Event()

    @app.task
    async def slow(ctx: pgq.JobContext) -> str:
        started.set()
        await release.wait()
        return "late"

    job = await client.enqueue("slow")
    caplog.set_level(logging.WARNING, "pgq.worker")
    async with pgq.Worker(app, dsn, **{**FAST, "rescue_interval": 3600}) as worker:
        with anyio.fail_after(10):
            await started.wait()
        # What a rescue does to the job of a producer peers judged dead:
        await conn.execute(
            "UPDATE pgq_jobs SET state = 'retryable', scheduled_at = now() + interval '1 hour'"
            " WHERE id = $1",
            job.id,
        )
        release.set()

        async def rejected() -> bool:
            return bool(worker.stats()["producers"][0]["rejected_outcomes"] == 1)

        await until(rejected)
    stored = await client.get_job(job.id)
    assert stored is not None and stored.state is pgq.JobState.RETRYABLE and stored.result is None
    assert any(f"job {job.id} attempt 1 rejected" in r.getMessage() for r in caplog.records)


def held_app() -> tuple[pgq.App, anyio.Event, anyio.Event, list[int]]:
    """An App whose task ``slow`` records its job's id and sets ``started``, then holds
    until ``release`` is set: (app, started, release, the ids run)."""
    app = pgq.App()
    started, release = anyio.Event(), anyio.Event()
    runs: list[int] = []

    @app.task
    async def slow(ctx: pgq.JobContext) -> str:
        runs.append(ctx.id)
        started.set()
        await release.wait()
        return "done"

    return app, started, release, runs


async def delete_producer_row(conn: Conn, worker: pgq.Worker) -> tuple[uuid.UUID, uuid.UUID]:
    """Delete the worker's producer row, as an operator might, and wait for the producer to
    re-register: (old id, new id)."""
    old = uuid.UUID(worker.stats()["producers"][0]["producer_id"])
    done = worker.stats()["reregistrations"] + 1
    await conn.execute("DELETE FROM pgq_producers WHERE id = $1", old)

    async def reregistered() -> bool:
        return bool(worker.stats()["reregistrations"] == done)

    await until(reregistered)
    new = uuid.UUID(worker.stats()["producers"][0]["producer_id"])
    assert new != old
    return old, new


async def test_a_deleted_producer_row_reregisters_and_loses_nothing(
    dsn: str, conn: Conn, client: pgq.Client
) -> None:
    app, started, release, runs = held_app()

    job = await client.enqueue("slow")
    async with pgq.Worker(app, dsn, **FAST) as worker:
        with anyio.fail_after(10):
            await started.wait()
        _, new = await delete_producer_row(conn, worker)
        assert await conn.fetchval("SELECT producer_id FROM pgq_jobs WHERE id = $1", job.id) == new
        release.set()
        await until(lambda: _state_is(client, job.id, pgq.JobState.COMPLETED))
    assert runs == [job.id]


#: Beats as fast, judges peers later: on a busy machine a re-registration that comes late
#: must not let the rescuer take a job the test expects adopted.
PATIENT: dict[str, Any] = {**FAST, "stale_after": 5.0, "reap_after": 10.0}

#: A rescuer that takes a producer for stale only after 30 s, and heartbeats driven by hand
#: with a bound a busy machine meets: what these tests judge is a missing row, not timing.
SLOW_TO_JUDGE: dict[str, Any] = {"stale_after": 30.0, "reap_after": 60.0}
BY_HAND: dict[str, Any] = {
    **PATIENT,
    "heartbeat_interval": 2.0,
    "heartbeat_timeout": 2.0,
    **SLOW_TO_JUDGE,
}


async def test_re_registration_adopts_jobs_running_under_the_old_id_it_has_not_read_yet(
    dsn: str, conn: Conn, client: pgq.Client
) -> None:
    """A job claimed under the old id whose rows the worker has not read yet (its claim
    committed, the reply on its way) is adopted too: left behind, it would be rescued as
    the job of a missing producer while it runs."""
    app, started, release, _ = held_app()

    async with pgq.Worker(app, dsn, **PATIENT) as worker:
        old = uuid.UUID(worker.stats()["producers"][0]["producer_id"])
        known = (await client.enqueue("slow")).id
        with anyio.fail_after(10):
            await started.wait()
        unread = await running_job(conn, old)
        _, new = await delete_producer_row(conn, worker)
        owners = await conn.fetch(
            "SELECT id, producer_id, state::text FROM pgq_jobs WHERE id = ANY($1::bigint[])",
            [known, unread],
        )
        assert {(r["id"], r["producer_id"], r["state"]) for r in owners} == {
            (known, new, "running"),
            (unread, new, "running"),
        }
        release.set()
        await until(lambda: _state_is(client, known, pgq.JobState.COMPLETED))


LOCK_WAITS = """
SELECT count(*) FROM pg_stat_activity
WHERE wait_event_type = 'Lock' AND datname = current_database()
  AND query LIKE '%FROM pgq_claim_limited(%'
"""


async def test_a_claim_in_flight_across_a_re_registration_keeps_its_jobs(
    dsn: str, conn: Conn, client: pgq.Client
) -> None:
    """A claim sent under the old id that commits after the re-registration: its job is
    adopted at the next heartbeat, runs once, and is never rescued."""
    app, started, release, runs = held_app()

    # A limited queue's claim locks the queue's row first: holding that lock holds the claim
    # in flight, sent under the producer's id of the moment.
    await client.set_queue_limits("default", concurrency=5)
    other = await asyncpg.connect(dsn)
    try:
        async with pgq.Worker(app, dsn, **PATIENT) as worker:
            async with conn.transaction():
                await conn.execute("SELECT 1 FROM pgq_queues WHERE name = 'default' FOR UPDATE")
                job = await client.enqueue("slow")

                async def claim_waits() -> bool:
                    return bool(await other.fetchval(LOCK_WAITS) == 1)

                await until(claim_waits)
                _, new = await delete_producer_row(other, worker)
            # The lock is released: the claim commits under the old id, after the
            # re-registration's adoption.
            with anyio.fail_after(10):
                await started.wait()

            async def adopted() -> bool:
                owner = await other.fetchval(
                    "SELECT producer_id FROM pgq_jobs WHERE id = $1", job.id
                )
                return bool(owner == new)

            await until(adopted)
            assert worker.stats()["producers"][0]["producer_id"] == str(new)
            release.set()
            await until(lambda: _state_is(client, job.id, pgq.JobState.COMPLETED))
    finally:
        await other.close()
    stored = await client.get_job(job.id)
    assert stored is not None and stored.attempt == 1 and stored.errors == []
    assert runs == [job.id]


async def test_re_registration_passes_over_a_locked_job_and_adopts_it_later(
    dsn: str, conn: Conn, client: pgq.Client
) -> None:
    """A job whose row its task holds locked (as a task settling its own job in a
    transaction does) does not hold the re-registration up: the others are adopted at
    once, that one at a later heartbeat, and each runs once."""
    app = pgq.App()
    locked, unlock, finish = anyio.Event(), anyio.Event(), anyio.Event()
    runs: list[int] = []

    @app.task
    async def holds_its_row(ctx: pgq.JobContext) -> None:
        runs.append(ctx.id)
        own = await asyncpg.connect(dsn)
        try:
            async with own.transaction():
                await own.execute("SELECT 1 FROM pgq_jobs WHERE id = $1 FOR UPDATE", ctx.id)
                locked.set()
                await unlock.wait()
        finally:
            await own.close()
        await finish.wait()

    @app.task
    async def plain(ctx: pgq.JobContext) -> None:
        runs.append(ctx.id)
        await finish.wait()

    holder = await client.enqueue("holds_its_row")
    other = await client.enqueue("plain")
    async with pgq.Worker(app, dsn, **PATIENT) as worker:
        with anyio.fail_after(10):
            await locked.wait()

        async def both_run() -> bool:
            return len(runs) == 2

        await until(both_run)
        old, new = await delete_producer_row(conn, worker)
        owners = "SELECT id, producer_id FROM pgq_jobs WHERE state = 'running' ORDER BY id"
        assert [tuple(r) for r in await conn.fetch(owners)] == [(holder.id, old), (other.id, new)]
        # The old id has its row again while a job is left under it, and it is beaten.
        beaten = "SELECT heartbeat_at FROM pgq_producers WHERE id = $1"
        first = await conn.fetchval(beaten, old)
        assert first is not None

        async def beaten_again() -> bool:
            return bool(await conn.fetchval(beaten, old) > first)

        await until(beaten_again)
        unlock.set()

        async def adopted() -> bool:
            return [tuple(r) for r in await conn.fetch(owners)] == [
                (holder.id, new),
                (other.id, new),
            ]

        await until(adopted)

        async def old_row_gone() -> bool:
            return await conn.fetchval(beaten, old) is None

        await until(old_row_gone)
        finish.set()
        await until(lambda: _state_is(client, holder.id, pgq.JobState.COMPLETED))
        await until(lambda: _state_is(client, other.id, pgq.JobState.COMPLETED))
        assert worker.stats()["reregistrations"] == 1
    assert sorted(runs) == [holder.id, other.id]
    attempts = await conn.fetch("SELECT attempt, errors::text FROM pgq_jobs")
    assert [(r["attempt"], r["errors"]) for r in attempts] == [(1, "[]"), (1, "[]")]


async def test_a_re_registration_tried_again_under_its_id_reports_what_the_first_try_moved(
    conn: Conn, client: pgq.Client
) -> None:
    """A try that timed out on the worker's side may have committed: tried again under the
    same new id, the statement reports the jobs that try moved as adopted (the worker would
    otherwise count them lost), and the row it inserted is reused."""
    old = await fake_producer(conn, silent_s=0)
    jobs = [await running_job(conn, old, n=i) for i in range(2)]
    await conn.execute("DELETE FROM pgq_producers WHERE id = $1", old)
    beat = Beat(uuid.uuid4(), 2, True, 2, 0, 0, 0)
    args: dict[str, Any] = {
        "worker_id": uuid.uuid4(),
        "worker_name": "w",
        "queue": "default",
        "concurrency": 5,
        "bounds": producers_store.Bounds(1.0, 5.0, 10.0, ("t",)),
    }
    first = await producers_store.reregister(client.pool, [old], beat, **args)
    again = await producers_store.reregister(client.pool, [old], beat, **args)
    assert sorted(first.adopted) == sorted(again.adopted) == sorted(jobs)
    assert first.passed_over == again.passed_over == []
    assert await conn.fetchval("SELECT count(*) FROM pgq_producers WHERE id = $1", beat.id) == 1


async def test_a_job_passed_over_at_re_registration_is_no_missing_producers_job(
    dsn: str, conn: Conn, client: pgq.Client
) -> None:
    """A job whose row was locked when its producer re-registered stays under the old id
    until a later heartbeat moves it. Its old producer gets its row back meanwhile (beaten
    with the new one's), so the rescuer does not take it as the job of a missing producer
    when the lock goes and the job is still running, however long ago it started."""
    old = await fake_producer(conn, silent_s=0)
    held = await running_job(conn, old, started_s_ago=3600)
    free = await running_job(conn, old, started_s_ago=3600, n=2)
    await conn.execute("DELETE FROM pgq_producers WHERE id = $1", old)
    beat = Beat(uuid.uuid4(), 2, True, 2, 0, 0, 0)
    bounds = producers_store.Bounds(1.0, 5.0, 10.0, ("t",))
    locker = await asyncpg.connect(dsn)
    try:
        lock = locker.transaction()
        await lock.start()
        # A task settling its own job, say, whose transaction then rolls back.
        await locker.execute("SELECT 1 FROM pgq_jobs WHERE id = $1 FOR UPDATE", held)
        moved = await producers_store.reregister(
            client.pool, [old], beat, worker_id=uuid.uuid4(), worker_name="w", queue="default",
            concurrency=5, bounds=bounds,
        )  # fmt: skip
        assert moved.adopted == [free] and moved.passed_over == [held]
        await lock.rollback()
    finally:
        await locker.close()
    # The leader's round comes before the producer's next heartbeat: the job started an
    # hour ago, under an id whose row is there again.
    async with contextlib.asynccontextmanager(leader_rescuer)(dsn, **SLOW_TO_JUDGE) as rescuer:
        assert (await rescuer.run_once()).rescued == 0
    owner = "SELECT state::text, producer_id FROM pgq_jobs WHERE id = $1"
    assert tuple(await conn.fetchrow(owner, held) or ()) == ("running", old)
    row = await conn.fetchrow(
        "SELECT concurrency, heartbeat_at > now() - interval '1 minute' AS fresh"
        " FROM pgq_producers WHERE id = $1",
        old,
    )
    assert row is not None and row["concurrency"] == 0 and row["fresh"]
    # The next heartbeat moves it, and the old id is let go with its row.
    assert (await producers_store.adopt(client.pool, beat.id, [old])).adopted == [held]
    await producers_store.release(client.pool, [old])
    assert tuple(await conn.fetchrow(owner, held) or ()) == ("running", beat.id)
    assert await conn.fetchval("SELECT count(*) FROM pgq_producers WHERE id = $1", old) == 0


class BeatingStandIn:
    """What the heartbeat reads of a producer: its ids, health and running jobs (the
    database is real; the worker around it is left out)."""

    def __init__(self, producer_id: uuid.UUID, jobs: list[int]) -> None:
        self.identity = ProducerIdentity(producer_id)
        self.queue = "default"
        self.concurrency = 5
        self.health = ProducerHealth("default", 10.0)
        self.jobs = jobs
        self.lost_jobs: set[int] = set()

    def beat(self) -> Beat:
        return Beat(self.identity.id, len(self.jobs), True, 0, 0, 0, 0)

    def running_ids(self) -> list[int]:
        return list(self.jobs)

    def lost(self, job_ids: set[int]) -> None:
        self.lost_jobs |= job_ids


@contextlib.asynccontextmanager
async def heartbeater(dsn: str, producer: BeatingStandIn) -> AsyncIterator[Heartbeater]:
    """A heartbeat of ``producer``'s, each beat driven by the test."""
    settings = WorkerSettings.resolve(BY_HAND)
    bounds = producers_store.Bounds(
        settings.fencing_bound, settings.stale_after, settings.rescue_grace, ("t",)
    )
    beats = Heartbeater(
        Target(dsn), [producer], settings, worker_id=uuid.uuid4(), worker_name="w", bounds=bounds
    )
    try:
        yield beats
    finally:
        if beats._conn is not None:
            await beats._conn.close()


def reregistration_commits_then_gives_up(monkeypatch: pytest.MonkeyPatch) -> list[uuid.UUID]:
    """Make the first re-registration commit and then time out on the worker's side (as
    the heartbeat's bound would cut a reply that came too late); returns the new id of
    each try, as it commits (not before: a test that reads the rows once a try is listed
    must find them written)."""
    real, tries = producers_store.reregister, []

    async def commits_then_gives_up(*args: Any, **kwargs: Any) -> producers_store.Adoption:
        moved = await real(*args, **kwargs)
        tries.append(args[2].id)
        if len(tries) == 1:
            raise TimeoutError("the reply came too late")
        return moved

    monkeypatch.setattr(producers_store, "reregister", commits_then_gives_up)
    return tries


async def test_a_re_registration_that_committed_after_its_heartbeat_gave_up_is_tried_again(
    dsn: str, conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The try that timed out committed: the old id has its row back and the jobs are under
    the new id. The next heartbeat must still finish the re-registration (under that id),
    or the jobs would sit under an id nobody beats, and be rescued while they run."""
    old = await fake_producer(conn, silent_s=0, name="w")
    job = await running_job(conn, old)
    producer = BeatingStandIn(old, [job])
    await conn.execute("DELETE FROM pgq_producers WHERE id = $1", old)
    tries = reregistration_commits_then_gives_up(monkeypatch)
    async with heartbeater(dsn, producer) as beats:
        assert await beats.beat() is False
        owner = "SELECT producer_id FROM pgq_jobs WHERE id = $1"
        assert await conn.fetchval(owner, job) == tries[0]  # moved by the try that gave up
        assert await beats.beat() is True
    assert tries == [tries[0], tries[0]]  # tried again, under the same new id
    assert producer.identity.id == tries[0] and producer.lost_jobs == set()
    assert await conn.fetchval(owner, job) == producer.identity.id
    assert await conn.fetchval("SELECT count(*) FROM pgq_producers WHERE id = $1", old) == 0


async def test_a_worker_that_stops_with_a_re_registration_pending_leaves_nothing_behind(
    dsn: str, conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped between a re-registration that committed unseen and its next try: the new
    id's row is deleted with the others, and a stray under it is handed back, as under the
    producer's own id."""
    # Five seconds between beats: the stop comes well before the next try.
    slow_beats = {**BY_HAND, "heartbeat_interval": 5.0}
    async with pgq.Worker(make_app(), dsn, **slow_beats) as worker:
        old = uuid.UUID(worker.stats()["producers"][0]["producer_id"])
        ((stray, _),) = await claimed_jobs(conn, old, 1)  # a claim whose reply was lost
        tries = reregistration_commits_then_gives_up(monkeypatch)
        await conn.execute("DELETE FROM pgq_producers WHERE id = $1", old)

        async def tried() -> bool:
            return len(tries) == 1

        await until(tried)
        owner = "SELECT producer_id FROM pgq_jobs WHERE id = $1"
        assert await conn.fetchval(owner, stray) == tries[0]
    assert len(tries) == 1, "the next try came before the stop"
    assert await conn.fetch("SELECT id FROM pgq_producers") == []
    row = await conn.fetchrow("SELECT state::text, attempt FROM pgq_jobs WHERE id = $1", stray)
    assert row is not None and tuple(row) == ("available", 0)


async def test_a_job_handed_back_a_thousand_times_is_still_handed_back(
    conn: Conn, client: pgq.Client
) -> None:
    """Its backoff is capped before it is computed (2.0 ** 1024 overflows)."""
    producer = StandInProducer(await fake_producer(conn, silent_s=0))
    ((job, _),) = await claimed_jobs(conn, producer.id, 1)
    await conn.execute(
        "UPDATE pgq_jobs SET max_attempts = 5, errors = (SELECT jsonb_agg(jsonb_build_object("
        "'attempt', 1, 'kind', 'lost_reply', 'message', 'lost')) FROM generate_series(1, 1100))"
        " WHERE id = $1",
        job,
    )
    strays = Strays(client.pool, [producer], set, interval_s=60)
    assert await strays.sweep() == [job]
    row = await conn.fetchrow(
        "SELECT state::text, attempt, scheduled_at - now() AS wait FROM pgq_jobs WHERE id = $1",
        job,
    )
    assert row is not None and (row["state"], row["attempt"]) == ("retryable", 1)
    assert 3000 < row["wait"].total_seconds() <= 3600


async def test_a_second_re_registration_keeps_its_former_ids_rows_and_their_jobs(
    dsn: str, conn: Conn
) -> None:
    """A re-registration while a former id is still held (a job under it locked) gives that
    id its row back too, and counts its job as kept, not lost."""
    first = await fake_producer(conn, silent_s=0, name="w")
    held = await running_job(conn, first, started_s_ago=3600)
    producer = BeatingStandIn(first, [held])
    locker = await asyncpg.connect(dsn)
    try:
        async with heartbeater(dsn, producer) as beats:
            lock = locker.transaction()
            await lock.start()
            await locker.execute("SELECT 1 FROM pgq_jobs WHERE id = $1 FOR UPDATE", held)
            await conn.execute("DELETE FROM pgq_producers WHERE id = $1", first)
            assert await beats.beat() is True
            second = producer.identity.id
            assert producer.identity.former_ids == [first]
            # An operator deletes every row of the worker's, the former id's too.
            await conn.execute("DELETE FROM pgq_producers WHERE worker_name = 'w'")
            assert await beats.beat() is True
            assert producer.identity.former_ids == [first, second] and producer.lost_jobs == set()
            rows = "SELECT id FROM pgq_producers WHERE id = ANY($1::uuid[])"
            assert {r["id"] for r in await conn.fetch(rows, [first, second])} == {first, second}
            await lock.rollback()  # the lock goes, the job still runs, under the first id
            rescuing = contextlib.asynccontextmanager(leader_rescuer)(dsn, **SLOW_TO_JUDGE)
            async with rescuing as rescuer:
                assert (await rescuer.run_once()).rescued == 0
            assert await beats.beat() is True  # adopts it, and lets both ids go
            owner = "SELECT producer_id FROM pgq_jobs WHERE id = $1"
            assert await conn.fetchval(owner, held) == producer.identity.id
            assert producer.identity.former_ids == []
            assert await conn.fetch(rows, [first, second]) == []
    finally:
        await locker.close()


async def test_a_worker_that_stops_hands_back_the_jobs_of_its_lost_claims(
    conn: Conn, client: pgq.Client, dsn: str
) -> None:
    """A job a claim left running under the worker's producer, which the worker never read
    (the claim's reply was lost), is handed back as the worker stops: not left to a rescue
    after the worker's rows are gone."""
    async with pgq.Worker(make_app(), dsn, **PATIENT) as worker:
        producer = uuid.UUID(worker.stats()["producers"][0]["producer_id"])
        await claimed_jobs(conn, producer, 1)
    assert worker.stats()["strays_handed_back"] == 1
    row = await conn.fetchrow("SELECT state::text, attempt, errors::text FROM pgq_jobs")
    assert row is not None and (row["state"], row["attempt"]) == ("available", 0)
    assert [e["kind"] for e in json.loads(row["errors"])] == ["lost_reply"]


async def test_a_worker_whose_job_rescued_hook_never_returns_still_stops(
    conn: Conn, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The hand-back at stop is reported to a hook that hangs: the worker waits for it
    REPORTS_FLUSH_S at most, says the event was not delivered, and stops; the hook is
    cancelled."""
    app = make_app()
    heard: list[tuple[int, str]] = []

    @app.on("job_rescued")
    async def hang(event: pgq.JobEvent) -> None:
        heard.append((event.job.id, "entered"))
        try:
            await anyio.Event().wait()  # never set
        except BaseException:
            heard.append((event.job.id, "cancelled"))
            raise

    with caplog.at_level(logging.WARNING, logger="pgq.worker"), anyio.fail_after(60):
        async with pgq.Worker(app, dsn, **PATIENT) as worker:
            producer = uuid.UUID(worker.stats()["producers"][0]["producer_id"])
            ((job, _),) = await claimed_jobs(conn, producer, 1)
    assert heard == [(job, "entered"), (job, "cancelled")]
    state = await conn.fetchval("SELECT state::text FROM pgq_jobs WHERE id = $1", job)
    assert state == "available"
    (warning,) = [r.getMessage() for r in caplog.records if "job_rescued" in r.getMessage()]
    assert warning.startswith("1 job_rescued events were not delivered"), warning


async def test_a_worker_told_to_stop_at_once_waits_no_more_for_a_job_rescued_hook(
    conn: Conn, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopping, the worker waits for a hook that hangs (here for an hour); told then to
    stop at once, it waits no more."""
    monkeypatch.setattr(recovery, "REPORTS_FLUSH_S", 3600.0)
    app = make_app()
    entered = anyio.Event()
    heard: list[str] = []

    @app.on("job_rescued")
    async def hang(event: pgq.JobEvent) -> None:
        entered.set()
        try:
            await anyio.Event().wait()  # never set
        except BaseException:
            heard.append("cancelled")
            raise

    worker = pgq.Worker(app, dsn, **PATIENT)
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            await worker.started.wait()
            producer = uuid.UUID(worker.stats()["producers"][0]["producer_id"])
            await claimed_jobs(conn, producer, 1)
            worker.stop()
            await entered.wait()  # the sweep handed it back; the stop waits for the hook
            assert worker.stats()["rescue_events_waiting"] == 1
            worker.stop(now=True)
    assert heard == ["cancelled"]


async def test_a_stray_with_a_cancel_request_ends_cancelled_and_is_reported_so(
    conn: Conn, client: pgq.Client
) -> None:
    producer = StandInProducer(await fake_producer(conn, silent_s=0))
    ((job, _),) = await claimed_jobs(conn, producer.id, 1)
    await conn.execute("UPDATE pgq_jobs SET cancel_requested_at = now() WHERE id = $1", job)
    hooks = Hooks()
    events: list[pgq.JobEvent] = []
    hooks.handlers["job_rescued"].append(events.append)
    reports = RescueReports(hooks)
    strays = Strays(client.pool, [producer], set, interval_s=60, reports=reports)
    async with anyio.create_task_group() as tg:
        tg.start_soon(reports.run)
        assert await strays.sweep() == [job]
        with anyio.fail_after(30):
            await reports.flush()
        tg.cancel_scope.cancel()
    state = await conn.fetchval("SELECT state::text FROM pgq_jobs WHERE id = $1", job)
    assert state == "cancelled"
    assert [(e.job.id, e.state, e.reason) for e in events] == [
        (job, pgq.JobState.CANCELLED, "claim reply lost")
    ]


FENCED_EFFECT = """
INSERT INTO effects (job_id) SELECT $1
WHERE EXISTS (SELECT 1 FROM pgq_jobs WHERE id = $1 AND attempt_token = $2 AND state = 'running')
"""


async def test_the_fencing_token_stays_valid_across_re_registration(
    dsn: str, conn: Conn, client: pgq.Client
) -> None:
    """The recipe of docs/liveness.md, after the producer row was deleted mid-job: the task's
    token still fences its side effect, exactly as long as its outcome would be accepted."""
    await conn.execute("CREATE TABLE effects (job_id bigint)")
    app = pgq.App()
    started, release = anyio.Event(), anyio.Event()
    tokens: list[uuid.UUID | None] = []

    @app.task
    async def charge(ctx: pgq.JobContext) -> None:
        tokens.append(ctx.token)
        started.set()
        await release.wait()
        effect = await asyncpg.connect(dsn)
        try:
            await effect.execute(FENCED_EFFECT, ctx.id, ctx.token)
        finally:
            await effect.close()

    job = await client.enqueue("charge")
    async with pgq.Worker(app, dsn, **FAST) as worker:
        with anyio.fail_after(10):
            await started.wait()
        old = uuid.UUID(worker.stats()["producers"][0]["producer_id"])
        await conn.execute("DELETE FROM pgq_producers WHERE id = $1", old)

        async def adopted() -> bool:
            owner = await conn.fetchval("SELECT producer_id FROM pgq_jobs WHERE id = $1", job.id)
            return bool(owner is not None and owner != old)

        await until(adopted)
        release.set()
        await until(lambda: _state_is(client, job.id, pgq.JobState.COMPLETED))
    assert tokens[0] is not None
    assert await conn.fetchval("SELECT count(*) FROM effects WHERE job_id = $1", job.id) == 1


async def test_the_reaper_deletes_long_silent_producers_after_rescue(
    dsn: str, conn: Conn, client: pgq.Client
) -> None:
    idle_ghost = await fake_producer(conn, silent_s=3600, name="idle-ghost")
    busy_ghost = await fake_producer(conn, silent_s=3600, name="busy-ghost")
    job_id = await running_job(conn, busy_ghost)
    recent = await fake_producer(conn, silent_s=1.5, name="recently-silent")
    async with pgq.Worker(make_app(), dsn, **FAST) as worker:

        async def reaped() -> bool:
            return bool(
                await conn.fetchval(
                    "SELECT count(*) = 0 FROM pgq_producers WHERE id = ANY($1)",
                    [idle_ghost, busy_ghost],
                )
            )

        await until(reaped)
        assert worker.stats()["reaped"] >= 2
        assert await conn.fetchval("SELECT count(*) FROM pgq_producers WHERE id = $1", recent) == 1
    job = await client.get_job(job_id)
    assert job is not None and job.errors[0]["kind"] == "rescued"


@contextlib.asynccontextmanager
async def heartbeats_blocked(dsn: str, worker_name: str) -> AsyncIterator[None]:
    """Every heartbeat of the worker blocks (its producer rows are locked) until the block
    ends: a real database fault, as a worker whose heartbeats fail sees it. Nothing else
    waits on those rows: claims, outcomes and the rescuer's reads go on."""
    blocker = await asyncpg.connect(dsn)
    try:
        async with blocker.transaction():
            await blocker.execute(
                "SELECT 1 FROM pgq_producers WHERE worker_name = $1 FOR UPDATE", worker_name
            )
            yield
    finally:
        await blocker.close()


async def test_a_leader_with_unhealthy_producers_skips_the_rescue(
    dsn: str, conn: Conn, client: pgq.Client, caplog: pytest.LogCaptureFixture
) -> None:
    ghost = await fake_producer(conn, silent_s=3600)
    caplog.set_level(logging.INFO, "pgq.rescuer")
    settings = {**FAST, "rescue_interval": 0.1, "reap_after": 3600.0}
    async with pgq.Worker(make_app(), dsn, name="fenced", **settings) as worker:
        await until(lambda: _beats(worker, 1))
        async with heartbeats_blocked(dsn, "fenced"):

            async def fenced() -> bool:
                return not worker.stats()["producers"][0]["healthy"]

            await until(fenced)
            # Only now is there a job to judge: a stale peer's, rescuable at once.
            job_id = await running_job(conn, ghost)
            await until(_more_rounds(worker, _rescue_rounds(worker) + 5))
            job = await client.get_job(job_id)
            assert job is not None and job.state is pgq.JobState.RUNNING, "not judged"
            assert worker.stats()["leader"]
        await until(lambda: _state_is(client, job_id, pgq.JobState.COMPLETED))
    messages = [r.getMessage() for r in caplog.records]
    skips = [m for m in messages if "skips rescue rounds" in m]
    assert skips == ["leader skips rescue rounds: its own producers (default) are unhealthy"]
    assert "leader resumes rescue rounds" in messages
    rescued = await client.get_job(job_id)
    assert rescued is not None and rescued.errors[0]["kind"] == "rescued"


async def test_healthz_reports_200_then_503_with_a_reason(dsn: str) -> None:
    import httpx

    settings = {**FAST, "heartbeat_interval": 0.3, "heartbeat_timeout": 0.2}
    async with pgq.Worker(make_app(), dsn, name="probed", health_port=0, **settings) as worker:
        url = f"http://127.0.0.1:{worker.health_port}/healthz"
        async with httpx.AsyncClient() as http:
            ok = await http.get(url)
            assert ok.status_code == 200 and ok.json()["status"] in ("ok", "starting")
            async with heartbeats_blocked(dsn, "probed"):

                async def unhealthy() -> bool:
                    return (await http.get(url)).status_code == 503

                await until(unhealthy)
                bad = (await http.get(url)).json()
                assert bad["status"] == "unhealthy"
                assert re.search(r"is unhealthy after \d+ failed heartbeats", bad["reason"])

            async def healthy_again() -> bool:
                return (await http.get(url)).status_code == 200

            await until(healthy_again)
            assert (await http.get(url.replace("healthz", "nope"))).status_code == 404


async def test_a_health_check_that_raises_answers_500_and_the_worker_runs_on(
    dsn: str, client: pgq.Client
) -> None:
    import httpx

    class Broken(pgq.Worker):
        def health(self) -> tuple[bool, dict[str, Any]]:
            raise RuntimeError("the health check broke")

    ran: list[int] = []
    async with Broken(make_app(ran), dsn, health_port=0, **FAST) as worker:
        async with httpx.AsyncClient() as http:
            url = f"http://127.0.0.1:{worker.health_port}/healthz"
            for _ in range(3):
                answer = await http.get(url)
                assert answer.status_code == 500
                assert answer.json()["error"] == "health check failed: the health check broke"
        await client.enqueue("work", {"n": 1})

        async def ran_it() -> bool:
            return ran == [1]

        await until(ran_it)  # the worker survived its probes


async def test_pgq_producers_lists_status_and_leader(dsn: str, conn: Conn, python: str) -> None:
    await fake_producer(conn, silent_s=3600, name="ghost:9")
    async with pgq.Worker(make_app(), dsn, name="live:1", **{**FAST, "rescue_interval": 3600}):
        table = await anyio.run_process(
            [python, "-m", "pgq", "producers", "--dsn", dsn, "--stale-after", "1"]
        )
        # A bad variable of a setting `pgq producers` does not use cannot break it.
        raw = await anyio.run_process(
            [python, "-m", "pgq", "producers", "--dsn", dsn, "--json", "--stale-after", "1"],
            env={**os.environ, "PGQ_HEARTBEAT_INTERVAL": "soon"},
        )
    text = table.stdout.decode()
    assert "leader: live:1" in text and "live:1 *" in text
    rows = {line.split()[0]: line.split() for line in text.splitlines()[2:-1]}
    assert rows["live:1"][3] == "healthy" and rows["ghost:9"][2] == "stale"
    data = json.loads(raw.stdout)
    assert data["leader"]["worker_name"] == "live:1"
    by_name = {p["worker_name"]: p for p in data["producers"]}
    assert by_name["live:1"]["leader"] and by_name["live:1"]["status"] == "healthy"
    assert by_name["ghost:9"]["status"] == "stale" and by_name["ghost:9"]["heartbeat_age_s"] >= 3600


async def _state_is(client: pgq.Client, job_id: int, state: pgq.JobState) -> bool:
    job = await client.get_job(job_id)
    return job is not None and job.state is state


def _rescue_rounds(worker: pgq.Worker) -> int:
    return int(worker.stats()["leader_services"]["rescuer"]["runs"])


def _more_rounds(worker: pgq.Worker, n: int) -> Any:
    async def check() -> bool:
        return _rescue_rounds(worker) >= n

    return check


async def _beats(worker: pgq.Worker, n: int) -> bool:
    return bool(worker.stats()["heartbeats"] >= n)


class StandInProducer:
    """What the check of strays reads of a producer: its id, the attempts it knows of, and
    its claims (the database is real; only the worker around it is left out)."""

    def __init__(self, producer_id: uuid.UUID) -> None:
        self.id = producer_id
        self.former_ids: list[uuid.UUID] = []
        self.queue = "default"
        self.claims_sent = 0
        self.fetching = False
        self.running: set[tuple[int, uuid.UUID | None]] = set()

    def knows(self, job_id: int, token: uuid.UUID | None) -> bool:
        return (job_id, token) in self.running

    def ids(self) -> list[uuid.UUID]:
        return [self.id, *self.former_ids]


async def claimed_jobs(conn: Conn, producer: uuid.UUID, n: int) -> list[tuple[int, uuid.UUID]]:
    """``n`` jobs running under ``producer`` as a claim leaves them, each with its token:
    (id, token) in id order."""
    ids = [await running_job(conn, producer, n=i) for i in range(n)]
    rows = await conn.fetch(
        "UPDATE pgq_jobs SET attempt_token = gen_random_uuid() WHERE id = ANY($1::bigint[])"
        " RETURNING id, attempt_token",
        ids,
    )
    return sorted((r["id"], r["attempt_token"]) for r in rows)


async def known_ending_and_stray(
    conn: Conn, client: pgq.Client
) -> tuple[Strays, StandInProducer, list[tuple[int, uuid.UUID]]]:
    """A check of strays over a stand-in producer with three claimed jobs: one it runs, one
    whose outcome is pending, one it never read. Returns (check, producer, their attempts)."""
    producer = StandInProducer(await fake_producer(conn, silent_s=0))
    known, ending, stray = await claimed_jobs(conn, producer.id, 3)
    producer.running.add(known)
    return (
        Strays(client.pool, [producer], lambda: {ending}, interval_s=60),
        producer,
        [known, ending, stray],
    )


async def test_strays_are_handed_back_only_when_seen_twice_unknown_with_no_claim_in_flight(
    conn: Conn, client: pgq.Client
) -> None:
    strays, producer, (known, ending, stray) = await known_ending_and_stray(conn, client)

    # A claim in flight from one check to the next: its reply may still bring the job.
    producer.claims_sent, producer.fetching = 1, True
    assert await strays.check() == []
    assert await strays.check() == []
    # That claim ended and its reply never brought the job: it goes back.
    producer.fetching = False
    assert await strays.check() == [stray[0]]
    rows = await conn.fetch(
        "SELECT id, state::text, attempt, errors::text FROM pgq_jobs ORDER BY id"
    )
    assert [(r["id"], r["state"], r["attempt"]) for r in rows] == [
        (known[0], "running", 1),
        (ending[0], "running", 1),
        (stray[0], "available", 0),
    ]
    (entry,) = json.loads(rows[2]["errors"])
    assert entry["kind"] == "lost_reply" and entry["attempt"] == 1
    assert "reply to the claim" in entry["message"]
    assert strays.handed_back == 1
    assert await strays.check() == []


async def test_a_claim_in_flight_at_one_check_only_does_not_hold_a_stray_back(
    conn: Conn, client: pgq.Client
) -> None:
    producer = StandInProducer(await fake_producer(conn, silent_s=0))
    first, second = await claimed_jobs(conn, producer.id, 2)
    strays = Strays(client.pool, [producer], set, interval_s=60)
    # A different claim in flight at each check: neither was in flight throughout.
    producer.claims_sent, producer.fetching = 1, True
    assert await strays.check() == []
    producer.claims_sent = 2
    assert await strays.check() == [first[0], second[0]]


async def test_a_stray_seen_once_is_left_alone_and_each_attempt_is_its_own(
    conn: Conn, client: pgq.Client
) -> None:
    producer = StandInProducer(await fake_producer(conn, silent_s=0))
    ((job, _),) = await claimed_jobs(conn, producer.id, 1)
    # The producer still runs an older attempt of the job (one rescued, not yet ended):
    # that does not make the newer attempt known.
    producer.running.add((job, uuid.uuid4()))
    strays = Strays(client.pool, [producer], set, interval_s=60)
    assert await strays.check() == []
    # Another attempt of the same job (a new token) is not the one seen before.
    await conn.execute("UPDATE pgq_jobs SET attempt_token = gen_random_uuid() WHERE id = $1", job)
    assert await strays.check() == []
    assert await strays.check() == [job]
    assert await conn.fetchval("SELECT state::text FROM pgq_jobs WHERE id = $1", job) == "available"


async def test_a_sweep_hands_back_every_unknown_attempt_at_once(
    conn: Conn, client: pgq.Client
) -> None:
    strays, _, (_, _, stray) = await known_ending_and_stray(conn, client)
    assert await strays.sweep() == [stray[0]]


async def test_a_job_rescued_hook_that_never_returns_holds_up_no_check_of_strays(
    conn: Conn, client: pgq.Client, caplog: pytest.LogCaptureFixture
) -> None:
    """The hooks hear of hand-backs from a task of their own: while a hook hangs on the
    first, the checks go on and hand back the next stray; at a stop, the wait for the
    hooks ends after its bound and says what was not delivered."""
    producer = StandInProducer(await fake_producer(conn, silent_s=0))
    ((first, _),) = await claimed_jobs(conn, producer.id, 1)
    entered = anyio.Event()
    heard: list[int] = []

    async def hang(event: pgq.JobEvent) -> None:
        heard.append(event.job.id)
        entered.set()
        await anyio.Event().wait()  # never set

    hooks = Hooks()
    hooks.handlers["job_rescued"].append(hang)
    reports = RescueReports(hooks)
    strays = Strays(client.pool, [producer], set, interval_s=0.1, reports=reports)
    async with anyio.create_task_group() as tg:
        tg.start_soon(reports.run)
        tg.start_soon(strays.run)
        with anyio.fail_after(30):
            await entered.wait()
        ((second, _),) = await claimed_jobs(conn, producer.id, 1)

        async def handed_back() -> bool:
            return strays.handed_back == 2  # counted as its write returns, then reported

        await until(handed_back, limit_s=30)
        state = "SELECT state::text FROM pgq_jobs WHERE id = $1"
        assert await conn.fetchval(state, second) == "available"
        assert heard == [first]  # still in the first event's hook
        assert reports.waiting == 2
        with anyio.fail_after(30), caplog.at_level(logging.WARNING, logger="pgq.worker"):
            await reports.flush(0.1)
        assert reports.waiting == 2 and reports.delivered == 0
        assert any(
            r.getMessage().startswith("2 job_rescued events were not delivered")
            for r in caplog.records
        )
        tg.cancel_scope.cancel()
    assert strays.handed_back == 2


async def test_a_job_whose_claims_never_reach_a_worker_ends_discarded_not_looped(
    conn: Conn, client: pgq.Client
) -> None:
    """The first hand-backs of a job do not count its attempt (a lost reply is no fault of
    the job's); a job handed back that often already, whose claims seem never to reach a
    worker, has each further attempt counted, and is discarded when none is left."""
    producer = StandInProducer(await fake_producer(conn, silent_s=0))
    hooks = Hooks()
    events: list[pgq.JobEvent] = []
    hooks.handlers["job_rescued"].append(events.append)
    reports = RescueReports(hooks)
    strays = Strays(client.pool, [producer], set, interval_s=60, reports=reports)
    ((job, _),) = await claimed_jobs(conn, producer.id, 1)
    await conn.execute("UPDATE pgq_jobs SET max_attempts = 2 WHERE id = $1", job)
    reclaim = (
        "UPDATE pgq_jobs SET state = 'running', attempt = attempt + 1, producer_id = $2,"
        " scheduled_at = now(),"
        " attempt_token = gen_random_uuid() WHERE id = $1"
    )
    read = "SELECT state::text, attempt, scheduled_at > now() AS later FROM pgq_jobs WHERE id = $1"
    seen = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(reports.run)
        for _ in range(4):
            assert await strays.sweep() == [job]
            seen.append(tuple(await conn.fetchrow(read, job) or ()))
            if seen[-1][0] != "discarded":
                await conn.execute(reclaim, job, producer.id)  # claimed again: lost too
        with anyio.fail_after(30):
            await reports.flush()
        tg.cancel_scope.cancel()
    assert seen == [
        ("available", 0, False),  # free
        ("available", 0, False),  # free
        ("retryable", 1, True),  # the third counts: attempt 1 of 2, retried after a second
        ("discarded", 2, False),  # the last attempt
    ]
    errors = json.loads(await conn.fetchval("SELECT errors::text FROM pgq_jobs WHERE id = $1", job))
    assert [e["kind"] for e in errors] == ["lost_reply"] * 4
    assert "3 times, so this attempt counts" in errors[2]["message"]
    assert errors[3]["message"].endswith("and it was the last")
    # Each hand-back reported to the job_rescued hooks: the attempt taken back, what it made
    # of the job.
    assert [(e.job.id, e.job.attempt, e.state, e.reason) for e in events] == [
        (job, 1, pgq.JobState.AVAILABLE, "claim reply lost"),
        (job, 1, pgq.JobState.AVAILABLE, "claim reply lost"),
        (job, 1, pgq.JobState.RETRYABLE, "claim reply lost"),
        (job, 2, pgq.JobState.DISCARDED, "claim reply lost"),
    ]
