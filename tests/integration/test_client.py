from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

import pgq
from pgq._core.dsn import sqlalchemy_url
from pgq._db.connections import create_pool
from pgq._db.revision import SCHEMA_REVISION
from pgq.errors import ConfigError, SerializationError, UnknownTaskError
from tests.tests_support import job_notes, until

if TYPE_CHECKING:
    from tests.tests_support import Conn

pytestmark = pytest.mark.anyio


async def test_enqueue_returns_the_stored_job(client: pgq.Client) -> None:
    job = await client.enqueue(
        "send",
        {"to": "a@b.c"},
        queue="emails",
        priority=5,
        max_attempts=3,
        tags=["t1", "t2"],
        metadata={"trace": "x"},
    )
    assert job.id > 0
    assert job.state is pgq.JobState.AVAILABLE
    stored = await client.get_job(job.id)
    assert stored is not None
    assert (stored.queue, stored.task, stored.args) == ("emails", "send", {"to": "a@b.c"})
    assert (stored.priority, stored.max_attempts, stored.attempt) == (5, 3, 0)
    assert (await client.enqueue("send")).max_attempts is None, "left to the task"
    assert stored.tags == ["t1", "t2"]
    assert stored.metadata == {"trace": "x"}
    assert stored.errors == [] and stored.result is None
    # Never attempted, not finished: no dates for them (not the lowest date a read allows).
    assert stored.attempted_at is None and stored.finalized_at is None
    assert stored.created_at is not None and stored.scheduled_at is not None


async def test_delay_and_run_at_schedule_the_job(client: pgq.Client) -> None:
    delayed = await client.enqueue("t", delay=60)
    assert delayed.state is pgq.JobState.SCHEDULED
    assert delayed.scheduled_at is not None and delayed.created_at is not None
    assert delayed.scheduled_at - delayed.created_at >= timedelta(seconds=59)
    at = datetime.now(UTC) + timedelta(hours=1)
    later = await client.enqueue("t", run_at=at)
    assert later.state is pgq.JobState.SCHEDULED and later.scheduled_at == at
    past = await client.enqueue("t", run_at=datetime.now(UTC) - timedelta(hours=1))
    assert past.state is pgq.JobState.AVAILABLE


async def test_enqueue_many_inserts_thousands_in_order(client: pgq.Client) -> None:
    specs = [pgq.JobSpec("t", {"i": i}, queue="bulk", priority=i % 3) for i in range(5000)]
    jobs = await client.enqueue_many(specs)
    assert [j.args["i"] for j in jobs] == list(range(5000))
    assert len({j.id for j in jobs}) == 5000
    for job in (jobs[0], jobs[2500], jobs[-1]):
        stored = await client.get_job(job.id)
        assert stored is not None and stored.args == job.args and stored.priority == job.priority
    assert (await client.count_by_state("bulk"))[pgq.JobState.AVAILABLE] == 5000


async def test_bulk_enqueue_of_every_kind_of_job_matches_what_is_stored(
    client: pgq.Client,
) -> None:
    """A batch that schedules, tags and labels jobs: what enqueue_many returns is the row."""
    at = datetime.now(UTC) + timedelta(hours=1)
    specs = [
        pgq.JobSpec("t", {"i": 0}, queue="mixed"),
        pgq.JobSpec("t", {"i": 1}, queue="mixed", delay=60),
        pgq.JobSpec("t", {"i": 2}, queue="mixed", run_at=at),
        pgq.JobSpec("t", {"i": 3}, queue="mixed", run_at=datetime.now(UTC) - timedelta(hours=1)),
        pgq.JobSpec("t", {"i": 4}, queue="other", tags=["a", "b"], metadata={"m": [1]}),
        pgq.JobSpec("u", {"i": 5}, priority=-3, max_attempts=2, delay=0),
    ]
    jobs = await client.enqueue_many(specs)
    states = [j.state for j in jobs]
    A, S = pgq.JobState.AVAILABLE, pgq.JobState.SCHEDULED
    assert states == [A, S, S, A, A, A]
    assert jobs[2].scheduled_at == at
    assert jobs[0].scheduled_at == jobs[0].created_at
    assert jobs[1].created_at is not None
    assert jobs[1].scheduled_at == jobs[1].created_at + timedelta(seconds=60)
    assert [j.id for j in jobs] == sorted(j.id for j in jobs)
    for job in jobs:
        stored = await client.get_job(job.id)
        assert stored is not None
        fields = ("queue", "task", "args", "state", "priority", "max_attempts")
        assert [getattr(stored, f) for f in fields] == [getattr(job, f) for f in fields]
        assert (stored.scheduled_at, stored.created_at) == (job.scheduled_at, job.created_at)
        assert (stored.tags, stored.metadata) == (job.tags, job.metadata)
    assert jobs[4].tags == ["a", "b"] and jobs[4].metadata == {"m": [1]}


async def test_bulk_enqueue_wakes_only_queues_with_a_job_due_now_once_committed(
    client: pgq.Client, dsn: str
) -> None:
    async with job_notes(dsn) as notes:
        past = datetime.now(UTC) - timedelta(minutes=1)
        specs = [pgq.JobSpec("t", queue="now")] * 50 + [
            pgq.JobSpec("t", queue="later", delay=600),
            pgq.JobSpec("t", queue="later", run_at=datetime.now(UTC) + timedelta(hours=1)),
            pgq.JobSpec("t", queue="past", run_at=past + timedelta(hours=2)),
            pgq.JobSpec("t", queue="past", run_at=past),
        ]
        await client.enqueue_many(specs)
        assert sorted(await notes.received()) == ["now", "past"]


# A rule of the user's own that Postgres enforces on row 51 of 100: as the row is written,
# or only at commit (enqueue_many builds the jobs it returns while the COPY's commit is under
# way: a commit that fails must still raise, with nothing written and no one woken).
REFUSE_BOOM = """
    CREATE FUNCTION refuse_boom() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF NEW.task = 'boom' THEN RAISE EXCEPTION 'no boom jobs'; END IF;
        RETURN NEW;
    END $$;
"""
REFUSE_WHEN = {
    "row": "CREATE TRIGGER refuse_boom BEFORE INSERT ON pgq_jobs",
    "commit": "CREATE CONSTRAINT TRIGGER refuse_boom AFTER INSERT ON pgq_jobs"
    " DEFERRABLE INITIALLY DEFERRED",
}


