"""connection= on psycopg's async driver: a psycopg ``AsyncConnection``, or SQLAlchemy's
``AsyncConnection`` / ``AsyncSession`` on ``postgresql+psycopg``. Jobs enqueued there, and
outcomes a task settles there, commit or roll back with the caller's transaction, as on
asyncpg; what psycopg raises arrives as pgq's errors."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

import pgq
from tests.integration._worker.test_liveness import FAST
from tests.tests_support import job_notes

if TYPE_CHECKING:
    from tests.tests_support import Conn

pytestmark = pytest.mark.anyio

SETTINGS: dict[str, Any] = {**FAST, "rescue_interval": 3600}


@pytest.fixture
async def pg(dsn: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A psycopg async connection, not in autocommit mode (psycopg's default)."""
    conn = await psycopg.AsyncConnection.connect(dsn)
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
async def engine(dsn: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine("postgresql+psycopg://" + dsn.split("://", 1)[1])
    try:
        yield engine
    finally:
        await engine.dispose()


async def _count(conn: Conn) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM pgq_jobs"))


async def test_every_enqueue_commits_with_a_psycopg_transaction_and_wakes_on_commit(
    client: pgq.Client, pg: psycopg.AsyncConnection[Any], conn: Conn, dsn: str
) -> None:
    specs = [pgq.JobSpec("t", {"i": i}, queue="pg") for i in range(3)]
    async with job_notes(dsn) as notes:
        async with pg.transaction():
            one = await client.enqueue("t", queue="pg", connection=pg)
            many = await client.enqueue_many(specs, connection=pg)
            chain = await client.enqueue_chain(specs, connection=pg)
            members, callback = await client.enqueue_group(specs, specs[0], connection=pg)
            assert await _count(conn) == 0, "visible before the commit"
            assert await notes.received() == []
        assert await notes.received() == ["pg"]
    written = [one, *many, *chain, *members, callback]
    assert await _count(conn) == len(written) == 11
    assert len({j.id for j in written}) == 11
    for job in written:
        stored = await client.get_job(job.id)
        assert stored is not None
        assert (stored.state, stored.args, stored.depends_on) == (
            job.state, job.args, job.depends_on
        )  # fmt: skip
    assert [j.depends_on for j in chain] == [None, [chain[0].id], [chain[1].id]]
    assert callback.depends_on == [m.id for m in members]


async def test_a_rollback_of_the_psycopg_transaction_enqueues_nothing(
    client: pgq.Client, pg: psycopg.AsyncConnection[Any], conn: Conn
) -> None:
    specs = [pgq.JobSpec("t", {"i": i}) for i in range(3)]
    # The connection's own transaction, begun by its first statement (no transaction()
    # block): a chain's or group's savepoint stays inside it.
    await client.enqueue_chain(specs, connection=pg)
    await client.enqueue_group(specs, specs[0], connection=pg)
    await client.enqueue_many(specs, connection=pg)
    await pg.rollback()

    async def fails_after_enqueueing() -> None:
        async with pg.transaction():
            await client.enqueue("t", connection=pg)
            raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        await fails_after_enqueueing()
    assert await _count(conn) == 0


async def test_an_autocommit_psycopg_connection_writes_at_once(
    client: pgq.Client, dsn: str, conn: Conn
) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as pg:
        await client.enqueue("t", connection=pg)
        await client.enqueue_chain([pgq.JobSpec("t"), pgq.JobSpec("t")], connection=pg)
    assert await _count(conn) == 3


async def test_unique_keys_read_their_holders_through_psycopg(
    client: pgq.Client, pg: psycopg.AsyncConnection[Any]
) -> None:
    held = await client.enqueue("t", {"n": 1}, unique_key="k", tags=["x"])
    async with pg.transaction():
        jobs = await client.enqueue_many(
            [
                pgq.JobSpec("t", {"n": 2}, unique_key="k"),
                pgq.JobSpec("t", {"n": 3}, unique_key="fresh"),
            ],
            connection=pg,
        )
        dependent = await client.enqueue("t", unique_key="k", depends_on=[held], connection=pg)
    assert jobs[0].duplicate and jobs[0].id == held.id and jobs[0].tags == ["x"]
    assert jobs[0].args == {"n": 1} and jobs[0].created_at == held.created_at
    assert not jobs[1].duplicate
    assert dependent.duplicate and dependent.id == held.id


async def test_a_sqlalchemy_psycopg_session_and_connection_commit_and_roll_back(
    client: pgq.Client, engine: AsyncEngine, conn: Conn
) -> None:
    async with AsyncSession(engine) as session:
        rolled = await client.enqueue_chain(
            [pgq.JobSpec("t", {"n": 1}), pgq.JobSpec("t")], connection=session
        )
        await session.rollback()
    async with AsyncSession(engine) as session, session.begin():
        await session.execute(text("SELECT 1"))
        kept = await client.enqueue("t", {"n": 2}, connection=session)
    async with engine.connect() as sa_conn:
        conn_rolled = await client.enqueue("t", {"n": 3}, connection=sa_conn)
        await sa_conn.rollback()
    async with engine.begin() as sa_conn:
        conn_kept = await client.enqueue_many(
            [pgq.JobSpec("t", {"n": 4}), pgq.JobSpec("t", {"n": 5})], connection=sa_conn
        )
    for job in [*rolled, conn_rolled]:
        assert await client.get_job(job.id) is None
    for job in [kept, *conn_kept]:
        assert await client.get_job(job.id) is not None
    assert await _count(conn) == 3


async def test_jobs_enqueued_through_psycopg_run(
    client: pgq.Client, engine: AsyncEngine, dsn: str
) -> None:
    app = pgq.App()

    @app.task
    async def double(ctx: pgq.JobContext, n: int) -> int:
        return n * 2

    async with AsyncSession(engine) as session, session.begin():
        job = await client.enqueue("double", {"n": 21}, connection=session)
    async with pgq.Worker(app, dsn, **SETTINGS):
        done = await client.wait(job, timeout=15)
    assert done.state is pgq.JobState.COMPLETED and done.result == 42


@pytest.fixture
async def effects(conn: Conn) -> Conn:
    await conn.execute("CREATE TABLE effects (job_id bigint, attempt int, what text)")
    return conn


async def test_a_task_settles_in_a_psycopg_transaction_or_not_at_all(
    dsn: str, effects: Conn, client: pgq.Client, engine: AsyncEngine
) -> None:
    app = pgq.App()

    @app.task(max_attempts=3, backoff=pgq.Backoff(base_s=0.01, jitter=0))
    async def charge(ctx: pgq.JobContext, how: str) -> str:
        if how == "session":
            async with AsyncSession(engine) as session, session.begin():
                await session.execute(
                    text("INSERT INTO effects VALUES (:id, :attempt, 'session')"),
                    {"id": ctx.id, "attempt": ctx.attempt},
                )
                await ctx.complete(connection=session, result="via the session")
            return "the worker's outcome, never written"
        async with await psycopg.AsyncConnection.connect(dsn) as pg, pg.transaction():
            await pg.execute(
                "INSERT INTO effects VALUES (%s, %s, 'psycopg')", (ctx.id, ctx.attempt)
            )
            if how == "retry" and ctx.attempt == 1:
                await ctx.retry(connection=pg, delay=0, reason="not yet")
                return "retried in the transaction"
            await ctx.complete(connection=pg, result=ctx.attempt)
            if ctx.attempt == 1:
                raise ValueError("failed before the commit: both roll back")
        return "the worker's outcome, never written"

    jobs = [await client.enqueue("charge", {"how": how}) for how in ("rollback", "retry")]
    session_job = await client.enqueue("charge", {"how": "session"})
    async with pgq.Worker(app, dsn, **SETTINGS):
        rolled, retried, via_session = [
            await client.wait(j, timeout=15) for j in (*jobs, session_job)
        ]
    # An attempt the worker handed back (a slow heartbeat on a busy machine) is not
    # counted and commits nothing: each job's effects are those of its committed attempts.
    assert rolled.state is pgq.JobState.COMPLETED and (rolled.result or 0) >= 2
    assert [e["kind"] for e in rolled.errors if e["kind"] != "shutdown"] == ["exception"]
    assert retried.state is pgq.JobState.COMPLETED and (retried.result or 0) >= 2
    assert [e["message"] for e in retried.errors if e["kind"] != "shutdown"] == ["not yet"]
    assert via_session.result == "via the session"
    rows = [tuple(r) for r in await effects.fetch("SELECT job_id, attempt FROM effects")]
    assert sorted(rows) == sorted(
        [(rolled.id, rolled.result), (retried.id, 1), (retried.id, retried.result),
         (via_session.id, via_session.attempt)]
    ), "exactly once each, the rolled-back attempt's effect gone"  # fmt: skip


async def test_psycopgs_errors_arrive_as_pgqs(
    client: pgq.Client, pg: psycopg.AsyncConnection[Any], conn: Conn
) -> None:
    await conn.execute("""
        CREATE FUNCTION refuse_boom() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.task = 'boom' THEN RAISE EXCEPTION 'no boom jobs'; END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER refuse_boom BEFORE INSERT ON pgq_jobs
            FOR EACH ROW EXECUTE FUNCTION refuse_boom();
    """)
    with pytest.raises(pgq.DatabaseError, match="no boom jobs") as info:
        await client.enqueue("boom", connection=pg)
    assert type(info.value) is pgq.DatabaseError and info.value.sqlstate == "P0001"
    assert isinstance(info.value.__cause__, psycopg.errors.RaiseException)
    await pg.rollback()
    await conn.execute("SELECT pg_terminate_backend($1)", pg.info.backend_pid)
    with pytest.raises(pgq.DatabaseUnavailable) as gone:
        await client.enqueue("t", connection=pg)
    assert isinstance(gone.value.__cause__, psycopg.OperationalError)


async def test_the_calls_that_run_on_asyncpg_alone_say_so_for_psycopg(
    client: pgq.Client, pg: psycopg.AsyncConnection[Any]
) -> None:
    job = await client.enqueue("t")
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "cancel_many": lambda: client.cancel_many([job.id], connection=pg),
        "retry": lambda: client.retry([job.id], connection=pg),
        "pause_queue": lambda: client.pause_queue("default", connection=pg),
        "get_job": lambda: client.get_job(job.id, connection=pg),
    }
    for name, call in calls.items():
        with pytest.raises(pgq.ConfigError, match=f"{name} takes connection= on asyncpg only"):
            await call()
