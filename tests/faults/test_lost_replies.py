"""Commits whose reply was lost, against real processes and a proxy that drops replies: the
jobs of a claim whose reply never arrived are handed back and run once, and a rescue,
takeover or hand-back whose commit's reply was lost is reported once it is seen to have
landed (by the round after, a deposed leader, or the worker as it stops), never when it did
not."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
import asyncpg
import pytest

import pgq
from pgq._db.connections import Pool, create_pool
from pgq._worker import recovery
from pgq._worker import worker as worker_module
from pgq._worker.recovery import CHECK_ERRORS, RescueReports, Strays, Successor, Unsure
from tests.faults.checks import CLAIM_WAITS, HOLD_CLAIMS
from tests.faults.proxy import Proxy
from tests.faults.workers import (
    SHORT,
    upstream,
    via_proxy,
)
from tests.integration._worker.test_liveness import (
    StandInProducer,
    claimed_jobs,
    fake_producer,
    running_job,
)
from tests.tests_support import until

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.timeout(180)]


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