@pytest.mark.parametrize("when", list(REFUSE_WHEN))
async def test_a_bulk_enqueue_the_server_refuses_writes_nothing_and_wakes_no_one(
    client: pgq.Client, dsn: str, when: str
) -> None:
    async with job_notes(dsn) as notes:
        await notes.conn.execute(
            REFUSE_BOOM + REFUSE_WHEN[when] + " FOR EACH ROW EXECUTE FUNCTION refuse_boom()"
        )
        specs = [pgq.JobSpec("t", {"i": i}, queue="refused") for i in range(100)]
        specs[50] = pgq.JobSpec("boom", queue="refused")
        with pytest.raises(pgq.DatabaseError, match="no boom jobs") as info:
            await client.enqueue_many(specs)
        assert isinstance(info.value.__cause__, asyncpg.RaiseError)
        assert sum((await client.count_by_state()).values()) == 0
        jobs = await client.enqueue_many([pgq.JobSpec("t", queue="after")] * 2)
        assert [j.state for j in jobs] == [pgq.JobState.AVAILABLE] * 2
        assert await notes.received() == ["after"]
        assert sum((await client.count_by_state()).values()) == 2


SLOW_COMMIT = """
    CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF NEW.task = 'slow' THEN PERFORM pg_sleep(60); END IF;
        RETURN NULL;
    END $$;
    CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON pgq_jobs
        DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit();
"""


async def _sleeping_backends(conn: Conn) -> int:
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event = 'PgSleep'"
        )
    )


async def test_a_bulk_enqueue_cancelled_in_its_commit_writes_nothing_and_its_pool_goes_on(
    client: pgq.Client, conn: Conn
) -> None:
    # A commit held up at the server (a deferred trigger of the user's that sleeps); the
    # caller gives up while it waits. The cancellation reaches the commit, as it did when
    # enqueue_many awaited the commit itself: nothing is written, and the pool still works.
    await conn.execute(SLOW_COMMIT)
    specs = [pgq.JobSpec("t", {"i": i}) for i in range(100)] + [pgq.JobSpec("slow")]
    returned = False
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:

            async def enqueue(scope: anyio.CancelScope) -> None:
                nonlocal returned
                with scope:
                    await client.enqueue_many(specs)
                    returned = True

            scope = anyio.CancelScope()
            tg.start_soon(enqueue, scope)
            await until(lambda: _equals(_sleeping_backends(conn), 1))
            scope.cancel()
    assert not returned and scope.cancelled_caught
    await until(lambda: _equals(_sleeping_backends(conn), 0))  # the server stopped waiting
    assert sum((await client.count_by_state()).values()) == 0
    await conn.execute("DROP TRIGGER slow_commit ON pgq_jobs")
    jobs = await client.enqueue_many([pgq.JobSpec("t")] * 3)
    assert len({j.id for j in jobs}) == 3
    assert sum((await client.count_by_state()).values()) == 3


