"""An attempt against real Postgres: its task's call (async or in a thread), its timeout,
and the outcome each way it can end leaves in the job."""

import threading
from collections import Counter
from datetime import datetime
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import pgq
from tests.tests_support import burst

pytestmark = pytest.mark.anyio


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
