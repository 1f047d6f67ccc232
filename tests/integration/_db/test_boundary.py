"""Through the public calls, a user meets only pgq's errors: a closed client says so
(ClientClosed, still a ConfigError), and what the server or the driver raises arrives as
pgq's DatabaseError subtree with the driver's exception on ``__cause__``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg
import psycopg
import pytest

import pgq
from tests.tests_support import until

if TYPE_CHECKING:
    from tests.tests_support import Conn

pytestmark = pytest.mark.anyio

CALLS: dict[str, Callable[[pgq.Client], Awaitable[Any]]] = {
    "enqueue": lambda c: c.enqueue("t"),
    "enqueue_many": lambda c: c.enqueue_many([pgq.JobSpec("t")]),
    "get_job": lambda c: c.get_job(1),
    "cancel": lambda c: c.cancel(1),
    "list_jobs": lambda c: c.list_jobs(),
    "pause_queue": lambda c: c.pause_queue("default"),
    "stats": lambda c: c.stats(),
    "wait": lambda c: c.wait(1, timeout=5),
}


@pytest.mark.parametrize("call", list(CALLS))
async def test_a_closed_client_raises_client_closed(dsn: str, call: str) -> None:
    client = pgq.Client(dsn)
    with pytest.raises(pgq.ClientClosed, match="the client is not open"):
        await CALLS[call](client)  # never opened
    async with client:
        await client.enqueue("t")
    with pytest.raises(pgq.ClientClosed, match="the client is closed") as info:
        await CALLS[call](client)
    assert isinstance(info.value, pgq.ConfigError)  # as it was before ClientClosed
    async with client:  # opened again, it works again
        assert (await client.count_by_state())[pgq.JobState.AVAILABLE] == 1


async def test_a_closed_client_on_a_callers_pool_refuses_even_with_a_connection(
    dsn: str, conn: Conn
) -> None:
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
    try:
        async with pgq.Client(pool=pool) as client:
            pass
        with pytest.raises(pgq.ClientClosed):
            await client.enqueue("t", connection=conn)
        with pytest.raises(pgq.ClientClosed):
            await client.get_job(1)
    finally:
        await pool.close()


async def test_a_closed_sync_client_raises_client_closed(dsn: str) -> None:
    with pgq.SyncClient(dsn) as client:
        client.enqueue("t")
    with pytest.raises(pgq.ClientClosed, match="the client is closed"):
        client.enqueue("t")
    with pytest.raises(pgq.ClientClosed):
        client.enqueue_many([pgq.JobSpec("t")])
    with client:
        assert client.enqueue("t").id > 0


async def _refuse_boom(conn: Conn) -> None:
    await conn.execute("""
        CREATE FUNCTION refuse_boom() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.task = 'boom' THEN RAISE EXCEPTION 'no boom jobs'; END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER refuse_boom BEFORE INSERT ON pgq_jobs
            FOR EACH ROW EXECUTE FUNCTION refuse_boom();
    """)


async def _boom_in_a_transaction(client: pgq.Client, conn: Conn) -> None:
    async with conn.transaction():
        await client.enqueue("boom", connection=conn)


REFUSED: dict[str, Callable[[pgq.Client, Conn], Awaitable[Any]]] = {
    "enqueue": lambda client, _: client.enqueue("boom"),
    "enqueue_many": lambda client, _: client.enqueue_many([pgq.JobSpec("t"), pgq.JobSpec("boom")]),
    "connection": _boom_in_a_transaction,
}


@pytest.mark.parametrize("how", list(REFUSED))
async def test_a_statement_the_server_refuses_arrives_as_a_database_error(
    client: pgq.Client, conn: Conn, how: str
) -> None:
    await _refuse_boom(conn)
    with pytest.raises(pgq.DatabaseError, match="no boom jobs") as info:
        await REFUSED[how](client, conn)
    assert type(info.value) is pgq.DatabaseError
    assert isinstance(info.value.__cause__, asyncpg.RaiseError)
    assert info.value.sqlstate == "P0001"


async def test_a_sync_enqueue_the_server_refuses_arrives_as_a_database_error(
    dsn: str, conn: Conn
) -> None:
    await _refuse_boom(conn)
    with pgq.SyncClient(dsn) as client, pytest.raises(pgq.DatabaseError) as info:
        client.enqueue("boom")
    assert isinstance(info.value.__cause__, psycopg.errors.RaiseException)
    assert info.value.sqlstate == "P0001"


async def test_a_connection_ended_mid_call_arrives_as_database_unavailable(
    dsn: str, client: pgq.Client, conn: Conn
) -> None:
    """The server ends the call's connection while the call waits on a row lock
    (pg_terminate_backend, as an operator or a failover would)."""
    job = await client.enqueue("t")
    caller = await asyncpg.connect(dsn)
    pid = caller.get_server_pid()
    failures: list[BaseException] = []

    async def cancel() -> None:
        try:
            await client.cancel_many([job.id], connection=caller)
        except Exception as exc:
            failures.append(exc)

    async def waits_on_the_lock() -> bool:
        return bool(
            await conn.fetchval(
                "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", pid
            )
        )

    try:
        async with conn.transaction():
            await conn.execute("SELECT 1 FROM pgq_jobs WHERE id = $1 FOR UPDATE", job.id)
            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel)
                await until(waits_on_the_lock)
                await conn.execute("SELECT pg_terminate_backend($1)", pid)
    finally:
        caller.terminate()
    (failure,) = failures
    assert isinstance(failure, pgq.DatabaseUnavailable)
    assert isinstance(failure.__cause__, asyncpg.PostgresError | asyncpg.InterfaceError)
    assert "your connection (connection=) was lost" in str(failure)


async def _asyncpg_ended(dsn: str, client: pgq.Client, conn: Conn) -> None:
    caller = await asyncpg.connect(dsn)
    try:
        await caller.transaction().start()  # never ended: its connection is
        await caller.execute("INSERT INTO marks VALUES (1)")
        await conn.execute("SELECT pg_terminate_backend($1)", caller.get_server_pid())
        await client.enqueue("t", connection=caller)
    finally:
        caller.terminate()


async def _psycopg_ended(dsn: str, client: pgq.Client, conn: Conn) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as caller:
        await caller.execute("INSERT INTO marks VALUES (1)")
        await conn.execute("SELECT pg_terminate_backend($1)", caller.info.backend_pid)
        await client.enqueue("t", connection=caller)


async def _sync_ended(dsn: str, client: pgq.Client, conn: Conn) -> None:
    with pgq.SyncClient(dsn) as sync, psycopg.connect(dsn) as caller:
        caller.execute("INSERT INTO marks VALUES (1)")
        await conn.execute("SELECT pg_terminate_backend($1)", caller.info.backend_pid)
        sync.enqueue("t", connection=caller)


ENDED: dict[str, Callable[[str, pgq.Client, Conn], Awaitable[None]]] = {
    "asyncpg": _asyncpg_ended,
    "psycopg": _psycopg_ended,
    "sync": _sync_ended,
}


@pytest.mark.parametrize("driver", list(ENDED))
async def test_a_callers_connection_ended_mid_transaction_says_the_transaction_is_gone(
    dsn: str, client: pgq.Client, conn: Conn, driver: str
) -> None:
    """The server ends the caller's connection inside its transaction, before the enqueue:
    what is lost is the whole transaction, not the one call."""
    await conn.execute("CREATE TABLE marks (n int)")
    with pytest.raises(pgq.DatabaseUnavailable) as info:
        await ENDED[driver](dsn, client, conn)
    said = str(info.value)
    assert "your connection (connection=) was lost" in said
    assert "Its whole transaction is rolled back, not only this call's writes" in said
    assert "run the whole transaction again on a new connection" in said
    assert "may succeed once the server is back" not in said
    assert await conn.fetchval("SELECT count(*) FROM marks") == 0
    assert await conn.fetchval("SELECT count(*) FROM pgq_jobs") == 0


async def test_a_statement_cancelled_in_a_callers_transaction_says_to_roll_it_back(
    dsn: str, client: pgq.Client, conn: Conn
) -> None:
    """statement_timeout ends pgq's statement (waiting on a row lock), not the connection:
    the caller's transaction lives on, aborted, and is the caller's to roll back."""
    job = await client.enqueue("t")
    caller = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            await conn.execute("SELECT 1 FROM pgq_jobs WHERE id = $1 FOR UPDATE", job.id)
            tr = caller.transaction()
            await tr.start()
            await caller.execute("SET LOCAL statement_timeout = '100ms'")
            with pytest.raises(pgq.DatabaseUnavailable) as info:
                await client.cancel_many([job.id], connection=caller)
            await tr.rollback()
    finally:
        await caller.close()
    assert info.value.sqlstate == "57014"
    said = str(info.value)
    assert "your transaction (connection=) are undone: roll the transaction back" in said
    assert "was lost" not in said and "may succeed once the server is back" not in said


async def test_a_serialization_failure_arrives_as_a_transaction_conflict(
    dsn: str, client: pgq.Client
) -> None:
    job = await client.enqueue("t")
    caller = await asyncpg.connect(dsn)

    async def cancel_after_another_did() -> None:
        async with caller.transaction(isolation="repeatable_read"):
            await caller.fetchval("SELECT 1")  # the snapshot is taken
            await client.cancel(job.id)  # another transaction changes the row and commits
            await client.cancel_many([job.id], connection=caller)

    try:
        with pytest.raises(pgq.TransactionConflict, match="run the whole transaction") as info:
            await cancel_after_another_did()
    finally:
        await caller.close()
    assert isinstance(info.value.__cause__, asyncpg.SerializationError)
    assert info.value.sqlstate == "40001"


async def test_a_settle_in_an_aborted_transaction_arrives_as_a_database_error(
    dsn: str, client: pgq.Client
) -> None:
    """ctx.complete(connection=...) on a transaction an earlier statement aborted: the task
    meets pgq's DatabaseError, the driver's on its cause."""
    app = pgq.App()
    seen: list[BaseException] = []

    @app.task
    async def settles(ctx: pgq.JobContext) -> None:
        c = await asyncpg.connect(dsn)
        try:
            async with c.transaction():
                with pytest.raises(asyncpg.DivisionByZeroError):
                    await c.execute("SELECT 1 / 0")
                try:
                    await ctx.complete(connection=c)
                except pgq.PgqError as exc:
                    seen.append(exc)
                    raise
        finally:
            await c.close()

    job = await client.enqueue("settles")
    async with pgq.Worker(app, dsn, poll_interval=0.05):
        await until(lambda: _errored(client, job.id))
    (error,) = seen
    assert type(error) is pgq.DatabaseError and error.sqlstate == "25P02"
    assert isinstance(error.__cause__, asyncpg.InFailedSQLTransactionError)


async def _errored(client: pgq.Client, job_id: int) -> bool:
    job = await client.get_job(job_id)
    return job is not None and bool(job.errors)
