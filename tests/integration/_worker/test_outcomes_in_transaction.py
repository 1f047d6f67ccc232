"""A task settles its own attempt inside its own transaction: its effects and the job's
outcome commit together, or not at all (ctx.complete(connection=...) and siblings)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg
import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import pgq
from pgq._core.dsn import sqlalchemy_url
from pgq._worker import producer as producer_module
from pgq._worker.outcomes import InTransactionOutcomes
from tests.integration._worker.test_liveness import FAST
from tests.tests_support import until

if TYPE_CHECKING:
    from tests.tests_support import Conn

pytestmark = pytest.mark.anyio

SETTINGS: dict[str, Any] = {**FAST, "rescue_interval": 3600}


@pytest.fixture
async def effects(conn: Conn) -> Conn:
    await conn.execute("CREATE TABLE effects (job_id bigint, attempt int, what text)")
    return conn


async def effect_rows(conn: Conn) -> list[tuple[int, int, str]]:
    return [tuple(r) for r in await conn.fetch("SELECT * FROM effects ORDER BY job_id, attempt")]


async def test_a_completion_that_committed_stands_whatever_the_task_does_next(
    dsn: str, effects: Conn, client: pgq.Client, caplog: pytest.LogCaptureFixture
) -> None:
    app = pgq.App()

    @app.task(max_attempts=3)
    async def charge(ctx: pgq.JobContext, order: int) -> None:
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
        assert pool is not None
        try:
            async with pool.acquire() as c, c.transaction():
                await c.execute(
                    "INSERT INTO effects VALUES ($1, $2, 'charged')", ctx.id, ctx.attempt
                )
                # A follow-up job in the same transaction: it exists only if this commits.
                await client.enqueue("receipt", {"order": order}, connection=c)
                await ctx.complete(connection=c, result={"order": order})
        finally:
            await pool.close()
        raise RuntimeError("a failure after the commit changes nothing")

    caplog.set_level(logging.WARNING)
    job = await client.enqueue("charge", {"order": 7})
    async with pgq.Worker(app, dsn, **SETTINGS) as worker:
        done = await client.wait(job, timeout=15)

        async def counted() -> bool:  # once the task has returned, after its commit
            return bool(worker.stats()["producers"][0]["completed"] == 1)

        await until(counted)
        stats = worker.stats()["producers"][0]
    assert done.state is pgq.JobState.COMPLETED and done.result == {"order": 7}
    assert done.attempt == 1 and done.errors == []
    assert await effect_rows(effects) == [(job.id, 1, "charged")]
    assert [j.task for j in await client.list_jobs(task="receipt")] == ["receipt"]
    assert stats["rejected_outcomes"] == 0 and stats["completed"] == 1
    assert not [r for r in caplog.records if "rejected" in r.getMessage()]


def _charging_app(dsn: str, workers: list[pgq.Worker]) -> pgq.App:
    """A task that completes itself in its own transaction, and a sync ``job_finished``
    hook that stops the worker at once: the cancel lands at the task's next await, the
    worker's check of that commit."""
    app = pgq.App()

    @app.on("job_finished")
    def stop_now(event: pgq.JobEvent) -> None:
        workers[0].stop(now=True)

    @app.task
    async def charge(ctx: pgq.JobContext) -> None:
        c = await asyncpg.connect(dsn)
        try:
            async with c.transaction():
                await c.execute("INSERT INTO effects VALUES ($1, $2, 'charged')", ctx.id, 1)
                await ctx.complete(connection=c, result="charged")
        finally:
            await c.close()

    return app


def _watch_checks(monkeypatch: pytest.MonkeyPatch, stall_second: bool = False) -> list[str]:
    """Record how each of the worker's checks of a task's own commit ended ("answered",
    "cancelled"); with ``stall_second``, the second never answers (a database that does not
    reply), as a stalled connection would."""
    seen: list[str] = []
    checked = InTransactionOutcomes.committed

    async def watched(self: InTransactionOutcomes, ctx: pgq.JobContext) -> str | None:
        try:
            if stall_second and seen:
                await anyio.sleep_forever()
            state = await checked(self, ctx)
        except BaseException:
            seen.append("cancelled")
            raise
        seen.append("answered")
        return state

    monkeypatch.setattr(InTransactionOutcomes, "committed", watched)
    return seen


async def _charge_and_stop(
    dsn: str, client: pgq.Client, monkeypatch: pytest.MonkeyPatch, *, stall_second: bool = False
) -> tuple[pgq.Job, pgq.Job | None, dict[str, Any], list[str]]:
    """Run one job of ``_charging_app`` under a worker that its hook stops at once, the
    checks watched (``_watch_checks``): the job as enqueued and as it ended, the producer's
    stats, and how each check ended."""
    workers: list[pgq.Worker] = []
    app = _charging_app(dsn, workers)
    checks = _watch_checks(monkeypatch, stall_second)
    job = await client.enqueue("charge")
    workers.append(worker := pgq.Worker(app, dsn, **SETTINGS))
    with anyio.fail_after(15):
        await worker.run()
    stats = worker.stats()["producers"][0]
    return job, await client.get_job(job.id), stats, checks


