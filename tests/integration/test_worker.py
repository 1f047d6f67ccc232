import asyncio
import functools
import threading
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import anyio.lowlevel
import asyncpg
import pytest

import pgq
from pgq._worker.attempt import CANCEL, Execution, Outcome
from pgq._worker.producer import Producer
from tests.faults.proxy import Proxy
from tests.faults.workers import upstream, via_proxy
from tests.tests_support import blocking_app, until

pytestmark = pytest.mark.anyio

FAST = pgq.Backoff(base_s=0.01, max_s=0.05, jitter=0.0)


async def wait_for_state(
    client: pgq.Client, job_id: int, state: pgq.JobState, limit_s: float = 30
) -> pgq.Job:
    """The job once it reached ``state``: the database row is what is awaited here."""
    with anyio.fail_after(limit_s):
        while True:
            job = await client.get_job(job_id)
            if job is not None and job.state is state:
                return job
            await anyio.sleep(0.02)


async def burst(app: pgq.App, dsn: str, limit_s: float = 30, **kw: Any) -> None:
    with anyio.fail_after(limit_s):
        await pgq.Worker(app, dsn, **kw).run(burst=True)


async def test_runs_jobs_with_their_args_and_stores_results(client: pgq.Client, dsn: str) -> None:
    app = pgq.App()
    seen: list[tuple[int, int, int]] = []

    @app.task
    async def add(ctx: pgq.JobContext, a: int, b: int) -> dict[str, int]:
        seen.append((ctx.id, ctx.attempt, ctx.args["a"]))
        ctx.log.info("adding")
        return {"sum": a + b}

    job = await client.enqueue("add", {"a": 2, "b": 3})
    await burst(app, dsn)
    done = await client.get_job(job.id)
    assert done is not None
    assert done.state is pgq.JobState.COMPLETED
    assert done.result == {"sum": 5}
    assert done.finalized_at is not None and done.attempt == 1
    assert seen == [(job.id, 1, 2)]


@pytest.mark.parametrize(
    ("concurrency", "key_concurrency"), [(None, None), (50, None), (None, 5)],
    ids=["plain", "limited", "keyed"],
)  # fmt: skip
async def test_a_task_sees_its_job_as_stored_every_column_read(
    client: pgq.Client, dsn: str, concurrency: int | None, key_concurrency: int | None
) -> None:
    # The claim returns fewer columns, read by position (codec.jobs_from_claim); a read by id
    # reads them all by name (job_from_row). Every column set to a value of its own: they
    # must agree, whichever statement claims (plain, under the queue's limits, per key).
    app = pgq.App()
    seen: list[tuple[pgq.Job, pgq.Job | None]] = []

    @app.task
    async def parent(ctx: pgq.JobContext) -> None:
        pass

    @app.task(max_attempts=7)
    async def child(ctx: pgq.JobContext, n: int, note: str) -> None:
        seen.append((ctx.job, await client.get_job(ctx.job.id)))
        if note == "again" and ctx.job.attempt == 1:
            raise pgq.Retry(0, "once more")  # its second attempt is claimed with its errors

    if concurrency or key_concurrency:
        await client.set_queue_limits(
            "default", concurrency=concurrency, key_concurrency=key_concurrency
        )
    first = await client.enqueue(parent.spec())
    await burst(app, dsn)
    # Five jobs in one claim. In claim order (priority, then schedule): two of one enqueue
    # (one creation time, sent once: the second row carries none), the job of every column,
    # the third of that enqueue (its creation time sent again, after the other's), and a
    # job due before it was created (scheduled_at is sent only when it differs from
    # created_at). The first row carries the start for all, and is not the lowest id.
    past = datetime.now(UTC) - timedelta(days=1)
    late = await client.enqueue(child.spec(4, "x").with_options(run_at=past))
    batch = await client.enqueue_many(
        [
            child.spec(5, "a").with_options(priority=9),
            child.spec(6, "again").with_options(priority=9),
            child.spec(7, "c").with_options(priority=1),
        ]
    )
    job = await client.enqueue(
        child.spec(3, "é").with_options(
            priority=5, tags=["a", "b"], metadata={"m": [1, {"x": None}]},
            unique_key="k-1", limit_key="tenant-1", depends_on=[first],
        )
    )  # fmt: skip
    await burst(app, dsn)
    assert len(seen) == 6  # five jobs, one of them twice
    for claimed, read in seen:
        assert claimed == read
    once = {c.id: c for c, _ in seen if c.attempt == 1}
    assert sorted(once) == sorted([late.id, *(j.id for j in batch), job.id])
    assert len({c.attempted_at for c in once.values()}) == 1  # one claim
    assert once[batch[0].id].created_at == once[batch[2].id].created_at != job.created_at
    claimed_late = once[late.id]
    assert claimed_late.scheduled_at == past != claimed_late.created_at
    ((again, read_again),) = [(c, r) for c, r in seen if c.attempt == 2]
    assert again.id == batch[1].id
    assert [e["message"] for e in again.errors] == ["once more"]
    assert again == read_again
    claimed = once[job.id]
    assert (claimed.id, claimed.args, claimed.tags, claimed.metadata) == (
        job.id, {"n": 3, "note": "é"}, ["a", "b"], {"m": [1, {"x": None}]},
    )  # fmt: skip
    assert (claimed.unique_key, claimed.limit_key, claimed.depends_on) == (
        "k-1", "tenant-1", [first.id],
    )  # fmt: skip
    assert claimed.state is pgq.JobState.RUNNING and claimed.attempt == 1
    assert claimed.max_attempts == 7 and claimed.priority == 5
    assert claimed.attempt_token is not None and claimed.producer_id is not None
    assert claimed.attempted_at is not None and claimed.created_at is not None
    assert (claimed.queue, batch[0].tags, once[batch[0].id].errors) == ("default", [], [])
    a, c = once[batch[0].id], once[batch[2].id]  # empty, yet each job's own to change
    assert a.errors is not c.errors and a.tags is not c.tags and a.metadata is not c.metadata


async def test_plain_def_tasks_run_in_worker_threads(client: pgq.Client, dsn: str) -> None:
    app = pgq.App()
    threads: list[str] = []

    @app.task
    def blocking(ctx: pgq.JobContext, n: int) -> int:
        threads.append(threading.current_thread().name)
        return n * 2

    jobs = await client.enqueue_many([pgq.JobSpec("blocking", {"n": i}) for i in range(20)])
    await burst(app, dsn, max_threads=3)
    assert all(t != threading.main_thread().name for t in threads) and len(threads) == 20
    assert [(await client.get_job(j.id)).result for j in jobs] == [i * 2 for i in range(20)]  # type: ignore[union-attr]


async def test_claims_by_priority_then_schedule_time(client: pgq.Client, dsn: str) -> None:
    app = pgq.App()
    order: list[str] = []

    @app.task
    async def record(ctx: pgq.JobContext, name: str) -> None:
        order.append(name)

    await client.enqueue("record", {"name": "low-1"}, priority=0)
    await client.enqueue("record", {"name": "high"}, priority=10)
    await client.enqueue("record", {"name": "low-2"}, priority=0)
    await client.enqueue("record", {"name": "mid"}, priority=5)
    await burst(app, dsn, concurrency=1)
    assert order == ["high", "mid", "low-1", "low-2"]