async def test_a_stop_before_the_commit_is_awaited_still_reaches_it(
    client: pgq.Client, conn: Conn, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A one-shot cancel (a deadline, a sibling task's failure) can land at the step between
    # sending the COMMIT and awaiting it, where the jobs are built: raised there, it must
    # still stop the commit, promptly, not wait out a slow one and then report it.
    # It is raised once the server runs the COMMIT: a cancel request that reaches a backend
    # which has not yet read its command is dropped by PostgreSQL (the docstring's "may have
    # written it"), and on a busy machine the backend can be that late.
    await conn.execute(SLOW_COMMIT)
    from pgq._db import enqueue

    def stopped_while_building(*args: object) -> list[pgq.Job[object]]:
        _block_until_sleeping(dsn)  # also shows the COMMIT was sent before the jobs are built
        raise asyncio.CancelledError

    monkeypatch.setattr(enqueue, "copied_jobs", stopped_while_building)
    specs = [pgq.JobSpec("t", {"i": i}) for i in range(100)] + [pgq.JobSpec("slow")]
    with anyio.fail_after(20):  # the slow commit alone would take 60 s
        with pytest.raises(asyncio.CancelledError):
            await client.enqueue_many(specs)
        await until(lambda: _equals(_sleeping_backends(conn), 0))
    assert sum((await client.count_by_state()).values()) == 0
    monkeypatch.undo()
    await conn.execute("DROP TRIGGER slow_commit ON pgq_jobs")
    assert len(await client.enqueue_many([pgq.JobSpec("t")] * 2)) == 2


SLOWISH_COMMIT = SLOW_COMMIT.replace("pg_sleep(60)", "pg_sleep(1)")


async def test_a_bulk_enqueue_whose_jobs_cannot_be_built_says_its_commit_landed(
    client: pgq.Client, conn: Conn, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The jobs are built while the COMMIT is under way; a build that fails (here, out of
    # memory while the server still runs the commit) used to cancel the commit and raise,
    # though the COMMIT may have landed: a caller retrying the batch would enqueue it twice.
    await conn.execute(SLOWISH_COMMIT)
    from pgq._db import enqueue

    def out_of_memory(*args: object) -> list[pgq.Job[object]]:
        _block_until_sleeping(dsn)  # the commit is under way
        raise MemoryError("no room for 101 jobs")

    monkeypatch.setattr(enqueue, "copied_jobs", out_of_memory)
    specs = [pgq.JobSpec("t", {"i": i}) for i in range(100)] + [pgq.JobSpec("slow")]
    with anyio.fail_after(20), pytest.raises(pgq.PgqError) as info:
        await client.enqueue_many(specs)
    assert re.fullmatch(
        r"the 101 jobs of this batch \(ids \d+ to \d+, in order\) were enqueued \(their "
        r"transaction committed\), but the jobs to return could not be made \(MemoryError: "
        r"no room for 101 jobs\): do not enqueue them again; read them with get_job or "
        r"list_jobs",
        str(info.value),
    ), str(info.value)
    assert isinstance(info.value.__cause__, MemoryError)
    assert await conn.fetchval("SELECT count(*) FROM pgq_jobs") == 101


async def test_a_bulk_enqueue_whose_build_and_commit_fail_says_nothing_was_written(
    client: pgq.Client, conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The commit refused (a deferred rule of the user's) while the build failed: the
    # commit's error is the caller's, as nothing was written; the build's is its context.
    await conn.execute(
        REFUSE_BOOM + REFUSE_WHEN["commit"] + " FOR EACH ROW EXECUTE FUNCTION refuse_boom()"
    )
    from pgq._db import enqueue

    def out_of_memory(*args: object) -> list[pgq.Job[object]]:
        raise MemoryError("no room")

    monkeypatch.setattr(enqueue, "copied_jobs", out_of_memory)
    specs = [pgq.JobSpec("t", {"i": i}) for i in range(100)] + [pgq.JobSpec("boom")]
    with pytest.raises(pgq.DatabaseError, match="no boom jobs") as info:
        await client.enqueue_many(specs)
    assert isinstance(info.value.__cause__, asyncpg.RaiseError)
    assert isinstance(info.value.__cause__.__context__, MemoryError)
    assert await conn.fetchval("SELECT count(*) FROM pgq_jobs") == 0


async def _equals(value: Awaitable[int], expected: int) -> bool:
    return await value == expected


def _block_until_sleeping(dsn: str) -> None:
    """Block the calling thread (and its event loop) until one backend sleeps in the slow
    commit, polling from a thread of its own with a connection of its own."""

    async def poll() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await until(lambda: _equals(_sleeping_backends(conn), 1))
        finally:
            await conn.close()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, poll()).result()


def _two_queues_app() -> tuple[pgq.App, pgq.Task[..., None], pgq.Task[..., None]]:
    """Tasks ``a`` (queue ``qa``) and ``b`` (queue ``qb``), each taking ``i``."""
    app = pgq.App()

    @app.task(queue="qa")
    async def a(ctx: pgq.JobContext, i: int) -> None: ...

    @app.task(queue="qb")
    async def b(ctx: pgq.JobContext, i: int) -> None: ...

    return app, a, b


async def test_a_batch_of_task_specs_is_written_as_returned_and_wakes_its_queues_once(
    client: pgq.Client, dsn: str
) -> None:
    """The commonest batch: specs of registered tasks that set no option, written by COPY.
    What it returns is what it stored, in order, and each task's queue is woken once,
    after the commit."""
    _, a, b = _two_queues_app()
    specs = [(a if i % 2 else b).spec(i=i) for i in range(1200)]
    async with job_notes(dsn) as notes:
        jobs = await client.enqueue_many(specs)
        assert sorted(await notes.received()) == ["qa", "qb"]
    assert [j.args for j in jobs] == [{"i": i} for i in range(1200)]
    assert [j.id for j in jobs] == sorted({j.id for j in jobs})
    rows = await client.pool.fetch(
        "SELECT id, queue, task, args::text, state::text, priority, max_attempts,"
        " scheduled_at, created_at FROM pgq_jobs ORDER BY id"
    )
    assert [
        (r["id"], r["queue"], r["task"], json.loads(r["args"]), r["state"], r["priority"],
         r["max_attempts"], r["scheduled_at"], r["created_at"])
        for r in rows
    ] == [
        (j.id, j.queue, j.task, j.args, j.state.value, j.priority, j.max_attempts,
         j.scheduled_at, j.created_at)
        for j in jobs
    ]  # fmt: skip
    assert {j.queue for j in jobs[::2]} == {"qb"} and {j.queue for j in jobs[1::2]} == {"qa"}


@pytest.mark.parametrize("bad", ["arguments", "types", "unserializable"])
async def test_a_bad_spec_late_in_a_batch_of_task_specs_writes_nothing_and_wakes_no_one(
    client: pgq.Client, conn: Conn, dsn: str, bad: str
) -> None:
    """Job 700 of 1,000 fails to prepare after the batch's transaction has begun and its
    ids were drawn: it raises naming the job, nothing is written, no one is woken, and no
    connection is left in the transaction."""
    app, a, _ = _two_queues_app()
    specs = [a.spec(i=i) for i in range(1000)]
    error: type[Exception] = ConfigError
    if bad == "arguments":
        specs[700] = pgq.JobSpec(a, {"x": 1})
        match = "job 700: task 'a' takes no argument x"
    elif bad == "types":
        specs[700] = pgq.JobSpec(a, {"i": "7"})
        match = "job 700: task 'a': argument i must be int, got str '7'; nothing was enqueued"
    else:

        @app.task(queue="qa")
        async def untyped(ctx: pgq.JobContext, i: object) -> None: ...

        specs[700] = pgq.JobSpec(untyped, {"i": datetime.now()})
        error, match = SerializationError, "job 700: .*is of type datetime"
    async with job_notes(dsn) as notes:
        with pytest.raises(error, match=match):
            await client.enqueue_many(specs)
        assert await notes.received() == []
    assert sum((await client.count_by_state()).values()) == 0
    assert await _in_a_transaction(conn) == 0
    assert len(await client.enqueue_many(specs[:2])) == 2


async def test_a_bad_batch_of_task_specs_says_so_without_waiting_for_a_connection(
    dsn: str,
) -> None:
    """A batch that fails to prepare does not wait for a connection first: with the
    pool's only connection taken, it raises at once, and the pool is whole after."""
    _, a, _ = _two_queues_app()
    pool = await create_pool(dsn, min_size=1, max_size=1)
    try:
        async with pgq.Client(pool=pool) as client, pool.acquire():
            with anyio.fail_after(10), pytest.raises(ConfigError, match="job 1: "):
                await client.enqueue_many([a.spec(i=0), pgq.JobSpec(a, {"x": 1})])
        async with pgq.Client(pool=pool) as client:
            assert len(await client.enqueue_many([a.spec(i=0), a.spec(i=1)])) == 2
    finally:
        await pool.close()


async def test_a_batch_of_task_specs_is_what_the_specs_were_when_it_was_given(
    client: pgq.Client,
) -> None:
    """The specs are read as the call begins: a spec changed while the batch is still
    being written changes nothing."""
    _, a, b = _two_queues_app()
    specs = [a.spec(i=i) for i in range(1000)]
    returned: list[pgq.Job[Any]] = []
    async with anyio.create_task_group() as tg:

        async def enqueue() -> None:
            returned.extend(await client.enqueue_many(specs))

        tg.start_soon(enqueue)
        await anyio.lowlevel.checkpoint()
        await anyio.lowlevel.checkpoint()
        assert not returned, "changed while the batch was still being written"
        specs[900].task = b
        specs[901].args = {"i": -1}
    stored = [await client.get_job(j.id) for j in returned[900:902]]
    assert [(j.task, j.queue, j.args) for j in stored if j is not None] == [
        ("a", "qa", {"i": 900}),
        ("a", "qa", {"i": 901}),
    ]


async def test_a_batch_of_task_specs_cancelled_at_any_point_writes_all_of_it_or_none(
    client: pgq.Client, conn: Conn
) -> None:
    """Cancelled at every point from its first step to after its end (deadlines spread
    over twice the time one batch takes, then generous ones): each batch is written
    whole or not at all, and the pool goes on."""
    _, a, _ = _two_queues_app()
    specs = [a.spec(i=i) for i in range(1000)]
    started = anyio.current_time()
    await client.enqueue_many(specs)
    took = anyio.current_time() - started
    outcomes = {"written": 0, "cut": 0}
    for k in range(45):
        deadline = took * 2 * k / 40 if k < 40 else took * 10 + 1.0
        with anyio.move_on_after(deadline) as scope:
            await client.enqueue_many(specs)
        outcomes["cut" if scope.cancelled_caught else "written"] += 1
        assert sum((await client.count_by_state()).values()) % 1000 == 0
    assert outcomes["cut"] >= 1 and outcomes["written"] >= 5
    await until(lambda: _equals(_in_a_transaction(conn), 0))
    assert len(await client.enqueue_many(specs[:3])) == 3


async def _in_a_transaction(conn: Conn) -> int:
    """Connections of the test's database, other than ``conn``, inside a transaction."""
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%'"
        )
    )


async def test_unserializable_args_raise_before_anything_is_written(client: pgq.Client) -> None:
    specs = [pgq.JobSpec("t", {"i": 1}), pgq.JobSpec("t", {"when": {"at": datetime.now()}})]
    with pytest.raises(
        SerializationError, match=r"args\['when'\]\['at'\] is of type datetime"
    ) as info:
        await client.enqueue_many(specs)
    assert info.value.path == "args['when']['at']"
    assert sum((await client.count_by_state()).values()) == 0


@pytest.mark.parametrize(
    ("args", "path", "key"),
    [
        ({"x": {1: "a", "1": "b"}}, "args['x']", "1"),
        ({"x": [{"ok": {True: 1}}]}, "args['x'][0]['ok']", "True"),
        ({"x": {None: 1}}, "args['x']", "None"),
    ],
)
@pytest.mark.parametrize("unique", [False, True])
async def test_args_whose_nested_keys_are_not_strings_are_refused(
    client: pgq.Client, args: dict[str, Any], path: str, key: str, unique: bool
) -> None:
    """JSON would turn such a key into text ({1: "a", "1": "b"} into one key): refused,
    naming where, instead of stored changed; and with unique=True too, whose key is derived
    from the arguments only once they are checked."""
    with pytest.raises(SerializationError, match=f"has the key {key}, of type") as info:
        await client.enqueue("t", args, unique=unique)
    assert info.value.path == path
    with pytest.raises(SerializationError, match="has the key 1, of type int"):
        await client.enqueue("t", metadata={"m": {1: 2}})
    assert sum((await client.count_by_state()).values()) == 0


async def test_unique_args_that_are_not_json_raise_the_serialization_error(
    client: pgq.Client,
) -> None:
    with pytest.raises(SerializationError, match=r"args\['x'\] is of type set"):
        await client.enqueue("t", {"x": {1}}, unique=True)
    assert sum((await client.count_by_state()).values()) == 0


async def test_args_must_be_a_mapping(client: pgq.Client) -> None:
    with pytest.raises(SerializationError, match="args must be a mapping"):
        await client.enqueue("t", [1, 2])  # type: ignore[call-overload]


@pytest.mark.parametrize("queue", ["has space", "semi;colon", "", "a" * 200, "drop'--"])
async def test_odd_queue_names_are_refused(client: pgq.Client, queue: str) -> None:
    with pytest.raises(ConfigError, match="invalid queue name"):
        await client.enqueue("t", queue=queue)
    assert sum((await client.count_by_state()).values()) == 0


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("priority", 2**31, "priority must be an integer from -2147483648 to 2147483647"),
        ("priority", "5", "priority must be an integer"),
        ("max_attempts", 0, "max_attempts must be an integer from 1 to 2147483647"),
        ("max_attempts", 2**40, "max_attempts must be an integer from 1"),
    ],
)
async def test_out_of_range_options_are_refused_before_anything_is_written(
    client: pgq.Client, option: str, value: object, message: str
) -> None:
    specs = [pgq.JobSpec("t", {"i": i}) for i in range(10)]
    specs.append(pgq.JobSpec("t", **{option: value}))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=f"job 10: {message}"):
        await client.enqueue_many(specs)
    assert sum((await client.count_by_state()).values()) == 0


