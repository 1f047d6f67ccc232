"""pgq.SyncClient: enqueue from synchronous code, alone or in the caller's transaction
(psycopg, SQLAlchemy's sync Connection and Session); read, cancel, retry and wait for jobs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread
import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

import pgq
from pgq import sync as pgq_sync
from tests.tests_support import job_notes, until

if TYPE_CHECKING:
    from tests.tests_support import Conn

pytestmark = pytest.mark.anyio


def typed_app() -> pgq.App:
    app = pgq.App()

    @app.task(queue="emails", max_attempts=4)
    async def send_welcome(ctx: pgq.JobContext, to: str) -> str:
        return to

    return app


def sa_url(dsn: str) -> str:
    return "postgresql+psycopg://" + dsn.split("://", 1)[1]


async def test_enqueue_one_and_many_as_the_async_client_does(dsn: str, conn: Conn) -> None:
    app = typed_app()
    task = app.get("send_welcome")
    with pgq.SyncClient(dsn, app=app) as client:
        one = client.enqueue(task.spec(to="ada@example.com"), priority=3)
        later = client.enqueue("send_welcome", {"to": "bob@example.com"}, delay=60)
        at = datetime.now(UTC) + timedelta(hours=1)
        many = client.enqueue_many(
            [task.spec(to=f"{i}@example.com") for i in range(500)]
            + [pgq.JobSpec(task, {"to": "x"}, run_at=at, tags=["t"], metadata={"m": 1})]
        )
        keyed = client.enqueue_many(
            [
                pgq.JobSpec(task, {"to": "k"}, unique_key="k1"),
                pgq.JobSpec(task, {"to": "k2"}, unique_key="k1"),
            ]
        )
        with pytest.raises(pgq.ConfigError, match="takes no argument signupid"):
            client.enqueue("send_welcome", {"signupid": 1})
    assert (one.queue, one.priority, one.max_attempts, one.state) == (
        "emails",
        3,
        4,
        pgq.JobState.AVAILABLE,
    )
    assert later.state is pgq.JobState.SCHEDULED
    assert [j.id for j in many] == sorted(j.id for j in many) and len(many) == 501
    assert many[-1].state is pgq.JobState.SCHEDULED and many[-1].scheduled_at == at
    assert not keyed[0].duplicate and keyed[1].duplicate and keyed[1].id == keyed[0].id
    rows = await conn.fetch("SELECT id, args::text, tags, metadata::text FROM pgq_jobs ORDER BY id")
    assert len(rows) == 504
    assert rows[0]["args"] == '{"to": "ada@example.com"}'
    stored = {r["id"]: r for r in rows}[many[-1].id]
    assert stored["tags"] == ["t"] and stored["metadata"] == '{"m": 1}'


async def test_a_psycopg_transaction_carries_the_job_and_its_wake_up(dsn: str, conn: Conn) -> None:
    async with job_notes(dsn) as notes:
        with pgq.SyncClient(dsn) as client, psycopg.connect(dsn) as pg:
            kept = client.enqueue("t", {"n": 1}, connection=pg)
            pg.commit()
            dropped = client.enqueue("t", {"n": 2}, connection=pg)
            pg.rollback()
        assert await notes.received() == ["default"], "one wake-up, for the committed job"
    ids = [r[0] for r in await conn.fetch("SELECT id FROM pgq_jobs")]
    assert ids == [kept.id] and dropped.id not in ids


async def test_a_chain_or_group_rolls_back_with_a_psycopg_transaction_not_yet_begun(
    dsn: str, conn: Conn
) -> None:
    specs = [pgq.JobSpec("t"), pgq.JobSpec("t")]
    with pgq.SyncClient(dsn) as client, psycopg.connect(dsn) as pg:
        client.enqueue_chain(specs, connection=pg)  # the connection's first statement
        client.enqueue_group(specs, pgq.JobSpec("t"), connection=pg)
        pg.rollback()
    assert await conn.fetchval("SELECT count(*) FROM pgq_jobs") == 0


async def test_sqlalchemy_sync_connection_and_session_commit_and_roll_back_with_the_job(
    dsn: str, conn: Conn
) -> None:
    await conn.execute("CREATE TABLE users (email text PRIMARY KEY)")
    engine = create_engine(sa_url(dsn))
    try:
        with pgq.SyncClient(dsn) as client:
            with Session(engine) as session, session.begin():
                session.execute(text("INSERT INTO users VALUES ('ada@example.com')"))
                client.enqueue("welcome", {"to": "ada@example.com"}, connection=session)
            with Session(engine) as session:
                session.execute(text("INSERT INTO users VALUES ('bob@example.com')"))
                client.enqueue("welcome", {"to": "bob@example.com"}, connection=session)
                session.rollback()
            with engine.connect() as connection:
                client.enqueue("welcome", {"to": "cy@example.com"}, connection=connection)
                connection.commit()
    finally:
        engine.dispose()
    users = [r[0] for r in await conn.fetch("SELECT email FROM users")]
    jobs = [r[0] for r in await conn.fetch("SELECT args->>'to' FROM pgq_jobs ORDER BY id")]
    assert users == ["ada@example.com"]
    assert jobs == ["ada@example.com", "cy@example.com"]


def test_a_driver_other_than_psycopg_is_refused_with_the_fix(dsn: str) -> None:
    with pytest.raises(pgq.ConfigError, match="takes a psycopg connection"):
        with pgq.SyncClient(dsn) as client:
            client.enqueue("t", connection=object())  # type: ignore[call-overload]


def test_a_server_that_does_not_answer_is_named_without_its_password() -> None:
    with pytest.raises(
        pgq.DatabaseUnavailable, match=r"postgresql://u:\*\*\*@127.0.0.1:9/db"
    ) as info:
        pgq.SyncClient("postgresql://u:hunter2@127.0.0.1:9/db").open()
    assert "hunter2" not in str(info.value)


def test_an_unmigrated_database_says_to_migrate(empty_dsn: str) -> None:
    with pytest.raises(pgq.SchemaMismatch, match="run `pgq migrate`"):
        pgq.SyncClient(empty_dsn).open()


async def test_a_chain_or_group_postgres_cannot_store_names_the_job(dsn: str, conn: Conn) -> None:
    # What PostgreSQL raises when a jsonb value exceeds its limits (program_limit_exceeded).
    await conn.execute("""
        CREATE FUNCTION too_big() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.args ? 'big' THEN
                RAISE EXCEPTION 'total size of jsonb array elements exceeds the maximum'
                    USING ERRCODE = 'program_limit_exceeded';
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER too_big BEFORE INSERT ON pgq_jobs FOR EACH ROW EXECUTE FUNCTION too_big();
    """)
    specs = [pgq.JobSpec("t", {"i": 1}), pgq.JobSpec("t", {"big": [1, 2, 3]})]
    with pgq.SyncClient(dsn) as client:
        with pytest.raises(pgq.SerializationError, match=r"job 1: args of task 't'") as info:
            client.enqueue_chain(specs)
        assert isinstance(info.value.__cause__, psycopg.errors.ProgramLimitExceeded)
        with pytest.raises(pgq.SerializationError, match=r"job 1: args of task 't'"):
            client.enqueue_group(specs, pgq.JobSpec("t"))
    assert await conn.fetchval("SELECT count(*) FROM pgq_jobs") == 0


# --------------------------------------------------------------------------- reads, actions, wait


async def _listening(conn: Conn, count: int = 1) -> bool:
    """Whether ``count`` connections of this database LISTEN for finished jobs (a wait)."""
    return bool(
        await conn.fetchval(
            "SELECT count(*) = $1 FROM pg_stat_activity"
            " WHERE datname = current_database() AND query = 'LISTEN pgq_done'",
            count,
        )
    )


async def test_get_job_cancel_and_retry_as_the_async_client_does(
    dsn: str, client: pgq.Client
) -> None:
    with pgq.SyncClient(dsn) as sync:
        job = sync.enqueue("t", {"n": 1}, tags=["a"])
        read = sync.get_job(job.id)
        assert read is not None and read == await client.get_job(job.id)
        assert (read.args, read.tags, read.state) == ({"n": 1}, ["a"], pgq.JobState.AVAILABLE)
        assert sync.get_job(job.id + 1000) is None
        cancelled = sync.cancel(job.id)
        assert cancelled is not None and cancelled.state is pgq.JobState.CANCELLED
        assert cancelled.errors[-1]["kind"] == "cancel"
        assert sync.cancel(job.id + 1000) is None
        assert sync.cancel_many([job.id]) == {}, "a final job is left out"
        assert sync.retry([job.id, job.id + 1000]) == [job.id]
        again = sync.get_job(job.id)
        assert again is not None and again.state is pgq.JobState.AVAILABLE
        other = sync.enqueue("t", delay=3600)
        assert sync.cancel_many([job.id, other.id]) == {
            job.id: pgq.JobState.CANCELLED,
            other.id: pgq.JobState.CANCELLED,
        }
        for bad in (0, -1, 2**63, True):
            with pytest.raises(pgq.ConfigError, match="a job id is a whole number from 1"):
                sync.get_job(bad)
            with pytest.raises(pgq.ConfigError, match="a job id is a whole number from 1"):
                sync.retry([bad])
        with pytest.raises(pgq.ConfigError, match="pass a list of job ids"):
            sync.cancel_many(job.id)  # type: ignore[arg-type]
    with pytest.raises(pgq.ClientClosed):
        sync.get_job(job.id)


async def test_a_retry_leaves_out_a_job_whose_unique_key_another_took(dsn: str) -> None:
    with pgq.SyncClient(dsn) as sync:
        first = sync.enqueue("t", unique_key="k")
        sync.cancel(first.id)  # final: the key is free
        second = sync.enqueue("t", unique_key="k")
        assert not second.duplicate
        sync.cancel(second.id)
        third = sync.enqueue("t", unique_key="k")
        # Both finished jobs would take the key back: neither may while `third` holds it.
        assert sync.retry([first.id, second.id]) == []
        sync.cancel(third.id)
        assert sync.retry([first.id, second.id]) == [second.id], "of two, the newest"


async def test_cancel_and_retry_join_a_psycopg_or_sqlalchemy_transaction(
    dsn: str, conn: Conn
) -> None:
    engine = create_engine(sa_url(dsn))
    try:
        with pgq.SyncClient(dsn) as sync, psycopg.connect(dsn) as pg:
            job = sync.enqueue("t")
            cancelled = sync.cancel(job.id, connection=pg)
            assert cancelled is not None and cancelled.state is pgq.JobState.CANCELLED
            assert await conn.fetchval("SELECT state::text FROM pgq_jobs") == "available"
            pg.rollback()
            sync.cancel(job.id, connection=pg)
            pg.commit()
            with Session(engine) as session:
                assert sync.retry([job.id], connection=session) == [job.id]
                read = sync.get_job(job.id, connection=session)
                assert read is not None and read.state is pgq.JobState.AVAILABLE
                session.rollback()
    finally:
        engine.dispose()
    assert await conn.fetchval("SELECT state::text FROM pgq_jobs") == "cancelled"


async def test_wait_returns_the_job_a_worker_finished_with_its_result(dsn: str) -> None:
    app = typed_app()
    with pgq.SyncClient(dsn, app=app) as sync:
        job = sync.enqueue(app.get("send_welcome").spec(to="ada@example.com"))
        async with anyio.create_task_group() as tg:
            tg.start_soon(pgq.Worker(app, dsn, poll_interval=0.05).run)
            done = await anyio.to_thread.run_sync(lambda: sync.wait(job, timeout=30))
            tg.cancel_scope.cancel()
    assert done.state is pgq.JobState.COMPLETED and done.result == "ada@example.com"


@pytest.mark.parametrize("lose_the_listen_connection", [False, True])
async def test_wait_is_woken_by_the_notification_of_its_job(
    dsn: str, client: pgq.Client, conn: Conn, monkeypatch: pytest.MonkeyPatch,
    lose_the_listen_connection: bool,
) -> None:  # fmt: skip
    """No re-read on a timer here: only the job's notification (on a LISTEN connection made
    again, when the first is lost) can end the wait before its timeout."""
    monkeypatch.setattr(pgq_sync, "WAIT_RECHECK_S", 3600.0)
    with pgq.SyncClient(dsn) as sync:
        job = sync.enqueue("t")
        other = sync.enqueue("t")
        async with anyio.create_task_group() as tg:
            waited: list[pgq.Job] = []

            async def wait() -> None:
                waited.append(await anyio.to_thread.run_sync(lambda: sync.wait(job, timeout=30)))

            tg.start_soon(wait)
            await until(lambda: _listening(conn))
            if lose_the_listen_connection:
                await conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND query = 'LISTEN pgq_done'"
                )
                await until(lambda: _listening(conn))  # listening again
            await client.cancel(other.id)  # another job's announcement: still waiting
            await client.cancel(job.id)
    (done,) = waited
    assert done.id == job.id and done.state is pgq.JobState.CANCELLED
    await until(lambda: _listening(conn, 0))  # the wait's connection is closed


async def test_wait_behind_a_transaction_pooler_polls_without_listening(
    dsn: str, client: pgq.Client, conn: Conn
) -> None:
    with pgq.SyncClient(dsn, pooler="transaction") as sync:
        job = sync.enqueue("t")
        async with anyio.create_task_group() as tg:
            waited: list[pgq.Job] = []

            async def wait() -> None:
                waited.append(await anyio.to_thread.run_sync(lambda: sync.wait(job, timeout=30)))

            tg.start_soon(wait)
            await until(
                lambda: conn.fetchval(
                    "SELECT count(*) > 0 FROM pg_stat_activity WHERE datname = current_database()"
                    " AND query LIKE '%FROM pgq_jobs WHERE id = $1%'"
                )
            )
            assert not await _listening(conn, 1)
            await client.cancel(job.id)
    assert waited[0].state is pgq.JobState.CANCELLED


async def test_wait_times_out_names_an_unknown_job_and_ends_when_the_client_closes(
    dsn: str, conn: Conn
) -> None:
    sync = pgq.SyncClient(dsn)
    with sync:
        job = sync.enqueue("t")
        with pytest.raises(TimeoutError, match=f"job {job.id} is not final after 0.2 s"):
            sync.wait(job, timeout=0.2)
        with pytest.raises(LookupError, match=f"no job {job.id + 1}"):
            sync.wait(job.id + 1)
        with pytest.raises(pgq.ConfigError, match="timeout must be a number of seconds"):
            sync.wait(job, timeout=float("nan"))
        async with anyio.create_task_group() as tg:
            ended: list[BaseException] = []

            async def wait() -> None:
                try:
                    await anyio.to_thread.run_sync(lambda: sync.wait(job))
                except pgq.ClientClosed as exc:
                    ended.append(exc)

            tg.start_soon(wait)
            await until(lambda: _listening(conn))
            closed_at = anyio.current_time()
            sync.close()
        took = anyio.current_time() - closed_at
    (closed,) = ended
    assert "closed while a wait() was under way" in str(closed)
    assert took < 5, f"the wait ended {took:.1f} s after close(), not within about a second"


async def test_a_bulk_enqueue_whose_jobs_cannot_be_built_says_it_committed(
    dsn: str, conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The sync client builds the jobs once the commit returned: a failure there must not
    # read as a batch that failed, which a retry would enqueue twice.
    from pgq._db import enqueue

    def out_of_memory(*args: object) -> list[pgq.Job[object]]:
        raise MemoryError("no room")

    monkeypatch.setattr(enqueue, "copied_jobs", out_of_memory)
    with pgq.SyncClient(dsn) as client, pytest.raises(pgq.PgqError) as info:
        client.enqueue_many([pgq.JobSpec("t", {"i": i}) for i in range(50)])
    assert "the 50 jobs of this batch" in str(info.value)
    assert "were enqueued (their transaction committed)" in str(info.value)
    assert isinstance(info.value.__cause__, MemoryError)
    assert await conn.fetchval("SELECT count(*) FROM pgq_jobs") == 50