async def test_never_claims_a_task_it_has_not_registered(client: pgq.Client, dsn: str) -> None:
    app = pgq.App()

    @app.task
    async def known(ctx: pgq.JobContext) -> None: ...

    other = await client.enqueue("unknown_task")
    mine = await client.enqueue("known")
    await burst(app, dsn)
    assert (await client.get_job(mine.id)).state is pgq.JobState.COMPLETED  # type: ignore[union-attr]
    left = await client.get_job(other.id)
    assert left is not None and left.state is pgq.JobState.AVAILABLE and left.attempt == 0


async def test_failures_retry_with_backoff_then_discard_keeping_every_error(
    client: pgq.Client, dsn: str
) -> None:
    app = pgq.App()
    backoff = pgq.Backoff(base_s=0.2, max_s=10, jitter=0.0)

    @app.task(max_attempts=3, backoff=backoff)
    async def always_fails(ctx: pgq.JobContext) -> None:
        raise RuntimeError(f"broken on attempt {ctx.attempt}")

    job = await client.enqueue("always_fails")
    async with pgq.Worker(app, dsn, schedule_interval=0.05) as worker:
        done = await wait_for_state(client, job.id, pgq.JobState.DISCARDED)
        producer_ids = {p["producer_id"] for p in worker.stats()["producers"]}
    assert done.attempt == 3
    # Each attempt names the producer and the worker that ran it.
    assert done.attempted_by == worker.name
    assert {e["worker_name"] for e in done.errors} == {worker.name}
    assert {e["producer_id"] for e in done.errors} <= producer_ids
    assert all(e["started_at"] <= e["at"] for e in done.errors)
    assert [e["attempt"] for e in done.errors] == [1, 2, 3]
    assert [e["message"] for e in done.errors] == [
        f"RuntimeError: broken on attempt {n}" for n in (1, 2, 3)
    ]
    assert all("Traceback" in e["traceback"] for e in done.errors)
    # Each wait at least the backoff: 0.2 s after attempt 1, 0.4 s after attempt 2.
    from datetime import datetime

    ats = [datetime.fromisoformat(e["at"]) for e in done.errors]
    assert (ats[1] - ats[0]).total_seconds() >= 0.2
    assert (ats[2] - ats[1]).total_seconds() >= 0.4


async def test_retry_snooze_and_cancel_outcomes(client: pgq.Client, dsn: str) -> None:
    app = pgq.App()
    calls: Counter[str] = Counter()

    @app.task(max_attempts=5)
    async def retry_once(ctx: pgq.JobContext) -> str:
        calls["retry"] += 1
        if ctx.attempt == 1:
            raise pgq.Retry(0, reason="not yet")
        return "ok"

    @app.task(max_attempts=1)
    async def snoozer(ctx: pgq.JobContext) -> None:
        calls["snooze"] += 1
        if calls["snooze"] < 3:
            raise pgq.Snooze(0)

    @app.task
    async def canceller(ctx: pgq.JobContext) -> None:
        raise pgq.Cancel("no longer wanted")

    r = await client.enqueue("retry_once")
    s = await client.enqueue("snoozer")
    c = await client.enqueue("canceller")
    await burst(app, dsn)
    rj, sj, cj = [await client.get_job(j.id) for j in (r, s, c)]
    assert rj and rj.state is pgq.JobState.COMPLETED and rj.attempt == 2 and rj.result == "ok"
    assert rj.errors[0]["message"] == "not yet"
    # Snoozes do not use attempts: max_attempts=1 and still it ran three times.
    assert sj and sj.state is pgq.JobState.COMPLETED and sj.attempt == 1 and calls["snooze"] == 3
    assert (
        cj and cj.state is pgq.JobState.CANCELLED and cj.errors[0]["message"] == "no longer wanted"
    )


async def test_big_integers_reach_the_task_exactly_and_an_undecodable_row_fails_alone(
    client: pgq.Client, dsn: str
) -> None:
    app = pgq.App()
    seen: dict[int, Any] = {}

    @app.task(max_attempts=3)
    async def echo(ctx: pgq.JobContext, n: Any) -> None:
        seen[ctx.id] = n

    # 10**30 is beyond 64 bits (orjson decodes it as the nearest float); 10**400 beyond a
    # float's range (orjson refuses it); both are valid JSON that pgq stores exactly.
    big = await client.enqueue(echo.spec(n=10**30 + 1))
    huge = await client.enqueue(echo.spec(n=[10**400 + 7]))
    # A row written around pgq's checks: more digits than int() converts. It is claimed in
    # the same batch as the others, and must not take the claim (or the worker) with it.
    async with client.pool.acquire() as conn:
        bad = await conn.fetchval(
            "INSERT INTO pgq_jobs (task, args) VALUES ('echo', jsonb_build_object('n', "
            "repeat('9', 5000)::numeric)) RETURNING id"
        )
    after = await client.enqueue(echo.spec(n=5))
    await burst(app, dsn)
    assert seen == {big.id: 10**30 + 1, huge.id: [10**400 + 7], after.id: 5}
    assert type(seen[big.id]) is int
    for job_id in (big.id, huge.id, after.id):
        job = await client.get_job(job_id)
        assert job is not None and job.state is pgq.JobState.COMPLETED
    job = await client.get_job(bad)  # still readable, the arguments saying why they are empty
    assert job is not None and job.state is pgq.JobState.DISCARDED and job.attempt == 1
    assert job.args == {} and "could not be decoded" in job.args.problem  # type: ignore[attr-defined]
    (error,) = job.errors
    assert error["kind"] == "arguments" and "could not be decoded" in error["message"]
    async with client.pool.acquire() as conn:  # the stored value is left as it was
        digits = await conn.fetchval("SELECT length(args->>'n') FROM pgq_jobs WHERE id = $1", bad)
    assert digits == 5000


async def test_a_permanent_failure_and_stale_arguments_are_discarded_at_once(
    client: pgq.Client, dsn: str
) -> None:
    app = pgq.App()
    calls: Counter[str] = Counter()

    @app.task(max_attempts=5)
    async def lookup(ctx: pgq.JobContext, user_id: int) -> None:
        calls[str(user_id)] += 1
        raise pgq.Discard(f"user {user_id} does not exist")

    # Enqueued by name, without the App, by a producer that still sends the old argument.
    stale = await client.enqueue("lookup", {"userid": 7})
    gone = await client.enqueue("lookup", {"user_id": 8})
    await burst(app, dsn)
    stale_job, gone_job = [await client.get_job(j.id) for j in (stale, gone)]
    assert stale_job and stale_job.state is pgq.JobState.DISCARDED and stale_job.attempt == 1
    (error,) = stale_job.errors
    assert error["kind"] == "arguments"
    assert "takes no argument userid (its parameters: user_id)" in error["message"]
    assert gone_job and gone_job.state is pgq.JobState.DISCARDED and gone_job.attempt == 1
    assert gone_job.errors[0]["kind"] == "discard"
    assert gone_job.errors[0]["message"] == "user 8 does not exist"
    assert calls == {"8": 1}, "the stale job never ran, the other ran once"