async def test_client_with_an_app_checks_task_names_and_applies_defaults(dsn: str) -> None:
    app = pgq.App()

    @app.task(queue="emails", max_attempts=4, priority=2)
    async def send(ctx: pgq.JobContext) -> None: ...

    async with pgq.Client(dsn, app=app) as client:
        job = await client.enqueue("send")
        assert (job.queue, job.max_attempts, job.priority) == ("emails", 4, 2)
        assert (await client.enqueue(send, queue="other")).queue == "other"
        with pytest.raises(UnknownTaskError, match="unknown task 'sedn'"):
            await client.enqueue("sedn")


async def test_rolled_back_asyncpg_transaction_leaves_no_job_and_no_notification(
    client: pgq.Client, dsn: str
) -> None:
    async with job_notes(dsn) as notes:
        async with client.pool.acquire() as conn:
            tx = conn.transaction()
            await tx.start()
            job = await client.enqueue("t", queue="txq", connection=conn)
            await tx.rollback()
        assert await client.get_job(job.id) is None
        async with client.pool.acquire() as conn, conn.transaction():
            await client.enqueue("t", queue="committed", connection=conn)
        assert await notes.received() == ["committed"]


async def test_notification_is_sent_on_commit_not_before(client: pgq.Client, dsn: str) -> None:
    got = anyio.Event()
    listener = await asyncpg.connect(dsn)
    await listener.add_listener("pgq_jobs", lambda *a: got.set())
    try:
        async with client.pool.acquire() as conn:
            async with conn.transaction():
                await client.enqueue("t", connection=conn)
                # Let the listener read anything the server might have sent.
                await listener.execute("SELECT 1")
                assert not got.is_set()
            with anyio.fail_after(5):
                await got.wait()
    finally:
        await listener.close()


