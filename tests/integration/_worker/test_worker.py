"""A Worker against real Postgres: it runs jobs, wakes on notifications or polls, never runs
a job twice, stops cleanly or at once, runs once, and counts each producer's outcomes."""

import functools
from collections import Counter
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import pgq
from tests.faults.proxy import Proxy
from tests.faults.workers import upstream, via_proxy
from tests.tests_support import blocking_app, burst

pytestmark = pytest.mark.anyio


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
