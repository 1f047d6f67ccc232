"""The leader's services run and fail on their own: one broken duty never stops the others."""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import TYPE_CHECKING

import anyio
import asyncpg
import pytest

import pgq
from pgq._db.maintenance import Rescued, rescue_predecessor
from pgq._worker import liveness
from pgq._worker.leader import elector as elector_module
from pgq._worker.leader import retention as retention_module
from pgq._worker.leader import services as leader_services
from pgq._worker.leader.elector import Elector
from pgq._worker.leader.retention import Retention
from pgq._worker.leader.services import LATE_S, LeaderServices, Statistics, Throughput
from pgq._worker.recovery import Unsure
from tests.integration._worker.test_liveness import FAST, fake_producer, running_job
from tests.tests_support import until

if TYPE_CHECKING:
    from tests.tests_support import Conn

pytestmark = pytest.mark.anyio


async def test_a_failing_periodic_schedule_stops_neither_promotion_nor_rescue(
    dsn: str, conn: Conn, client: pgq.Client, caplog: pytest.LogCaptureFixture
) -> None:
    app = pgq.App()

    @app.task
    async def work(ctx: pgq.JobContext, n: int) -> int:
        return n

    @app.periodic(every=1)
    async def tick(ctx: pgq.JobContext) -> None: ...

    # Every periodic round now fails in the database, on every leader.
    await conn.execute("DROP TABLE pgq_periodic")
    ghost = await fake_producer(conn, silent_s=3600)
    orphan = await running_job(conn, ghost)
    caplog.set_level(logging.WARNING, "pgq.leader")
    async with pgq.Worker(app, dsn, **FAST) as worker:
        delayed = await client.enqueue("work", {"n": 2}, delay=1.0)
        due = delayed.scheduled_at
        assert due is not None
        await until(lambda: _completed(client, delayed.id, orphan), limit_s=15)
        finished = await client.get_job(delayed.id)
        assert finished is not None and finished.attempted_at is not None
        # Promoted on the promoter's own schedule, not by chance.
        assert (finished.attempted_at - due).total_seconds() < 5

        async def failed_often() -> bool:
            return bool(worker.stats()["leader_services"]["periodic"]["failures"] >= 3)

        await until(failed_often)
        services = worker.stats()["leader_services"]
    assert "pgq_periodic" in services["periodic"]["last_error"]
    assert services["promoter"]["failures"] == 0 and services["promoter"]["runs"] > 0
    assert services["rescuer"]["failures"] == 0
    said = [r for r in caplog.records if "leader service periodic failed" in r.getMessage()]
    assert len(said) == 1, "one distinct error is logged once"
    rescued = await client.get_job(orphan)
    assert rescued is not None and rescued.errors[0]["kind"] == "rescued"


async def test_a_service_that_recovers_says_so_and_logs_a_new_error_again(
    dsn: str, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "pgq.leader")
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    assert pool is not None
    try:
        settings = pgq.WorkerSettings.resolve(FAST)
        elector = Elector(pool, worker_id=uuid.uuid4(), worker_name="test", ttl_s=5)
        services = LeaderServices(elector, [Retention(pool, settings)])
        await conn.execute("ALTER TABLE pgq_jobs RENAME TO pgq_jobs_away")
        try:
            assert await services.run_service("retention") is None
            assert await services.run_service("retention") is None
        finally:
            await conn.execute("ALTER TABLE pgq_jobs_away RENAME TO pgq_jobs")
        assert await services.run_service("retention") == 0
        status = services.status["retention"].snapshot()
    finally:
        await pool.close()
    assert status["failures"] == 2 and status["consecutive_failures"] == 0
    messages = [r.getMessage() for r in caplog.records if "retention" in r.getMessage()]
    assert sum("leader service retention failed" in m for m in messages) == 1
    assert any("recovered after 2 failed rounds" in m for m in messages)