async def test_sqlalchemy_session_commits_and_rolls_back_with_the_job(
    client: pgq.Client, dsn: str
) -> None:
    engine = create_async_engine(sqlalchemy_url(dsn))
    try:
        async with AsyncSession(engine) as session:
            rolled = await client.enqueue("t", {"n": 1}, connection=session)
            await session.rollback()
        async with AsyncSession(engine) as session, session.begin():
            kept = await client.enqueue("t", {"n": 2}, connection=session)
        async with engine.connect() as sa_conn:
            conn_job = await client.enqueue("t", {"n": 3}, connection=sa_conn)
            await sa_conn.rollback()
        async with engine.begin() as sa_conn:
            conn_kept = await client.enqueue("t", {"n": 4}, connection=sa_conn)
    finally:
        await engine.dispose()
    assert await client.get_job(rolled.id) is None
    assert await client.get_job(conn_job.id) is None
    assert (await client.get_job(kept.id)) is not None
    assert (await client.get_job(conn_kept.id)) is not None


async def test_connection_of_another_kind_is_refused(client: pgq.Client) -> None:
    with pytest.raises(ConfigError, match="connection= takes an asyncpg connection"):
        await client.enqueue("t", connection=object())  # type: ignore[call-overload]


async def test_unmigrated_database_is_named_with_the_fix(empty_dsn: str) -> None:
    with pytest.raises(
        pgq.SchemaMismatch,
        match=rf"schema at revision none .* this pgq needs {SCHEMA_REVISION}: run `pgq migrate`",
    ):
        async with pgq.Client(empty_dsn):
            pass


async def test_older_schema_revision_is_named(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    # As before pgq_0008, when a schema recorded no oldest code revision it serves.
    await conn.execute(
        "UPDATE pgq_alembic_version SET version_num = '0000'; DROP TABLE pgq_schema_compat"
    )
    await conn.close()
    with pytest.raises(
        pgq.SchemaMismatch, match=f"schema at revision 0000, this pgq needs {SCHEMA_REVISION}"
    ):
        async with pgq.Client(dsn):
            pass


async def test_server_that_does_not_answer_gives_a_masked_error() -> None:
    with pytest.raises(
        pgq.DatabaseUnavailable,
        match=r"cannot connect to PostgreSQL at postgresql://u:\*\*\*@127.0.0.1:9/db",
    ) as info:
        async with pgq.Client("postgresql://u:hunter2@127.0.0.1:9/db"):
            pass
    assert "hunter2" not in str(info.value)
    assert info.value.__cause__ is not None


async def test_a_newer_pgq_revision_asks_for_a_newer_pgq_not_a_migration(dsn: str) -> None:
    """A database a newer release migrated (a revision this pgq does not ship): the client
    and `pgq migrate` both say to run the newer pgq, rather than advise `pgq migrate`,
    which cannot go back from a revision it does not have."""
    from pgq import migrate

    conn = await asyncpg.connect(dsn)
    await conn.execute(
        "UPDATE pgq_alembic_version SET version_num = 'pgq_9999';"
        "UPDATE pgq_schema_compat SET min_code_revision = 'pgq_9999'"  # no longer serves us
    )
    await conn.close()
    advice = "run a pgq release that ships revision pgq_9999 or later"
    with pytest.raises(pgq.SchemaMismatch, match="schema at revision pgq_9999") as info:
        async with pgq.Client(dsn):
            pass
    assert advice in str(info.value) and "run `pgq migrate`" not in str(info.value)
    with pytest.raises(pgq.SchemaMismatch, match=advice):
        await migrate.upgrade_async(dsn)


async def test_an_older_pgq_revision_asks_for_a_migration(dsn: str) -> None:
    """A database migrated by the previous release (0001) is told to run `pgq migrate`."""
    from pgq import migrate

    await anyio.to_thread.run_sync(migrate.downgrade, dsn, "pgq_0001")
    with pytest.raises(
        pgq.SchemaMismatch, match=f"schema at revision pgq_0001, this pgq needs {SCHEMA_REVISION}"
    ):
        async with pgq.Client(dsn):
            pass
    await migrate.upgrade_async(dsn)
    async with pgq.Client(dsn) as client:
        assert (await client.enqueue("t")).id > 0


@pytest.mark.parametrize(
    "delay", [1e12, float("inf"), float("nan"), float("-inf"), timedelta(days=3_000_000)]
)
async def test_a_delay_out_of_range_is_refused_before_anything_is_written(
    client: pgq.Client, delay: float | timedelta
) -> None:
    with pytest.raises(ConfigError, match=r"delay=.* for task 'send' .*nothing was enqueued"):
        await client.enqueue("send", delay=delay)
    specs = [pgq.JobSpec("t"), pgq.JobSpec("send", delay=delay)]
    with pytest.raises(ConfigError, match="job 1: delay="):
        await client.enqueue_many(specs)
    assert sum((await client.count_by_state()).values()) == 0


@pytest.mark.parametrize(
    "period", [float("nan"), float("inf"), float("-inf"), -60, 0, 1e-300, 1e12, "60", True]
)
async def test_a_unique_period_out_of_range_is_refused_naming_it(
    client: pgq.Client, period: object
) -> None:
    with pytest.raises(ConfigError, match=r"^unique_period must be a number of seconds .*got"):
        await client.enqueue("send", unique=True, unique_period=period)  # type: ignore[call-overload]
    specs = [pgq.JobSpec("t"), pgq.JobSpec("send", unique=True, unique_period=period)]  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="job 1: unique_period must be"):
        await client.enqueue_many(specs)
    assert sum((await client.count_by_state()).values()) == 0