async def test_timeout_cancels_an_async_task_and_records_it(client: pgq.Client, dsn: str) -> None:
    app = pgq.App()
    finished = []

    @app.task(timeout=0.2, max_attempts=1)
    async def slow(ctx: pgq.JobContext) -> None:
        await anyio.sleep(30)
        finished.append(True)

    job = await client.enqueue("slow")
    await burst(app, dsn, limit_s=10)
    done = await client.get_job(job.id)
    assert done is not None and done.state is pgq.JobState.DISCARDED
    assert (
        done.errors[0]["kind"] == "timeout" and "timed out after 0.2s" in done.errors[0]["message"]
    )
    assert finished == []


async def test_timeout_of_a_thread_task_sets_cancel_requested(client: pgq.Client, dsn: str) -> None:
    app = pgq.App()
    saw_cancel = threading.Event()

    @app.task(timeout=0.2, max_attempts=1)
    def slow(ctx: pgq.JobContext) -> None:
        for _ in range(500):
            if ctx.cancel_requested:
                saw_cancel.set()
                return
            threading.Event().wait(0.01)

    job = await client.enqueue("slow")
    await burst(app, dsn, limit_s=10)
    assert (await client.get_job(job.id)).state is pgq.JobState.DISCARDED  # type: ignore[union-attr]
    await anyio.to_thread.run_sync(saw_cancel.wait, 5)
    assert saw_cancel.is_set()


async def test_unserializable_result_completes_and_keeps_the_reason(
    client: pgq.Client, dsn: str
) -> None:
    app = pgq.App()

    @app.task
    async def odd(ctx: pgq.JobContext) -> object:
        return {"x": object()}

    job = await client.enqueue("odd")
    await burst(app, dsn)
    done = await client.get_job(job.id)
    assert done and done.state is pgq.JobState.COMPLETED and done.result is None
    assert "result['x'] is of type object" in done.errors[0]["message"]


async def test_many_workers_never_run_a_job_twice(client: pgq.Client, dsn: str) -> None:
    app = pgq.App()
    runs: Counter[int] = Counter()

    @app.task
    async def once(ctx: pgq.JobContext, i: int) -> None:
        runs[i] += 1
        await anyio.lowlevel.checkpoint()

    n = 3000
    await client.enqueue_many([pgq.JobSpec("once", {"i": i}) for i in range(n)])
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for k in range(6):
                tg.start_soon(functools.partial(burst, app, dsn, 60, concurrency=7 + k))
    assert len(runs) == n and set(runs.values()) == {1}
    assert (await client.count_by_state())[pgq.JobState.COMPLETED] == n


async def test_notification_wakes_an_idle_worker(client: pgq.Client, dsn: str) -> None:
    app = pgq.App()
    ran = anyio.Event()

    @app.task
    async def ping(ctx: pgq.JobContext) -> None:
        ran.set()

    # A poll interval far beyond the test's limit: only the NOTIFY can wake the worker.
    async with pgq.Worker(app, dsn, poll_interval=3600):
        await client.enqueue("ping")
        with anyio.fail_after(10):
            await ran.wait()


async def test_poll_only_mode_runs_jobs_without_listen(
    client: pgq.Client, dsn: str, conn: Any
) -> None:
    app = pgq.App()
    ran = anyio.Event()

    @app.task
    async def ping(ctx: pgq.JobContext) -> None:
        ran.set()

    async with pgq.Worker(app, dsn, poll_only=True, poll_interval=0.05):
        listeners = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND query ILIKE 'LISTEN%'"
        )
        assert listeners == 0
        await client.enqueue("ping")
        with anyio.fail_after(10):
            await ran.wait()


async def test_delayed_job_runs_once_due(client: pgq.Client, dsn: str) -> None:
    app = pgq.App()
    ran = anyio.Event()

    @app.task
    async def later(ctx: pgq.JobContext) -> None:
        ran.set()

    job = await client.enqueue("later", delay=0.3)
    async with pgq.Worker(app, dsn, schedule_interval=0.05):
        with anyio.fail_after(10):
            await ran.wait()
    done = await client.get_job(job.id)
    assert (
        done and done.attempted_at and done.scheduled_at and done.attempted_at >= done.scheduled_at
    )


async def test_clean_stop_waits_for_running_jobs(client: pgq.Client, dsn: str) -> None:
    app = pgq.App()
    started = anyio.Event()

    @app.task
    async def short(ctx: pgq.JobContext) -> str:
        started.set()
        await anyio.sleep(0.3)
        return "finished"

    job = await client.enqueue("short")
    async with pgq.Worker(app, dsn, shutdown_timeout=10):
        with anyio.fail_after(10):
            await started.wait()
    done = await client.get_job(job.id)
    assert done and done.state is pgq.JobState.COMPLETED and done.result == "finished"


async def test_clean_stop_past_the_timeout_leaves_nothing_running(
    client: pgq.Client, dsn: str, conn: Any
) -> None:
    app, started = blocking_app()

    job = await client.enqueue("forever")
    async with pgq.Worker(app, dsn, shutdown_timeout=0.2):
        with anyio.fail_after(10):
            await started.wait()
    done = await client.get_job(job.id)
    # Handed back runnable at once: no promotion (no leader) stands between it and a worker.
    assert done is not None and done.state is pgq.JobState.AVAILABLE
    assert done.attempt == 0, "an interrupted attempt does not count"
    assert done.errors[0]["kind"] == "shutdown"
    assert await conn.fetchval("SELECT count(*) FROM pgq_jobs WHERE state = 'running'") == 0
    assert await conn.fetchval("SELECT count(*) FROM pgq_producers") == 0


async def test_stop_now_cancels_at_once(client: pgq.Client, dsn: str) -> None:
    app, started = blocking_app()

    job = await client.enqueue("forever")
    worker = pgq.Worker(app, dsn, shutdown_timeout=3600)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            await started.wait()
            worker.stop()
            await anyio.sleep(0.1)
            worker.stop(now=True)
    assert (await client.get_job(job.id)).state is pgq.JobState.AVAILABLE  # type: ignore[union-attr]


async def test_a_worker_runs_once_and_a_second_run_opens_no_connection(
    client: pgq.Client, dsn: str
) -> None:
    # Its stop event stays set after a run: a second run used to connect, register
    # producers under the same worker id and stop at once, without a word.
    app, started = blocking_app()
    proxy = Proxy(*upstream(dsn))  # counts the connections the worker opens
    async with anyio.create_task_group() as tg:
        worker = pgq.Worker(app, via_proxy(dsn, await tg.start(proxy.run)), shutdown_timeout=0.1)
        job = await client.enqueue("forever")
        with anyio.fail_after(15):
            async with anyio.create_task_group() as running:
                running.start_soon(worker.run)
                await started.wait()
                for again in (worker.run, worker.__aenter__):  # concurrent with the first
                    with pytest.raises(pgq.ConfigError, match="is running already; a Worker runs"):
                        await again()
                assert worker.stats()["producers"], "the first run goes on"
                worker.stop()
        opened = proxy.connections
        assert opened > 0
        with anyio.fail_after(15):
            for again in (worker.run, functools.partial(worker.run, burst=True)):
                with pytest.raises(pgq.ConfigError, match="has run already; a Worker runs once"):
                    await again()
            with pytest.raises(pgq.ConfigError, match="make a new pgq.Worker"):
                async with worker:
                    pass
        assert proxy.connections == opened, "a second run opened no connection"
        tg.cancel_scope.cancel()
    assert (await client.get_job(job.id)).state is pgq.JobState.AVAILABLE  # type: ignore[union-attr]


