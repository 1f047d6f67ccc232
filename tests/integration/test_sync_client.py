"""pgq.SyncClient: enqueue from synchronous code, alone or in the caller's transaction
(psycopg, SQLAlchemy's sync Connection and Session)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

import pgq
from tests.tests_support import job_notes

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


async def test_a_bulk_enqueue_whose_jobs_cannot_be_built_says_it_committed(
    dsn: str, conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The sync client builds the jobs once the commit returned: a failure there must not
    # read as a batch that failed, which a retry would enqueue twice.
    from pgq._store import enqueue

    def out_of_memory(*args: object) -> list[pgq.Job[object]]:
        raise MemoryError("no room")

    monkeypatch.setattr(enqueue, "copied_jobs", out_of_memory)
    with pgq.SyncClient(dsn) as client, pytest.raises(pgq.PgqError) as info:
        client.enqueue_many([pgq.JobSpec("t", {"i": i}) for i in range(50)])
    assert "the 50 jobs of this batch" in str(info.value)
    assert "were enqueued (their transaction committed)" in str(info.value)
    assert isinstance(info.value.__cause__, MemoryError)
    assert await conn.fetchval("SELECT count(*) FROM pgq_jobs") == 50