async def test_a_unique_period_may_be_a_timedelta(client: pgq.Client) -> None:
    job = await client.enqueue("send", unique=True, unique_period=3600)
    again = await client.enqueue("send", unique=True, unique_period=timedelta(hours=1))
    assert again.duplicate and again.id == job.id


async def test_a_run_at_out_of_range_is_refused(client: pgq.Client) -> None:
    # 23:00 on the last day Python knows, five hours west of UTC: the year 10000 in UTC.
    late = datetime(9999, 12, 31, 23, 0, tzinfo=timezone(timedelta(hours=-5)))
    with pytest.raises(ConfigError, match=r"run_at=9999-12-31T23:00:00-05:00 for task 'send'"):
        await client.enqueue("send", run_at=late)
    with pytest.raises(ConfigError, match="must be timezone-aware"):
        await client.enqueue("send", run_at=datetime(2030, 1, 1))
    assert sum((await client.count_by_state()).values()) == 0
    far = await client.enqueue("send", run_at=datetime(9000, 1, 1, tzinfo=UTC))
    assert far.state is pgq.JobState.SCHEDULED


async def test_a_negative_delay_means_now(client: pgq.Client) -> None:
    job = await client.enqueue("send", delay=-30)
    assert job.state is pgq.JobState.AVAILABLE
    (bulk,) = await client.enqueue_many([pgq.JobSpec("send", delay=timedelta(seconds=-1))])
    assert bulk.state is pgq.JobState.AVAILABLE


async def test_reads_survive_any_date_postgres_holds(client: pgq.Client, conn: Conn) -> None:
    # Rows Python cannot represent as they are: past the year 9999, before the year 1.
    ids = [
        await conn.fetchval(
            "INSERT INTO pgq_jobs (task, state, scheduled_at, created_at)"
            " VALUES ('t', 'scheduled', $1::text::timestamptz, $2::text::timestamptz)"
            " RETURNING id",
            scheduled,
            created,
        )
        for scheduled, created in (
            ("33715-06-01 00:00:00+00", "4000-01-01 00:00:00+00 BC"),
            ("infinity", "-infinity"),
        )
    ]
    listed = await client.list_jobs()
    assert {j.id for j in listed} == set(ids)
    for job_id in ids:
        job = await client.get_job(job_id)
        assert job is not None and job.scheduled_at is not None and job.created_at is not None
        assert job.scheduled_at.year == 9999 and job.created_at.year == 1


async def test_args_the_database_refuses_for_size_raise_a_serialization_error(
    client: pgq.Client, conn: Conn
) -> None:
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
    with pytest.raises(
        SerializationError, match=r"args of task 'send' are 15 bytes of JSON"
    ) as info:
        await client.enqueue("send", {"big": [1, 2, 3]})
    assert isinstance(info.value.__cause__, asyncpg.ProgramLimitExceededError)
    assert sum((await client.count_by_state()).values()) == 0


def typed_app() -> pgq.App:
    app = pgq.App()

    @app.task(queue="emails")
    async def send_welcome(ctx: pgq.JobContext, to: str, retries: int = 0) -> str:
        return to

    return app


async def test_arguments_are_checked_wherever_the_task_is_known(dsn: str) -> None:
    app = typed_app()
    task = app.get("send_welcome")
    async with pgq.Client(dsn, app=app) as client:
        with pytest.raises(
            ConfigError,
            match=r"takes no argument signupid \(its parameters: retries, to\); nothing was enqueued",
        ):
            await client.enqueue("send_welcome", {"signupid": 1})
        with pytest.raises(ConfigError, match="missing its required argument to"):
            await client.enqueue(task, {"retries": 1})
        with pytest.raises(ConfigError, match="job 1: task 'send_welcome' takes no argument x"):
            await client.enqueue_many([task.spec(to="a"), pgq.JobSpec(task, {"x": 1})])
        with pytest.raises(ConfigError, match="takes no argument signupid"):
            task.spec(signupid=1)
        assert sum((await client.count_by_state()).values()) == 0
        job = await client.enqueue(task.spec("ada@example.com", retries=2), delay=30)
        assert job.args == {"to": "ada@example.com", "retries": 2}
        assert job.queue == "emails" and job.state is pgq.JobState.SCHEDULED
    async with pgq.Client(dsn) as client:  # no App: any valid name, arguments unchecked
        assert (await client.enqueue("send_welcome", {"signupid": 1})).id > 0


def test_a_task_whose_parameters_could_never_be_given_is_refused() -> None:
    app = pgq.App()
    with pytest.raises(ConfigError, match="positional-only or \\*args"):

        @app.task
        async def positional(ctx: pgq.JobContext, a: int, /) -> None: ...

    with pytest.raises(ConfigError, match="first parameter receives the JobContext"):

        @app.task  # type: ignore[arg-type]
        async def no_context() -> None: ...