async def test_a_leader_whose_host_slept_past_its_lease_counts_itself_deposed(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lease is timed on the clock that counts a suspended host's sleep, which the
    event loop's clock does not: a jump of that clock alone stands in for the sleep."""
    slept = [0.0]
    monkeypatch.setattr(elector_module, "clock", lambda: liveness.clock() + slept[0])
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
    assert pool is not None
    try:
        elector = Elector(pool, worker_id=uuid.uuid4(), worker_name="sleeper", ttl_s=30)
        assert await elector.attempt(), "the lease was free"
        assert elector.is_leader
        slept[0] = 29.0
        assert elector.is_leader, "still inside the lease"
        slept[0] = 31.0
        assert not elector.is_leader, "the host slept past the lease"
        assert await elector.attempt(), "renewed (nobody took it meanwhile)"
        assert elector.is_leader
    finally:
        await pool.close()


async def test_a_renewal_held_up_by_a_lock_on_the_lease_names_its_cause(
    dsn: str, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    """Another session holds a row lock on pgq_leader: the renewal waits until its limit,
    and the warning says why (a timeout's own text is empty)."""
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
    assert pool is not None
    try:
        elector = Elector(pool, worker_id=uuid.uuid4(), worker_name="locked", ttl_s=1.5)
        assert await elector.attempt(), "the lease was free"
        async with conn.transaction():
            await conn.execute("SELECT 1 FROM pgq_leader FOR UPDATE")
            with caplog.at_level(logging.WARNING, logger="pgq.leader"):
                await elector.attempt()
        assert await elector.attempt(), "renewed once the lock was gone"
    finally:
        await pool.close()
    (warning,) = [r.getMessage() for r in caplog.records if "leader lease" in r.getMessage()]
    assert "could not renew the leader lease (TimeoutError: no reply within 0.5 s;" in warning
    assert "a lock another session holds on pgq_leader" in warning
    assert "()" not in warning


async def test_two_askers_at_once_settle_a_rescue_whose_reply_was_lost_once(
    dsn: str, conn: Conn
) -> None:
    """Two questions at once about a rescue whose commit's reply was lost (a worker's own
    askers take turns, a rescuer shared by more would not): it is settled, and reported,
    by one of them."""
    dead = await fake_producer(conn, silent_s=3600)
    await conn.execute("UPDATE pgq_producers SET fence_after_s = 1 WHERE id = $1", dead)
    job_id = await running_job(conn, dead, started_s_ago=3600)
    pool = await asyncpg.create_pool(dsn, min_size=2, max_size=2)
    assert pool is not None
    try:
        unsure: Unsure[Rescued] = Unsure(logging.getLogger("test"))
        async with pool.acquire() as c:
            rows = await unsure.commit(c, lambda c, _: rescue_predecessor(c, [dead], 0.1))
        assert [r.id for r in rows] == [job_id]
        token = await conn.fetchval(
            "SELECT errors -> -1 ->> 'rescue' FROM pgq_jobs WHERE id = $1", job_id
        )
        unsure._pending[token] = (rows[0].xact, rows)  # as if the commit's reply were lost
        found: list[int] = []

        async def ask() -> None:
            found.extend(r.id for r in await unsure.landed(pool))

        async with anyio.create_task_group() as tg:
            tg.start_soon(ask)
            tg.start_soon(ask)
    finally:
        await pool.close()
    assert found == [job_id] and not unsure.waiting


async def _completed(client: pgq.Client, *ids: int) -> bool:
    for job_id in ids:
        job = await client.get_job(job_id)
        if job is None or job.state is not pgq.JobState.COMPLETED:
            return False
    return True


async def test_a_first_rescue_retries_at_once_whatever_the_attempts_before_it(
    conn: Conn,
) -> None:
    """A job rescued for the first time at its 4th attempt (three failed on their own)
    runs again at once; a job rescued for the 4th time waits 7 s (0, 1, 3, 7 s ...): the
    backoff counts rescues, not attempts. A count in the metadata that pgq did not write
    fails no rescue."""
    from pgq._db import maintenance

    previous = uuid.uuid4()
    await conn.execute(
        "INSERT INTO pgq_producers (id, worker_id, worker_name, queue, concurrency,"
        " heartbeat_at, fence_after_s)"
        " VALUES ($1, $2, 'w', 'default', 5, now() - interval '60 seconds', 0.5)",
        previous,
        uuid.uuid4(),
    )
    first = await running_job(conn, previous, attempt=4, max_attempts=10)
    fourth = await running_job(conn, previous, attempt=4, max_attempts=10)
    await conn.execute(
        "UPDATE pgq_jobs SET metadata = '{\"pgq_rescues\": 3}' WHERE id = $1", fourth
    )
    odd = {}
    for metadata in ('{"pgq_rescues": 1100}', '{"pgq_rescues": "many"}', '{"pgq_rescues": -3}'):
        job = await running_job(conn, previous, attempt=1, max_attempts=10)
        await conn.execute("UPDATE pgq_jobs SET metadata = $2::jsonb WHERE id = $1", job, metadata)
        odd[job] = metadata
    rescued = await maintenance.rescue_predecessor(conn, [previous], 0.1)
    assert sorted(r.id for r in rescued) == sorted([first, fourth, *odd])
    rows = await conn.fetch(
        "SELECT id, extract(epoch FROM scheduled_at - now())::float8 AS wait FROM pgq_jobs"
    )
    waits: dict[int, float] = {r["id"]: r["wait"] for r in rows}
    assert waits[first] < 0.5, waits
    assert 7 * 0.9 - 0.5 <= waits[fourth] <= 7 * 1.1, waits
    # Counts pgq did not write do not stop the rescue: a huge one is capped at an hour,
    # one that is no number or below zero counts as no rescue yet.
    huge, word, negative = odd
    assert 3600 * 0.9 - 1 <= waits[huge] <= 3600 * 1.1, waits
    assert waits[word] < 0.5 and waits[negative] < 0.5, waits


async def test_the_status_of_a_rescue_transaction_is_read_back_or_reported_unknown(
    conn: Conn,
) -> None:
    """How a rescue whose commit's reply was lost is settled: committed and aborted
    transactions read back as such; an id this server never gave (another server, after a
    failover) reads as unknown, rather than failing every later round."""
    from pgq._db.maintenance import xact_status

    tx = conn.transaction()
    await tx.start()
    committed = await conn.fetchval("SELECT pg_current_xact_id()::text")
    await tx.commit()
    tx = conn.transaction()
    await tx.start()
    aborted = await conn.fetchval("SELECT pg_current_xact_id()::text")
    await tx.rollback()
    assert await xact_status(conn, committed) == "committed"
    assert await xact_status(conn, aborted) == "aborted"
    assert await xact_status(conn, str(int(committed) + 10**9)) is None


async def _has_statistics(conn: Conn) -> bool:
    """Whether the planner has column statistics for the jobs table."""
    return bool(
        await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM pg_stats WHERE tablename = 'pgq_jobs'"
            " AND schemaname = current_schema() AND attname = 'state')"
        )
    )


async def _uncounted_jobs(conn: Conn, jobs: int) -> None:
    """``jobs`` more available jobs, autovacuum kept off the table (so that nothing counts
    or analyzes its rows behind the test)."""
    await conn.execute("ALTER TABLE pgq_jobs SET (autovacuum_enabled = off)")
    await conn.execute(
        "INSERT INTO pgq_jobs (task, args) SELECT 'noop', '{}' FROM generate_series(1, $1::int)",
        jobs,
    )


async def _vacuumed_never_analyzed(conn: Conn, jobs: int) -> None:
    """``jobs`` available jobs in a table the planner knows the size of, with no column
    statistics."""
    await _uncounted_jobs(conn, jobs)
    await conn.execute("VACUUM pgq_jobs")
    assert not await _has_statistics(conn)


@contextlib.asynccontextmanager
async def _analyzes_sent(
    dsn: str, user: str | None = None
) -> AsyncIterator[tuple[asyncpg.Pool, list[str]]]:
    """A pool of one connection (as ``user``, when given), and the ANALYZE statements sent
    through it."""
    sent: list[str] = []

    def record(query: asyncpg.connection.LoggedQuery) -> None:
        if query.query.lstrip().upper().startswith("ANALYZE"):
            sent.append(query.query)

    async def init(c: Conn) -> None:
        c.add_query_logger(record)

    pool = await asyncpg.create_pool(dsn, user=user, min_size=1, max_size=1, init=init)
    assert pool is not None
    try:
        yield pool, sent
    finally:
        await pool.close()


async def test_the_leader_analyzes_a_jobs_table_that_has_no_column_statistics(
    dsn: str, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    """Planned without statistics, a claim read and sorted every available job of its queue
    (benchmarks/bench_no_stats.py): the leader analyzes such a table, once. A small table
    never counted (planned from its size) and one whose rows all died are left alone."""
    caplog.set_level(logging.INFO, "pgq.statistics")
    async with _analyzes_sent(dsn) as (pool, sent):
        service = Statistics(pool)
        await _uncounted_jobs(conn, 500)
        assert await service.run_once() is False  # never counted, and small
        await conn.execute("DELETE FROM pgq_jobs")
        await conn.execute("VACUUM pgq_jobs")  # counted: none alive
        assert await service.run_once() is False
        assert sent == []
        await _vacuumed_never_analyzed(conn, 2000)
        assert await service.run_once() is True
        assert await _has_statistics(conn)
        assert await service.run_once() is False  # analyzed once, not every round
        assert len(sent) == 1
    assert service.analyzed == 1
    said = [r.getMessage() for r in caplog.records if r.name == "pgq.statistics"]
    assert len(said) == 1 and "had no column statistics" in said[0], said


async def test_a_table_whose_rows_died_since_they_were_counted_is_analyzed_once(
    dsn: str, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    """Rows counted by a VACUUM and deleted since: ANALYZE finds none alive, stores no
    statistics and counts none, so the next rounds leave the table alone, and nothing is
    said (the server did not refuse)."""
    caplog.set_level(logging.INFO, "pgq.statistics")
    async with _analyzes_sent(dsn) as (pool, sent):
        service = Statistics(pool)
        await _vacuumed_never_analyzed(conn, 2000)
        await conn.execute("DELETE FROM pgq_jobs")
        assert await service.run_once() is False
        assert await service.run_once() is False
        assert len(sent) == 1
    assert not await _has_statistics(conn)
    assert not [r for r in caplog.records if r.name == "pgq.statistics"]


async def test_a_large_table_whose_rows_were_never_counted_is_analyzed(
    dsn: str, conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planned from its size alone, the claim read every available job from about 400,000
    rows: a table never vacuumed or analyzed is analyzed once past UNCOUNTED_PAGES (here
    lowered to one page, for a table of a few)."""
    monkeypatch.setattr(leader_services, "UNCOUNTED_PAGES", 1)
    await _uncounted_jobs(conn, 2000)
    assert (
        await conn.fetchval("SELECT reltuples FROM pg_class WHERE oid = 'pgq_jobs'::regclass") < 0
    )
    async with _analyzes_sent(dsn) as (pool, sent):
        service = Statistics(pool)
        assert await service.run_once() is True
        assert await service.run_once() is False
        assert len(sent) == 1
    assert await _has_statistics(conn)


async def test_a_leading_worker_analyzes_a_jobs_table_without_statistics_as_it_starts(
    dsn: str, conn: Conn
) -> None:
    app = pgq.App()

    @app.task
    async def elsewhere(ctx: pgq.JobContext) -> None: ...  # the 500 jobs are another task's

    await _vacuumed_never_analyzed(conn, 500)
    async with pgq.Worker(app, dsn, **FAST) as worker:
        await until(lambda: _has_statistics(conn))
        assert worker.stats()["leader_services"]["statistics"]["failures"] == 0


async def test_a_role_the_server_will_not_let_analyze_the_jobs_table_says_so_once(
    dsn: str, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    """Only a role with the owner's privileges may analyze the table (from PostgreSQL 17,
    MAINTAIN too): under another role the server skips it, and the worker says once what to
    do. A member of the owner's role that does not inherit them is skipped as well."""
    owner = await conn.fetchval(
        "SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = 'pgq_jobs'::regclass"
    )
    role = f"pgq_not_owner_{uuid.uuid4().hex[:8]}"
    schema = await conn.fetchval("SELECT current_schema()")
    await _vacuumed_never_analyzed(conn, 500)
    # Generated and catalog names, quoted: no input reaches these statements.
    await conn.execute(f'CREATE ROLE "{role}" LOGIN NOINHERIT IN ROLE "{owner}"')
    try:
        await conn.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
        await conn.execute(f'GRANT SELECT ON pgq_jobs TO "{role}"')
        caplog.set_level(logging.INFO, "pgq.statistics")
        async with _analyzes_sent(dsn, user=role) as (pool, sent):
            service = Statistics(pool)
            assert await service.run_once() is False
            assert await service.run_once() is False
            assert len(sent) == 2  # asked each round: the owner may grant it meanwhile
    finally:
        await conn.execute(f'DROP OWNED BY "{role}"')
        await conn.execute(f'DROP ROLE "{role}"')
    assert not await _has_statistics(conn)
    said = [r.getMessage() for r in caplog.records if r.name == "pgq.statistics"]
    assert len(said) == 1 and "run ANALYZE pgq_jobs as its owner" in said[0], said


@pytest.mark.parametrize(("interval_s", "paused"), [(60.0, 2), (0.001, 0)])
async def test_retention_pauses_after_each_full_batch_and_still_deletes_every_due_job(
    dsn: str, conn: Conn, monkeypatch: pytest.MonkeyPatch, interval_s: float, paused: int
) -> None:
    """A round of many batches is paced (a pause after each full batch, as long as the
    batch took), so that it does not hold a connection back to back; the pauses still end
    with every due job deleted in that round. Past half its interval a round stops pausing
    (a 1 ms interval: from its first batch), so a paced round never falls behind."""
    await conn.execute(
        "INSERT INTO pgq_jobs (task, state, finalized_at)"
        " SELECT 't', 'completed', now() - interval '2 hours' FROM generate_series(1, $1)",
        2 * retention_module.BATCH + 500,
    )
    pauses: list[float] = []
    real_sleep = anyio.sleep

    async def recorded(delay: float) -> None:
        pauses.append(delay)
        await real_sleep(delay)

    monkeypatch.setattr(anyio, "sleep", recorded)  # only the round sleeps in this test
    settings = pgq.WorkerSettings.resolve(
        {"retention_completed": 3600, "retention_interval": interval_s}
    )
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
    assert pool is not None
    try:
        assert await Retention(pool, settings).run_once() == 2 * retention_module.BATCH + 500
    finally:
        await pool.close()
    assert await conn.fetchval("SELECT count(*) FROM pgq_jobs") == 0
    assert len(pauses) == paused, pauses  # after the full batches, never after the last
    assert all(p > 0 for p in pauses), pauses


async def test_the_rollup_recounts_the_recent_minutes_and_leaves_older_ones_as_counted(
    dsn: str, conn: Conn
) -> None:
    """The first round counts the last hour; the rounds after recount from the start of
    the minute LATE_S before the previous round began (on the database's clock): an outcome
    finalized at that minute's first instant and committed since is counted, one finalized
    a microsecond earlier is left out, and a minute ten minutes old is not read again."""
    queue = f"rollup-{uuid.uuid4().hex[:8]}"
    finish = (
        "INSERT INTO pgq_jobs (queue, task, state, finalized_at) VALUES ($1, 't', 'completed', $2)"
    )
    counted_in = (
        "SELECT completed FROM pgq_throughput"
        " WHERE queue = $1 AND minute = date_trunc('minute', $2::timestamptz)"
    )
    old = await conn.fetchval("SELECT now() - interval '10 minutes'")  # one fixed moment
    for _ in range(3):
        await conn.execute(finish, queue, old)
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
    assert pool is not None
    try:
        rollup = Throughput(pool)
        await rollup.run_once()
        assert await conn.fetchval(counted_in, queue, old) == 3, "the first round: the hour"
        assert rollup._last_round is not None
        edge = await conn.fetchval(
            "SELECT date_trunc('minute', $1::timestamptz - make_interval(secs => $2))",
            rollup._last_round,
            LATE_S,
        )
        # Committed after the first round: one at the edge, one just before, one in the
        # old minute.
        just_before = edge - timedelta(microseconds=1)
        for finalized in (edge, just_before, old):
            await conn.execute(finish, queue, finalized)
        await rollup.run_once()
        assert await conn.fetchval(counted_in, queue, edge) == 1
        assert await conn.fetchval(counted_in, queue, just_before) is None
        assert await conn.fetchval(counted_in, queue, old) == 3, "an old minute is not recounted"
    finally:
        await pool.close()