async def test_worker_on_unmigrated_database_fails_at_start(empty_dsn: str) -> None:
    app = pgq.App()

    @app.task
    async def t(ctx: pgq.JobContext) -> None: ...

    with pytest.raises(pgq.SchemaMismatch, match="run `pgq migrate`"):
        async with pgq.Worker(app, empty_dsn):
            pass


async def test_worker_refuses_an_app_without_tasks() -> None:
    with pytest.raises(pgq.ConfigError, match="the App registers no task"):
        pgq.Worker(pgq.App(), "postgresql://localhost/x", queues=["b"])


async def test_a_job_enqueued_on_another_queue_than_its_tasks_runs_where_that_queue_is_worked(
    client: pgq.Client, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A task declared on queue "a", enqueued with queue="b" (by spec, and by name without
    the App): a worker that works "b" runs both, and warns at start that no task of its App
    is declared on "b"."""
    import logging

    app = pgq.App()

    @app.task(queue="a")
    async def echo(ctx: pgq.JobContext, n: int) -> int:
        return n

    async with pgq.Client(dsn, app=app) as with_app:
        by_spec = await with_app.enqueue(echo.spec(n=1), queue="b")
    by_name = await client.enqueue("echo", {"n": 2}, queue="b")
    assert (by_spec.queue, by_name.queue) == ("b", "b")
    with caplog.at_level(logging.WARNING, logger="pgq.worker"):
        await burst(app, dsn, queues=["b"])
    for job, n in ((by_spec, 1), (by_name, 2)):
        done = await client.get_job(job.id)
        assert done is not None and done.state is pgq.JobState.COMPLETED and done.result == n
    (warning,) = [r.getMessage() for r in caplog.records if "no task of this App" in r.getMessage()]
    assert "queue 'b'" in warning and "queue='b'" in warning, warning


async def test_a_producer_says_it_is_empty_after_batches_that_overlapped(
    client: pgq.Client, dsn: str
) -> None:
    """Waiting for "no job runs" while one batch runs and another is claimed still ends
    when the last job of either ends (burst mode and shutdown wait on it)."""
    app = pgq.App()
    slow_started, release = anyio.Event(), anyio.Event()

    @app.task
    async def slow(ctx: pgq.JobContext) -> None:
        slow_started.set()
        await release.wait()

    @app.task
    async def quick(ctx: pgq.JobContext) -> None:
        pass

    emptied = anyio.Event()
    outcomes: list[Outcome] = []
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    assert pool is not None
    producer = Producer(
        queue="default",
        concurrency=10,
        tasks=app.tasks,
        pool=pool,
        outcomes=outcomes.append,
        limiter=anyio.CapacityLimiter(1),
        poll_interval=0.05,
        fence_after_s=3600,
    )

    async def wait_empty() -> None:
        await producer.wait_empty()
        emptied.set()

    try:
        async with anyio.create_task_group() as tg:
            await tg.start(producer.run)
            await client.enqueue("slow")
            with anyio.fail_after(10):
                await slow_started.wait()
            tg.start_soon(wait_empty)  # waits while the first batch runs
            await anyio.lowlevel.checkpoint()
            await client.enqueue("quick")  # a second batch, claimed meanwhile

            async def quick_done() -> bool:
                return any(o.state == "completed" for o in outcomes)

            await until(quick_done)
            assert not emptied.is_set()
            release.set()
            with anyio.fail_after(10):
                await emptied.wait()
            producer.stop_fetching()
    finally:
        await pool.close()
    assert sorted(o.state for o in outcomes) == ["completed", "completed"]


# --------------------------------------------------------------------------- claim ahead


async def test_jobs_claimed_ahead_never_run_beyond_concurrency(
    dsn: str, client: pgq.Client
) -> None:
    """Jobs claimed ahead of free slots (claim_ahead=5) wait for a slot: more jobs are
    running in the database than the worker's concurrency, never more executing."""
    app = pgq.App()
    executing = 0
    most = 0

    @app.task
    async def short(ctx: pgq.JobContext, i: int) -> None:
        nonlocal executing, most
        executing += 1
        most = max(most, executing)
        await anyio.sleep(0.01)
        executing -= 1

    await client.enqueue_many([pgq.JobSpec("short", {"i": i}) for i in range(300)])
    async with pgq.Worker(app, dsn, concurrency=4, claim_ahead=5, poll_interval=0.05) as worker:
        (producer,) = worker._by_queue.values()
        claimed_ahead = waiting = most_executing = 0
        with anyio.fail_after(60):
            while await client.pool.fetchval(
                "SELECT count(*) FROM pgq_jobs WHERE state <> 'completed'"
            ):
                claimed_ahead = max(claimed_ahead, len(producer.running) - producer.concurrency)
                (stats,) = worker.stats()["producers"]
                waiting = max(waiting, stats["running"] - stats["executing"])
                most_executing = max(most_executing, stats["executing"])
                await anyio.sleep(0.001)
    assert most == 4  # the slots were used, and never exceeded
    assert claimed_ahead >= 1  # it did claim ahead
    # stats() tells jobs in a slot from jobs claimed and waiting for one.
    assert 1 <= most_executing <= 4 and waiting >= 1


async def test_the_claim_ahead_is_sized_from_claim_and_job_times() -> None:
    from pgq._worker.producer import AHEAD_ROUND_TRIPS, MAX_AHEAD, AheadSizing

    def sized(concurrency: int, claim_s: float, job_s: float, fixed: int = -1) -> int:
        p = AheadSizing(concurrency, claim_ahead=fixed)
        p.claim_took(claim_s)
        p.job_took(job_s)
        return p.ahead

    assert AHEAD_ROUND_TRIPS == 2.0
    assert sized(10, 0.001, 0.010) == 2  # 10 slots x 2 round trips of 1 ms / 10 ms jobs
    assert sized(100, 0.001, 0.010) == 20
    assert sized(1000, 0.001, 0.010) == 200
    assert sized(10, 0.001, 0.001) == 20  # short jobs: more than the slots
    assert sized(10, 0.001, 0.000_001) == 4 * 10  # no-op jobs: four per slot
    assert sized(1000, 0.001, 0.000_001) == MAX_AHEAD  # and MAX_AHEAD in all
    assert sized(1, 0.001, 0.000_001) == 4
    assert sized(10, 0.001, 5.0) == 0  # long jobs: none
    assert sized(10, 0.001, 0.010, fixed=0) == 0  # claim_ahead=0: never
    assert sized(10, 0.001, 0.010, fixed=3) == 3


def bare_producer(claim_ahead: int = -1) -> tuple[Producer, list[Outcome], list[int]]:
    """A producer of one slot with no pool (nothing here reaches the database), the
    outcomes it sends, and the ids of the jobs its task ``noted`` ran."""
    app = pgq.App()
    ran: list[int] = []

    @app.task
    async def noted(ctx: pgq.JobContext) -> None:
        ran.append(ctx.id)

    outcomes: list[Outcome] = []
    producer = Producer(
        queue="default", concurrency=1, tasks=app.tasks, pool=None,  # type: ignore[arg-type]
        outcomes=outcomes.append, limiter=anyio.CapacityLimiter(1), poll_interval=1.0,
        fence_after_s=3600.0, claim_ahead=claim_ahead,
    )  # fmt: skip
    return producer, outcomes, ran


def start_claimed(producer: Producer, job_id: int) -> asyncio.Task[None]:
    """Start a claimed job of task ``noted`` as a batch does: registered as running, its
    task created (it takes its first step when this one next yields)."""
    job = pgq.Job(
        job_id, "default", "noted", {}, pgq.JobState.RUNNING, attempt=1,
        attempt_token=uuid.uuid4(),
    )  # fmt: skip
    execution = Execution(job)
    producer.admit([execution])
    (task,) = producer.spawn([execution])
    return task


@pytest.mark.parametrize("slot", ["free", "taken"])
async def test_a_job_cancelled_before_its_task_begins_gets_its_outcome(slot: str) -> None:
    """A cancel that lands between a job's task being created and its first step must
    not cancel the task (its body, and the outcome it sends, would never run): the job is
    cancelled, not left running with no outcome, whether a slot is free or it must wait."""
    producer, outcomes, ran = bare_producer()
    if slot == "taken":
        await producer.slots.acquire()
    task = start_claimed(producer, 1)
    assert producer.cancel({1}, CANCEL) == [1]  # before the task's first step
    with anyio.fail_after(10):
        await task
    assert not task.cancelled()
    assert [o.state for o in outcomes] == ["cancelled"]
    assert ran == [] and producer.running == {} and not producer.waiting


async def test_a_job_that_comes_to_wait_after_a_stop_began_is_handed_back_at_once() -> None:
    """stop_fetching hands back the jobs waiting for a slot; one whose task reaches the
    wait only after it (no job duration learnt yet, so no patience) is handed back too,
    at once, instead of waiting for a slot."""
    producer, outcomes, ran = bare_producer()
    await producer.slots.acquire()  # the one slot is taken
    task = start_claimed(producer, 1)
    producer.stop_fetching()  # before the job's task takes its first step
    with anyio.fail_after(10):
        await task
    assert [(o.state, o.attempt_delta) for o in outcomes] == [("available", -1)]
    assert "its worker is stopping" in (outcomes[0].error or "")
    assert ran == [] and producer.running == {} and not producer.waiting


async def test_after_a_hand_back_for_want_of_a_slot_none_are_claimed_ahead_until_a_job_ends() -> (
    None
):
    """A fixed claim_ahead too: the producer would otherwise claim the job straight back."""
    producer, outcomes, _ran = bare_producer(claim_ahead=3)
    producer.sizing.job_took(0.001)  # short jobs: a job waits MIN_PATIENCE_S for a slot
    assert producer.sizing.ahead == 3
    await producer.slots.acquire()
    task = start_claimed(producer, 1)
    with anyio.fail_after(10):
        await task
    assert [(o.state, o.attempt_delta) for o in outcomes] == [("available", -1)]
    assert "freed in time" in (outcomes[0].error or "")
    assert producer.sizing.ahead == 0
    producer.sizing.job_took(0.001)  # a job ended
    assert producer.sizing.ahead == 3


def holding_app() -> tuple[pgq.App, list[int], anyio.Event]:
    """An App whose task ``hold`` records its job's id in the list when it starts, then
    waits for the event."""
    app = pgq.App()
    began: list[int] = []
    release = anyio.Event()

    @app.task
    async def hold(ctx: pgq.JobContext) -> None:
        began.append(ctx.id)
        await release.wait()

    return app, began, release


async def test_a_job_claimed_ahead_is_cancelled_or_handed_back_without_running(
    dsn: str, client: pgq.Client
) -> None:
    app, began, _release = holding_app()
    worker = pgq.Worker(
        app, dsn, concurrency=1, claim_ahead=2, poll_interval=0.05, shutdown_timeout=0.2
    )
    async with worker:
        (producer,) = worker._by_queue.values()
        first, second, third = await client.enqueue_many([pgq.JobSpec("hold") for _ in range(3)])

        async def all_claimed() -> bool:
            return len(producer.running) == 3

        await until(all_claimed)
        assert began == [first.id]  # one slot: the other two wait, claimed
        await client.cancel(second.id)
        cancelled = await client.wait(second, timeout=20)
        assert cancelled.state is pgq.JobState.CANCELLED and began == [first.id]
    handed_back = await client.get_job(third.id)
    assert handed_back is not None
    # Available again at once, in its place in the queue: no wait for the scheduler.
    assert handed_back.state is pgq.JobState.AVAILABLE
    assert handed_back.scheduled_at == third.scheduled_at
    assert handed_back.attempt == 0  # it never ran: the attempt does not count
    assert "its worker is stopping" in handed_back.errors[-1]["message"]
    assert began == [first.id]


async def test_a_fenced_producer_hands_back_jobs_claimed_ahead_instead_of_starting_them(
    dsn: str, client: pgq.Client
) -> None:
    app, began, release = holding_app()
    async with pgq.Worker(app, dsn, concurrency=1, claim_ahead=2, poll_interval=0.05) as worker:
        (producer,) = worker._by_queue.values()
        first, second, third = await client.enqueue_many([pgq.JobSpec("hold") for _ in range(3)])

        async def all_claimed() -> bool:
            return len(producer.running) == 3

        await until(all_claimed)
        for _ in range(3):  # heartbeats fail: the producer fences itself
            producer.health.beat_failed(OSError("cut off"), 3, len(producer.running))
        assert not producer.health.healthy
        release.set()  # the slot frees while the producer is fenced
        await client.wait(first, timeout=20)
        for job in (second, third):

            async def handed_back(job_id: int = job.id) -> bool:
                now = await client.get_job(job_id)
                return now is not None and any(
                    "its worker stopped claiming" in e["message"] for e in now.errors
                )

            await until(handed_back)
    assert began[0] == first.id
    assert began.count(second.id) <= 1 and began.count(third.id) <= 1  # not started fenced
    for job in (second, third):
        now = await client.get_job(job.id)
        assert now is not None and now.attempt <= 1


async def test_a_heartbeat_the_database_dates_past_the_fencing_bound_hands_back_jobs_held(
    dsn: str, client: pgq.Client, conn: "asyncpg.Connection[asyncpg.Record]"
) -> None:
    """What a suspended host looks like from the database: the heartbeat lands, but its
    row's previous stamp is older than the fencing bound, while this process saw no gap.
    Peers judge by that stamp, so the producer fences itself first and hands back the jobs
    it held unstarted (the next claims run them); the job it was running goes on."""
    app, began, release = holding_app()
    async with pgq.Worker(
        app,
        dsn,
        concurrency=1,
        claim_ahead=2,
        poll_interval=0.05,
        heartbeat_interval=1.0,
        heartbeat_timeout=1.0,
        stale_after=60.0,
    ) as worker:
        (producer,) = worker._by_queue.values()
        first, *held = await client.enqueue_many([pgq.JobSpec("hold") for _ in range(3)])

        async def all_claimed() -> bool:
            return len(producer.running) == 3 and began == [first.id]

        await until(all_claimed)

        async def fenced_after_a_silence_the_database_saw() -> bool:
            # Again at each poll: a beat in flight may stamp the row over this.
            await conn.execute(
                "UPDATE pgq_producers SET heartbeat_at = now() - interval '30 seconds' "
                "WHERE id = $1",
                producer.id,
            )
            return producer.health.fences > 0

        await until(fenced_after_a_silence_the_database_saw)
        for job in held:

            async def handed_back(job_id: int = job.id) -> bool:
                now = await client.get_job(job_id)
                return now is not None and any(
                    "its worker stopped claiming" in e["message"] for e in now.errors
                )

            await until(handed_back)
        assert began == [first.id]  # the held jobs never started then
        assert producer.health.healthy  # the same beat proved it alive again
        release.set()
        for job in (first, *held):
            assert (await client.wait(job, timeout=20)).state is pgq.JobState.COMPLETED


def quick_and_slow_app(timeout: float | None) -> tuple[pgq.App, anyio.Event]:
    """An App with task ``quick`` (1 ms, with ``timeout``) and task ``slow``, which holds
    its slot until the returned event is set."""
    app = pgq.App()
    release = anyio.Event()

    @app.task(timeout=timeout)
    async def quick(ctx: pgq.JobContext) -> None:
        await anyio.sleep(0.001)

    @app.task
    async def slow(ctx: pgq.JobContext) -> None:
        await release.wait()

    return app, release


def hand_backs(job: pgq.Job | None) -> int:
    """How many times the job was handed back for want of a free slot."""
    return 0 if job is None else sum("freed in time" in e["message"] for e in job.errors)


async def handed_back(client: pgq.Client, job_id: int) -> bool:
    """Whether the job was handed back for want of a free slot."""
    return hand_backs(await client.get_job(job_id)) > 0


async def test_a_job_claimed_ahead_is_handed_back_when_no_slot_frees_in_time(
    dsn: str, client: pgq.Client
) -> None:
    """Handed back, the job is available at once in its place in the queue, and another
    worker runs it while the first is still busy; the first claims none ahead meanwhile,
    so it does not take the job straight back."""
    app, release = quick_and_slow_app(timeout=None)
    async with pgq.Worker(app, dsn, concurrency=1, claim_ahead=1, poll_interval=0.05):
        for job in await client.enqueue_many([pgq.JobSpec("quick") for _ in range(5)]):
            await client.wait(job, timeout=20)  # the producer learns that jobs are short
        blocker = await client.enqueue("slow")
        waiter = await client.enqueue("quick")
        await until(lambda: handed_back(client, waiter.id))
        now = await client.get_job(waiter.id)
        assert now is not None and now.attempt == 0
        assert now.state is pgq.JobState.AVAILABLE
        assert now.scheduled_at == waiter.scheduled_at
        async with pgq.Worker(
            app, dsn, name="second", concurrency=1, claim_ahead=0, poll_interval=0.05
        ):
            done = await client.wait(waiter, timeout=20)
        assert done.state is pgq.JobState.COMPLETED and done.attempt == 1
        assert hand_backs(done) == 1
        assert await _state_is(client, blocker.id, pgq.JobState.RUNNING)
        release.set()
        assert (await client.wait(blocker, timeout=20)).state is pgq.JobState.COMPLETED


async def test_a_job_claimed_ahead_is_handed_back_before_half_its_timeout_is_spent(
    dsn: str, client: pgq.Client
) -> None:
    """A claimed job's timeout runs while it waits for a slot: it is handed back (attempt
    not counted, no timeout error) once half of it is gone, not started with none left."""
    app, release = quick_and_slow_app(timeout=0.6)
    async with pgq.Worker(app, dsn, concurrency=1, claim_ahead=1, poll_interval=0.05):
        blocker = await client.enqueue("slow")

        async def blocker_runs() -> bool:
            return await _state_is(client, blocker.id, pgq.JobState.RUNNING)

        await until(blocker_runs)
        waiter = await client.enqueue("quick")
        await until(lambda: handed_back(client, waiter.id))
        now = await client.get_job(waiter.id)
        assert now is not None and now.attempt == 0
        assert not any(e["kind"] == "timeout" for e in now.errors)
        release.set()
        assert (await client.wait(waiter, timeout=20)).state is pgq.JobState.COMPLETED
        assert (await client.wait(blocker, timeout=20)).state is pgq.JobState.COMPLETED


async def _state_is(client: pgq.Client, job_id: int, state: pgq.JobState) -> bool:
    job = await client.get_job(job_id)
    return job is not None and job.state is state


async def test_jobs_are_claimed_ahead_on_a_limited_queue_only_out_of_room_to_spare(
    dsn: str, client: pgq.Client
) -> None:
    """A limited queue's budget is shared by every worker: beyond its free slots, a worker
    claims ahead only half the room its slots leave, so another worker still finds a slot;
    where the limit is far from binding, it claims ahead as on an unlimited queue."""
    app, began, release = holding_app()
    await client.set_queue_limits("default", concurrency=4)
    await client.enqueue_many([pgq.JobSpec("hold") for _ in range(20)])

    async def running(n: int) -> bool:
        count = await client.pool.fetchval("SELECT count(*) FROM pgq_jobs WHERE state = 'running'")
        return bool(count == n)

    async with pgq.Worker(app, dsn, concurrency=2, claim_ahead=5, poll_interval=0.05):
        # Its 2 slots, and 1 ahead: half of the 2 the slots leave (taking all 4 would leave
        # the second worker idle until a job ends).
        await until(lambda: running(3))
        async with pgq.Worker(app, dsn, concurrency=1, claim_ahead=0, poll_interval=0.05):

            async def third_began() -> bool:
                return len(began) == 3

            await until(third_began)
            assert await running(4)
            release.set()
    # Far from binding: 2 slots and the 5 ahead it asks for.
    app, _, release = holding_app()
    await client.set_queue_limits("default", concurrency=1_000)
    await client.enqueue_many([pgq.JobSpec("hold") for _ in range(20)])
    async with pgq.Worker(app, dsn, concurrency=2, claim_ahead=5, poll_interval=0.05):
        await until(lambda: running(7))
        release.set()
    await client.set_queue_limits("default", concurrency=None)


async def test_a_jobs_timeout_counts_from_its_claim(dsn: str, client: pgq.Client) -> None:
    """A job that waited, claimed, for a slot has that much less of its timeout left: the
    database's deadline (which the rescuer of hung jobs reads) counts from the claim too."""
    app = pgq.App()

    @app.task(timeout=4.0)
    async def nap(ctx: pgq.JobContext, s: float) -> None:
        await anyio.sleep(s)

    # The second waits about 1 s (under half its timeout, so it is not handed back), then
    # naps 3.5 s: within 4 s of its start, past 4 s from its claim.
    first, second = await client.enqueue_many(
        [pgq.JobSpec("nap", {"s": 1.0}), pgq.JobSpec("nap", {"s": 3.5})]
    )
    async with pgq.Worker(app, dsn, concurrency=1, claim_ahead=1, poll_interval=0.05):
        assert (await client.wait(first, timeout=20)).state is pgq.JobState.COMPLETED

        async def timed_out() -> bool:
            now = await client.get_job(second.id)
            return now is not None and any(e["kind"] == "timeout" for e in now.errors)

        await until(timed_out)


async def test_the_burst_check_finds_what_is_runnable_and_reads_no_finished_job(
    conn: "asyncpg.Connection[asyncpg.Record]",
) -> None:
    """A burst ends when ``leftovers`` finds nothing its producer could claim: available
    jobs and due retries of its tasks count; jobs scheduled for later, other tasks' jobs and
    finished jobs do not. Right after a drain, with the statistics still counting every job
    as available, it reads the queue's indexes: no scan of the table and its finished rows."""
    from pgq._db import claims, sql

    plan = claims.ClaimPlan("default", ("noop",), (None,), (3,))

    async def runnable() -> bool:
        return (await claims.leftovers(conn, plan, 30.0)).runnable

    assert not await runnable()
    await conn.execute(
        "INSERT INTO pgq_jobs (task, args) SELECT 'noop', '{}' FROM generate_series(1, 20000)"
    )
    await conn.execute("ANALYZE pgq_jobs")  # the statistics: 20,000 available jobs
    assert await runnable()
    await conn.execute("UPDATE pgq_jobs SET state = 'completed', finalized_at = now(), attempt = 1")
    assert not await runnable()
    plan_json = await conn.fetchval(
        "EXPLAIN (FORMAT JSON) " + sql.RUNNABLE_LEFT, "default", ["noop"], 30.0, None, [], None
    )
    assert "Seq Scan" not in plan_json, plan_json

    await conn.execute("INSERT INTO pgq_jobs (task, args) VALUES ('other', '{}')")
    await conn.execute(
        "INSERT INTO pgq_jobs (task, args, state, scheduled_at)"
        " VALUES ('noop', '{}', 'scheduled', now() + interval '1 hour')"
    )
    assert not await runnable()  # another task's job; one not due yet
    await conn.execute(
        "INSERT INTO pgq_jobs (task, args, state, scheduled_at)"
        " VALUES ('noop', '{}', 'scheduled', now() - interval '1 second')"
    )
    assert await runnable()  # a scheduled job now due (the leader will make it available)
    await conn.execute("DELETE FROM pgq_jobs WHERE state = 'scheduled'")
    assert not await runnable()
    await conn.execute(
        "INSERT INTO pgq_jobs (task, args, state, scheduled_at, attempt)"
        " VALUES ('noop', '{}', 'retryable', now() - interval '1 second', 1)"
    )
    assert await runnable()  # a due retry


async def test_a_claim_updates_its_jobs_through_the_primary_key_not_a_table_scan(
    conn: "asyncpg.Connection[asyncpg.Record]",
) -> None:
    """A claim of hundreds of jobs from a table of tens of thousands updates the jobs it
    locked through the primary key: joined to them instead, the planner hashed the whole
    table on every claim (6 of a 500-job claim's 11 ms at 30,000 rows)."""
    from pgq._db import sql

    await conn.execute(
        "INSERT INTO pgq_jobs (task, args) SELECT 'noop', '{}' FROM generate_series(1, 30000)"
    )
    await conn.execute("VACUUM ANALYZE pgq_jobs")
    args = ("default", ["noop"], 500, uuid.uuid4(), [None], [3], "w", False)
    plan_json = await conn.fetchval("EXPLAIN (FORMAT JSON) " + sql.CLAIM_JOBS, *args)
    assert "Seq Scan" not in plan_json and "Hash" not in plan_json, plan_json
    # Claim order (priority, then schedule time, then id) differs from id order here.
    await conn.execute(
        "UPDATE pgq_jobs SET priority = id % 3,"
        " scheduled_at = scheduled_at - make_interval(secs => (id * 7919) % 1000)"
    )
    first = await conn.fetch(
        "SELECT id FROM pgq_jobs ORDER BY priority DESC, scheduled_at, id LIMIT 500"
    )
    claimed = await conn.fetch(sql.CLAIM_JOBS, *args)
    ids = [r["id"] for r in claimed]
    assert ids == [r["id"] for r in first] and ids != sorted(ids)


async def test_outcome_writes_find_their_jobs_by_id_while_the_statistics_lag(
    conn: "asyncpg.Connection[asyncpg.Record]",
) -> None:
    """Every statement fenced by a running attempt (the outcome writes, the transactional
    settle, the poll for cancel requests) looks its jobs up by primary key, even when the
    statistics were taken while no job ran and thousands run now. Planned from the partial
    index of running jobs instead, each write read every running job: 134 ms against 2 ms
    for 100 outcomes with 100,000 jobs running."""
    from pgq._db import sql

    await conn.execute("ALTER TABLE pgq_jobs SET (autovacuum_enabled = off)")  # stale stays stale
    await conn.execute(
        "INSERT INTO pgq_jobs (task, args) SELECT 'noop', '{}' FROM generate_series(1, 20000)"
    )
    await conn.execute("ANALYZE pgq_jobs")  # the statistics: no job running
    await conn.execute(
        "UPDATE pgq_jobs SET state = 'running', attempt = 1, attempted_at = now(),"
        " attempt_token = gen_random_uuid(), producer_id = gen_random_uuid() WHERE id <= 10000"
    )
    rows = await conn.fetch(
        "SELECT id, attempt_token FROM pgq_jobs WHERE state = 'running' ORDER BY id LIMIT 100"
    )
    ids, tokens = [r["id"] for r in rows], [r["attempt_token"] for r in rows]
    n = len(ids)
    error = '{"attempt": 1, "kind": "exception", "message": "x", "traceback": null}'
    outcomes = (ids, tokens, ["completed"] * n, [None] * n, [None] * n, [None] * n, [0] * n)
    statements = {
        # Each outcome statement as it is written first, and again passing over locked rows.
        "COMPLETE_JOBS": (sql.COMPLETE_JOBS, (*outcomes, False, False, "50ms")),
        "COMPLETE_JOBS skipping": (sql.COMPLETE_JOBS, (*outcomes, True, True, None)),
        "COMPLETE_SUCCESSES": (
            sql.COMPLETE_SUCCESSES,
            (ids, tokens, ["1"] * n, [], False, False, "50ms"),
        ),
        "COMPLETE_SUCCESSES skipping": (
            sql.COMPLETE_SUCCESSES,
            (ids, tokens, ["1"] * n, [], True, True, None),
        ),
        "COMPLETE_SUCCESSES_NO_RESULT": (
            sql.COMPLETE_SUCCESSES_NO_RESULT,
            (ids, tokens, [], False, False, "50ms"),
        ),
        "COMPLETE_SUCCESSES_NO_RESULT skipping": (
            sql.COMPLETE_SUCCESSES_NO_RESULT,
            (ids, tokens, [], True, True, None),
        ),
        "FAIL_ATTEMPT": (sql.FAIL_ATTEMPT, (ids[0], tokens[0], error, True)),
        "SETTLE_ATTEMPT": (
            sql.SETTLE_ATTEMPT,
            (ids[0], tokens[0], uuid.uuid4(), "completed", None, None, None, 0),
        ),
        "CANCEL_REQUESTED": (sql.CANCEL_REQUESTED, (ids,)),
    }
    for name, (statement, args) in statements.items():
        plan_json = await conn.fetchval("EXPLAIN (FORMAT JSON) " + statement, *args)
        assert "pgq_jobs_running_idx" not in plan_json, (name, plan_json)
        assert "pgq_jobs_pkey" in plan_json, (name, plan_json)
    # The fence still holds in that form: the written jobs are running no more, and a second
    # write of the same attempts changes nothing.
    written = await conn.fetchrow(
        sql.COMPLETE_SUCCESSES_NO_RESULT, ids, tokens, [], False, False, None
    )
    assert written is not None and sorted(written["ids"]) == ids
    again = await conn.fetchrow(
        sql.COMPLETE_SUCCESSES_NO_RESULT, ids, tokens, [], True, False, None
    )
    assert again is not None and again["ids"] == [] and again["passed_over"] == []


async def test_a_limited_claim_counts_its_queues_running_jobs_without_reading_the_others(
    conn: "asyncpg.Connection[asyncpg.Record]",
) -> None:
    """A limited queue's claim counts its running jobs (in all, and per limit key) producer
    by producer, without reading the jobs other queues' producers run, also with statistics
    taken while none ran; the jobs of a producer whose row is gone count too (a row deleted
    by hand, or at a worker's stop). Counted by queue, every claim of the limited queue read
    all 10,000 jobs running elsewhere (with 100,000: 14 ms per claim against 1.7 ms)."""
    from pgq._db import codec, sql

    await conn.execute("ALTER TABLE pgq_jobs SET (autovacuum_enabled = off)")  # stale stays stale
    await conn.execute(
        "INSERT INTO pgq_jobs (task, args, queue, limit_key)"
        " SELECT 'noop', '{}', CASE WHEN i <= 10000 THEN 'busy' ELSE 'limited' END,"
        "        CASE WHEN i > 10000 THEN (ARRAY['a', 'b', NULL])[i % 3 + 1] END"
        " FROM generate_series(1, 10030) AS i"
    )
    await conn.execute("ANALYZE pgq_jobs")  # the statistics: no job running
    producers = {"busy": uuid.uuid4(), "limited": uuid.uuid4(), "limited2": uuid.uuid4()}
    for name, pid in producers.items():
        await conn.execute(
            "INSERT INTO pgq_producers (id, worker_id, worker_name, queue, concurrency)"
            " VALUES ($1, $1, $2, $3, 10)",
            pid,
            name,
            name.rstrip("2"),
        )
    run = (
        "UPDATE pgq_jobs SET state = 'running', attempt = 1, attempted_at = now(),"
        " attempt_token = gen_random_uuid(), producer_id = $1 WHERE id = ANY($2::bigint[])"
    )
    busy = await conn.fetch("SELECT id FROM pgq_jobs WHERE queue = 'busy'")
    await conn.execute(run, producers["busy"], [r["id"] for r in busy[5:]])
    # Five of the busy queue's jobs run under a producer whose row is gone.
    await conn.execute(run, uuid.uuid4(), [r["id"] for r in busy[:5]])
    # In the limited queue, two workers run 7 jobs, of keys a, b and none; the second
    # one's row is gone.
    mine = await conn.fetch("SELECT id FROM pgq_jobs WHERE queue = 'limited' ORDER BY id LIMIT 7")
    await conn.execute(run, producers["limited"], [r["id"] for r in mine[:4]])
    await conn.execute(run, producers["limited2"], [r["id"] for r in mine[4:]])
    await conn.execute("DELETE FROM pgq_producers WHERE id = $1", producers["limited2"])
    truth = await conn.fetch(
        "SELECT limit_key, count(*)::int AS n FROM pgq_jobs"
        " WHERE queue = 'limited' AND state = 'running' GROUP BY limit_key"
    )
    assert sum(r["n"] for r in truth) == 7

    assert {r["limit_key"]: r["n"] for r in truth} == {None: 3, "a": 2, "b": 2}

    # Each claim in a transaction rolled back: the jobs it leaves room for say what it
    # counted, and the statistics of the transaction what it read of pgq_jobs.
    # (With autovacuum off, no page is all-visible: an index-only scan fetches its rows too.)
    read_so_far = (
        "SELECT seq_tup_read + idx_tup_fetch FROM pg_stat_xact_user_tables"
        " WHERE relname = 'pgq_jobs'"
    )
    for concurrency, key_concurrency in ((9, None), (None, 3)):
        # 9 at once, 7 running: room for 2. 3 per key: a and b have room for one each, the
        # keyless jobs (3 running) none.
        tx = conn.transaction()
        await tx.start()
        try:
            await conn.execute(
                "INSERT INTO pgq_queues (name, concurrency, key_concurrency) VALUES ('limited', $1, $2)",
                concurrency,
                key_concurrency,
            )
            before = await conn.fetchval(read_so_far)
            row = await conn.fetchrow(
                sql.CLAIM_LIMITED, "limited", ["noop"], 10, 0, producers["limited"], [None], [25],
                "test", 1000, False,
            )  # fmt: skip
            read = await conn.fetchval(read_so_far) - before
        finally:
            await tx.rollback()
        assert row is not None and row["held_back"]
        keys = sorted(j[codec.CLAIM_COLUMNS.index("limit_key")] for j in row["jobs"])
        assert keys == ["a", "b"]
        # A probe per producer running jobs, the available jobs' keys, the 7 jobs and the 5
        # of the busy queue's producer without a row: not the 9,995 of its other one.
        assert read < 1000, (concurrency, key_concurrency, read)


async def test_each_producer_counts_its_own_queues_outcomes(client: pgq.Client, dsn: str) -> None:
    app = pgq.App()

    @app.task(queue="mail", max_attempts=1)
    async def send(ctx: pgq.JobContext, ok: bool) -> None:
        if not ok:
            raise ValueError("bounced")

    @app.task(queue="billing", max_attempts=1)
    async def charge(ctx: pgq.JobContext, ok: bool) -> None:
        if not ok:
            raise ValueError("declined")

    await client.enqueue_many(
        [send.spec(ok=True)] * 3 + [send.spec(ok=False)] + [charge.spec(ok=False)] * 2
    )
    worker = pgq.Worker(app, dsn, queues={"mail": 2, "billing": 2})
    with anyio.fail_after(30):
        await worker.run(burst=True)
    counts = {p["queue"]: (p["completed"], p["failed"]) for p in worker.stats()["producers"]}
    assert counts == {"mail": (3, 1), "billing": (0, 2)}


@pytest.mark.parametrize(("threshold", "told"), [(700, True), (10_000, False)])
async def test_a_worker_with_many_jobs_in_flight_says_when_the_collector_is_not_tuned(
    dsn: str, caplog: pytest.LogCaptureFixture, threshold: int, told: bool
) -> None:
    import gc
    import logging

    app = pgq.App()

    @app.task
    async def t(ctx: pgq.JobContext) -> None: ...

    before = gc.get_threshold()
    gc.set_threshold(threshold)
    try:
        with caplog.at_level(logging.INFO, logger="pgq.worker"):
            await pgq.Worker(app, dsn, concurrency=500).run(burst=True)
    finally:
        gc.set_threshold(*before)
    notes = [r.getMessage() for r in caplog.records if "garbage collector" in r.getMessage()]
    if told:
        (note,) = notes
        assert "first generation at 700" in note and "500 jobs in flight" in note, note
    else:
        assert notes == []