async def test_wait_survives_the_loss_of_its_listen_connection(
    client: pgq.Client, conn: asyncpg.Connection[asyncpg.Record]
) -> None:
    job = await client.enqueue("email", {"to": "a@example.com"})
    result: list[pgq.Job] = []

    async def waiting() -> None:
        result.append(await client.wait(job.id, timeout=30))

    async def listening_pid() -> int | None:
        pid: int | None = await conn.fetchval(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND query LIKE 'LISTEN%' AND pid <> pg_backend_pid()"
        )
        return pid

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiting)
        with anyio.fail_after(10):
            while (pid := await listening_pid()) is None:  # noqa: ASYNC110 - another session
                await anyio.sleep(0.02)
        await conn.execute("SELECT pg_terminate_backend($1)", pid)
        with anyio.fail_after(10):  # the waiter listens again on a new connection
            while await listening_pid() in (None, pid):  # noqa: ASYNC110 - another session
                await anyio.sleep(0.02)
        await client.cancel(job.id)
    assert result[0].state == pgq.JobState.CANCELLED
    await client.close()  # no error from the connection that was lost


async def test_a_wait_under_way_when_its_client_closes_raises_config_error(dsn: str) -> None:
    """A client that opened its own pool is closed while a wait is under way: the wait
    ends at once with a ConfigError that says why, not a pool's error nor a hang."""
    client = pgq.Client(dsn)
    await client.open()
    job = await client.enqueue("email", {"to": "a@example.com"})
    failures: list[BaseException] = []

    async def waiting() -> None:
        try:
            await client.wait(job.id, timeout=60)
        except ConfigError as exc:
            failures.append(exc)

    async def waiter_listens() -> bool:
        waiters = client._waiters
        return waiters is not None and job.id in waiters._events

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiting)
        await until(waiter_listens, limit_s=10)
        with anyio.fail_after(10):
            await client.close()
    assert [str(e) for e in failures] == [
        "the client was closed while a wait() was under way: close it only after its waits "
        "have ended"
    ]


async def test_a_closed_client_on_a_callers_pool_refuses_to_wait(dsn: str) -> None:
    """A wait after close() on a pool the caller gave raises ConfigError, and takes no
    connection from the pool (one taken would never be given back)."""
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    try:
        async with pgq.Client(pool=pool) as client:
            job = await client.enqueue("email", {"to": "a@example.com"})
        with pytest.raises(ConfigError, match="the client is closed"):
            await client.wait(job.id, timeout=10)
        with anyio.fail_after(10):  # both places free
            async with pool.acquire() as a, pool.acquire() as b:
                assert await a.fetchval("SELECT 1") == await b.fetchval("SELECT 1") == 1
        async with client:  # open again: it waits as before
            await client.cancel(job.id)
            assert (await client.wait(job.id, timeout=30)).state is pgq.JobState.CANCELLED
    finally:
        await pool.close()


async def test_a_client_closed_in_a_cancelled_scope_gives_its_listen_connection_back(
    dsn: str,
) -> None:
    """close() reached in a cancelled scope (an `async with` body left by a timeout) still
    gives back the connection its waits listened on: the caller's pool can give both its
    places and close."""
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    try:
        client = pgq.Client(pool=pool)
        await client.open()
        job = await client.enqueue("email", {"to": "a@example.com"})
        await client.cancel(job.id)
        assert (await client.wait(job.id, timeout=30)).state is pgq.JobState.CANCELLED
        with anyio.CancelScope() as scope:
            scope.cancel()
            await client.close()
        with anyio.fail_after(10):
            async with pool.acquire() as a, pool.acquire() as b:
                assert await a.fetchval("SELECT 1") == await b.fetchval("SELECT 1") == 1
    finally:
        with anyio.fail_after(30):
            await pool.close()


async def test_a_polling_wait_under_way_when_its_client_closes_raises_config_error(
    dsn: str,
) -> None:
    """Behind a transaction pooler (no listen_dsn) a wait polls; a client closed under it
    ends it with the same ConfigError as a listening wait."""
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2, statement_cache_size=0)
    failures: list[BaseException] = []
    try:
        client = pgq.Client(pool=pool, pooler="transaction")
        await client.open()
        job = await client.enqueue("email", {"to": "a@example.com"})

        async def waiting() -> None:
            try:
                await client.wait(job.id, timeout=60)
            except ConfigError as exc:
                failures.append(exc)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(waiting)
                await anyio.wait_all_tasks_blocked()  # the wait is under way
                await client.close()
    finally:
        await pool.close()
    assert [str(e) for e in failures] == [
        "the client was closed while a wait() was under way: close it only after its waits "
        "have ended"
    ]


async def test_a_client_on_its_own_pool_reads_no_dsn(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", "mysql://not-for-pgq/db")
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    try:
        async with pgq.Client(pool=pool) as c:
            assert (await c.enqueue("email", {})).id > 0
    finally:
        await pool.close()


def with_query(dsn: str, query: str) -> str:
    """``dsn`` with ``query`` added to its parameters."""
    return f"{dsn}{'&' if '?' in dsn else '?'}{query}"


async def test_a_dsn_with_libpqs_connect_timeout_or_keepalives_connects(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Options libpq takes and asyncpg does not (common in DATABASE_URL): connect_timeout
    is honoured, keepalives is left out with a warning, instead of the server refusing
    them as unknown settings."""
    import logging

    with caplog.at_level(logging.WARNING, logger="pgq"):
        async with pgq.Client(with_query(dsn, "connect_timeout=10&keepalives=1")) as client:
            assert await client.count_by_state() is not None
    (warning,) = [r.getMessage() for r in caplog.records if "libpq options" in r.getMessage()]
    assert "(keepalives)" in warning


async def test_a_connect_timeout_in_the_dsn_bounds_the_wait_for_a_silent_server() -> None:
    """A server that accepts and never answers: the DSN's connect_timeout=2 ends the wait
    well before pgq's own 10 s."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    accepted: list[anyio.abc.SocketStream] = []

    async def hold(stream: anyio.abc.SocketStream) -> None:
        async with stream:  # kept open, never answered
            accepted.append(stream)
            await anyio.sleep_forever()

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, hold)
        began = anyio.current_time()
        with pytest.raises(pgq.DatabaseUnavailable):
            async with pgq.Client(f"postgresql://u:pw@127.0.0.1:{port}/db?connect_timeout=2"):
                pass
        waited = anyio.current_time() - began
        tg.cancel_scope.cancel()
    assert accepted, "the client never reached the silent server"
    assert waited < 8, f"waited {waited:.1f} s, as if connect_timeout were not read"


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("bogus=1", 'unrecognized configuration parameter "bogus"'),
        ("statement_timeout=abc", 'invalid value for parameter "statement_timeout"'),
    ],
)
async def test_a_dsn_parameter_the_server_refuses_says_to_correct_it(
    dsn: str, query: str, says: str
) -> None:
    with pytest.raises(pgq.ConfigError, match="refused a setting") as info:
        async with pgq.Client(with_query(dsn, query)):
            pass
    assert says in str(info.value) and "correct or remove it" in str(info.value)