async def test_a_stop_that_lands_as_the_worker_checks_the_commit_still_counts_the_job(
    dsn: str,
    effects: Conn,
    client: pgq.Client,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A shutdown that reaches the job's task after the task's own transaction committed
    its completion, while the worker asks the database whether it did: the worker asks
    again, finds the commit, and counts the job completed; it writes no outcome of its own
    to be fenced out and logged as rejected."""
    caplog.set_level(logging.WARNING)
    job, done, stats, checks = await _charge_and_stop(dsn, client, monkeypatch)
    assert checks == ["cancelled", "answered"]  # the stop landed in the check
    assert done is not None and done.state is pgq.JobState.COMPLETED
    assert done.result == "charged" and done.attempt == 1
    assert await effect_rows(effects) == [(job.id, 1, "charged")]
    assert stats["completed"] == 1 and stats["rejected_outcomes"] == 0
    assert not [r for r in caplog.records if "rejected" in r.getMessage()]


async def test_the_check_asked_again_after_a_stop_is_bounded(
    dsn: str,
    effects: Conn,
    client: pgq.Client,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """When the check asked again after a stop gets no answer, the stop does not wait on
    it: after RECHECK_S the worker writes its own outcome (fenced out: the task's commit
    stands) and stops."""
    monkeypatch.setattr(producer_module, "IN_TRANSACTION_RECHECK_S", 0.3)
    caplog.set_level(logging.WARNING)
    _, done, stats, checks = await _charge_and_stop(dsn, client, monkeypatch, stall_second=True)
    assert checks == ["cancelled", "cancelled"]  # the second ended by its bound
    assert done is not None and done.state is pgq.JobState.COMPLETED
    assert done.result == "charged" and done.attempt == 1
    assert stats["rejected_outcomes"] == 1 and stats["completed"] == 0
    assert [
        r for r in caplog.records if "could not check its transactional outcome" in r.getMessage()
    ]


async def test_a_rolled_back_completion_leaves_the_attempt_to_go_on(
    dsn: str, effects: Conn, client: pgq.Client
) -> None:
    app = pgq.App()

    @app.task(max_attempts=3, backoff=pgq.Backoff(base_s=0.01, jitter=0))
    async def charge(ctx: pgq.JobContext) -> None:
        conn = await asyncpg.connect(dsn)
        try:
            async with conn.transaction():
                await conn.execute(
                    "INSERT INTO effects VALUES ($1, $2, 'charged')", ctx.id, ctx.attempt
                )
                await ctx.complete(connection=conn, result=ctx.attempt)
                if ctx.attempt == 1:
                    raise ValueError("failed before the commit: both roll back")
        finally:
            await conn.close()

    job = await client.enqueue("charge")
    async with pgq.Worker(app, dsn, **SETTINGS):
        done = await client.wait(job, timeout=15)
    assert done.state is pgq.JobState.COMPLETED and done.result == 2 and done.attempt == 2
    assert [e["kind"] for e in done.errors] == ["exception"]
    assert await effect_rows(effects) == [(job.id, 2, "charged")], "exactly once"


async def test_a_superseded_attempt_cannot_complete_and_its_effects_roll_back(
    dsn: str, effects: Conn, client: pgq.Client, conn: Conn
) -> None:
    app = pgq.App()
    started, release = anyio.Event(), anyio.Event()
    raised: list[BaseException] = []

    @app.task
    async def charge(ctx: pgq.JobContext) -> None:
        started.set()
        await release.wait()
        c = await asyncpg.connect(dsn)
        try:
            async with c.transaction():
                await c.execute("INSERT INTO effects VALUES ($1, $2, 'late')", ctx.id, ctx.attempt)
                await ctx.complete(connection=c)
        except pgq.AttemptSuperseded as exc:
            raised.append(exc)
            raise
        finally:
            await c.close()

    job = await client.enqueue("charge")
    async with pgq.Worker(app, dsn, **SETTINGS) as worker:
        with anyio.fail_after(10):
            await started.wait()
        # What the rescue of a job does while its zombie still runs it.
        await conn.execute(
            "UPDATE pgq_jobs SET state = 'retryable', scheduled_at = now() + interval '1 hour'"
            " WHERE id = $1",
            job.id,
        )
        release.set()

        async def rejected() -> bool:
            return bool(worker.stats()["producers"][0]["rejected_outcomes"] == 1)

        await until(rejected)
    (exc,) = raised
    assert f"job {job.id} attempt 1 is no longer the job's running attempt" in str(exc)
    assert await effect_rows(effects) == [], "rolled back with the refused completion"
    stored = await client.get_job(job.id)
    assert stored is not None and stored.state is pgq.JobState.RETRYABLE


async def test_retry_snooze_and_cancel_in_the_tasks_transaction(
    dsn: str, effects: Conn, client: pgq.Client
) -> None:
    app = pgq.App()

    @app.task(max_attempts=5)
    async def step(ctx: pgq.JobContext, how: str) -> str:
        conn = await asyncpg.connect(dsn)
        try:
            async with conn.transaction():
                await conn.execute(
                    "INSERT INTO effects VALUES ($1, $2, $3)", ctx.id, ctx.attempt, how
                )
                if how == "retry" and ctx.attempt == 1:
                    await ctx.retry(connection=conn, delay=0, reason="not yet")
                elif how == "snooze" and ctx.job.metadata.get("snoozed") is None:
                    await conn.execute(
                        "UPDATE pgq_jobs SET metadata = '{\"snoozed\": true}' WHERE id = $1",
                        ctx.id,
                    )
                    await ctx.snooze(connection=conn, delay=0)
                elif how == "cancel":
                    await ctx.cancel(connection=conn, reason="nothing to do")
                else:
                    await ctx.complete(connection=conn, result=how)
        finally:
            await conn.close()
        return "the worker's outcome, never written"

    jobs = {
        how: await client.enqueue("step", {"how": how}) for how in ("retry", "snooze", "cancel")
    }
    async with pgq.Worker(app, dsn, **SETTINGS):
        done = {how: await client.wait(j, timeout=15) for how, j in jobs.items()}
    assert done["retry"].state is pgq.JobState.COMPLETED and done["retry"].attempt == 2
    assert done["retry"].errors[0]["message"] == "not yet" and done["retry"].result == "retry"
    assert done["snooze"].state is pgq.JobState.COMPLETED and done["snooze"].attempt == 1
    assert done["cancel"].state is pgq.JobState.CANCELLED
    assert done["cancel"].errors[-1]["message"] == "nothing to do"
    rows = await effect_rows(effects)
    assert sorted(r[2] for r in rows) == ["cancel", "retry", "retry", "snooze", "snooze"]


async def test_a_sqlalchemy_session_carries_the_completion(
    dsn: str, effects: Conn, client: pgq.Client
) -> None:
    engine = create_async_engine(sqlalchemy_url(dsn))
    app = pgq.App()

    @app.task
    async def charge(ctx: pgq.JobContext) -> None:
        async with AsyncSession(engine) as session, session.begin():
            await session.execute(
                text("INSERT INTO effects VALUES (:id, :attempt, 'orm')"),
                {"id": ctx.id, "attempt": ctx.attempt},
            )
            await ctx.complete(connection=session, result="via the session")

    try:
        job = await client.enqueue("charge")
        async with pgq.Worker(app, dsn, **SETTINGS):
            done = await client.wait(job, timeout=15)
    finally:
        await engine.dispose()
    assert done.result == "via the session"
    assert await effect_rows(effects) == [(job.id, 1, "orm")]


async def test_a_plain_def_task_completes_in_its_transaction_on_psycopg_and_sqlalchemy(
    dsn: str, effects: Conn, client: pgq.Client
) -> None:
    engine = create_engine("postgresql+psycopg://" + dsn.split("://", 1)[1])
    app = pgq.App()

    @app.task
    def with_psycopg(ctx: pgq.JobContext) -> None:
        with psycopg.connect(dsn) as pg, pg.transaction():
            pg.execute("INSERT INTO effects VALUES (%s, %s, 'psycopg')", (ctx.id, ctx.attempt))
            ctx.complete_sync(connection=pg, result="psycopg")

    @app.task
    def with_session(ctx: pgq.JobContext) -> None:
        with Session(engine) as session, session.begin():
            session.execute(
                text("INSERT INTO effects VALUES (:id, :attempt, 'session')"),
                {"id": ctx.id, "attempt": ctx.attempt},
            )
            ctx.complete_sync(connection=session, result="session")

    try:
        first = await client.enqueue("with_psycopg")
        second = await client.enqueue("with_session")
        async with pgq.Worker(app, dsn, **SETTINGS):
            done = [await client.wait(j, timeout=15) for j in (first, second)]
    finally:
        engine.dispose()
    assert [d.result for d in done] == ["psycopg", "session"]
    assert [r[2] for r in await effect_rows(effects)] == ["psycopg", "session"]


async def test_settling_outside_a_worker_says_why() -> None:
    job: pgq.Job = pgq.Job(1, "default", "t", {}, pgq.JobState.RUNNING)
    with pytest.raises(pgq.ConfigError, match="does not run under a pgq worker"):
        await pgq.JobContext(job).complete(connection=None)