async def test_a_dsn_that_asks_for_a_standby_is_told_no_host_is_one(dsn: str) -> None:
    """target_session_attrs=standby against a primary: the error names what was asked,
    rather than claim the server is a standby."""
    with pytest.raises(pgq.DatabaseUnavailable) as info:
        async with pgq.Client(with_query(dsn, "target_session_attrs=standby")):
            pass
    assert "no host is what target_session_attrs=standby asks for" in str(info.value)
    assert "is a standby" not in str(info.value)


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (lambda c: c.enqueue("t", metadata=[1]), "metadata must be a mapping (a dict), not list"),
        (
            lambda c: c.enqueue("t", unique=True, unique_states="available"),
            "unique_states takes a list of states, not 'available' alone",
        ),
        (
            lambda c: c.enqueue("t", unique_key="k", unique_period=60),
            "unique_period applies to unique=True",
        ),
        (lambda c: c.enqueue_many(["t"]), "expected a JobSpec (task.spec(...)"),
    ],
)
async def test_options_of_the_wrong_shape_are_refused_with_what_to_give(
    client: pgq.Client, call: Any, says: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)):
        await call(client)
    assert sum((await client.count_by_state()).values()) == 0


def test_a_dsn_that_is_not_a_string_is_refused() -> None:
    app = pgq.App()

    @app.task
    async def t(ctx: pgq.JobContext) -> None: ...

    with pytest.raises(ConfigError, match="dsn must be a PostgreSQL URL \\(a str\\) or None"):
        pgq.Client(5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="dsn must be a PostgreSQL URL \\(a str\\) or None"):
        pgq.Worker(app, 5)  # type: ignore[arg-type]


async def test_job_ids_out_of_range_raise_pgqs_error_naming_the_range(
    client: pgq.Client,
) -> None:
    job = await client.enqueue("t")
    for bad in (2**64, 2**63, 0, -1, True):
        calls: dict[str, Awaitable[object]] = {
            "get_job": client.get_job(bad),
            "cancel": client.cancel(bad),
            "cancel_many": client.cancel_many([job.id, bad]),
            "retry": client.retry([bad]),
            "wait": client.wait(bad, timeout=5),
        }
        for name, call in calls.items():
            with pytest.raises(pgq.ConfigError, match="from 1 to 9223372036854775807") as info:
                await call
            assert info.value.__cause__ is None, name
    assert await client.get_job(2**63 - 1) is None
    assert (await client.get_job(job.id)) is not None
    assert (await client.get_job(job.id)).state is pgq.JobState.AVAILABLE  # type: ignore[union-attr]


async def test_unique_and_limit_keys_are_bounded_in_bytes_naming_the_field(
    client: pgq.Client,
) -> None:
    for key in ("u" * 1_000_000, "u" * 10_000, "é" * 513, "\x00", "a\ud800", ""):
        with pytest.raises(pgq.ConfigError, match=r"unique_key must be 1 to 1,024 bytes"):
            await client.enqueue("t", unique_key=key)
    with pytest.raises(pgq.ConfigError, match=r"job 1: unique_key must be"):
        await client.enqueue_many([pgq.JobSpec("t"), pgq.JobSpec("t", unique_key="k" * 1025)])
    # The limit key is an index entry too: 1,000 characters of CJK text are 3,000 bytes.
    cjk = "".join(chr(0x4E00 + i * 7919 % 20000) for i in range(1000))
    with pytest.raises(pgq.ConfigError, match=r"limit_key must be at most 1,024 bytes"):
        await client.enqueue("t", limit_key=cjk)
    assert sum((await client.count_by_state()).values()) == 0
    # Whatever it holds, a key of 1,024 bytes fits the index (no luck with compression).
    key = "".join(chr(0x4E00 + i * 7919 % 20000) for i in range(341)) + "x"
    assert len(key.encode()) == 1024
    first = await client.enqueue("t", unique_key=key)
    again = await client.enqueue("t", unique_key=key)
    assert again.duplicate and again.id == first.id
    assert (await client.enqueue("t", limit_key=key)).limit_key == key


async def test_tags_are_bounded_at_enqueue(client: pgq.Client) -> None:
    bad = {
        "at most 32 tags a job, got 10,000": ["t" * 10] * 10_000,
        "1 to 128 characters": ["t" * 10_000],
        "without NUL": ["a\x00b"],
        "a list of strings": "not-a-list",
    }
    for says, tags in bad.items():
        with pytest.raises(pgq.ConfigError, match=says):
            await client.enqueue("t", tags=tags)
    with pytest.raises(pgq.ConfigError, match="job 1: tags: at most 32"):
        await client.enqueue_many([pgq.JobSpec("t"), pgq.JobSpec("t", tags=["x"] * 33)])
    assert sum((await client.count_by_state()).values()) == 0
    job = await client.enqueue("t", tags=[f"{i:03d}" + "t" * 125 for i in range(32)])
    assert len(job.tags) == 32 and {len(t) for t in job.tags} == {128}
