"""Unique jobs, periodic jobs, cancel, queue control, retention, results and hooks."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg
import pytest

import pgq
from pgq._worker.leader.retention import Retention
from tests.tests_support import blocking_app, until

if TYPE_CHECKING:
    from tests.tests_support import Conn

pytestmark = pytest.mark.anyio

QUICK: dict[str, Any] = {
    "heartbeat_interval": 0.2,
    "heartbeat_timeout": 0.1,
    "max_heartbeat_failures": 2,
    "stale_after": 1.0,
    "rescue_interval": 0.2,
    "leader_ttl": 1.5,
    "reap_after": 3.0,
    "schedule_interval": 0.05,
    "poll_interval": 0.1,
}


# --------------------------------------------------------------------------- unique


async def test_unique_key_returns_the_existing_job(client: pgq.Client) -> None:
    first = await client.enqueue("t", {"a": 1}, unique_key="report:42")
    again = await client.enqueue("t", {"a": 2}, unique_key="report:42")
    assert not first.duplicate and again.duplicate
    assert again.id == first.id and again.args == {"a": 1}
    assert (await client.count_by_state())[pgq.JobState.AVAILABLE] == 1


async def test_unique_true_derives_the_key_from_task_queue_and_args(client: pgq.Client) -> None:
    a = await client.enqueue("t", {"x": 1, "y": 2}, unique=True)
    b = await client.enqueue("t", {"y": 2, "x": 1}, unique=True)
    c = await client.enqueue("t", {"x": 2}, unique=True)
    d = await client.enqueue("t", {"x": 1, "y": 2}, unique=True, queue="other")
    assert b.duplicate and b.id == a.id
    assert not c.duplicate and not d.duplicate


async def test_unique_period_buckets(client: pgq.Client) -> None:
    from pgq._core.specs import derive_unique_key

    k1 = derive_unique_key("t", "q", "{}", 60, now=120.0)
    k2 = derive_unique_key("t", "q", "{}", 60, now=179.0)
    k3 = derive_unique_key("t", "q", "{}", 60, now=180.0)
    assert k1 == k2 != k3
    a = await client.enqueue("t", unique=True, unique_period=3600)
    b = await client.enqueue("t", unique=True, unique_period=3600)
    assert b.duplicate and b.id == a.id


async def test_enqueue_many_reports_which_were_skipped(client: pgq.Client) -> None:
    existing = await client.enqueue("t", unique_key="k1")
    jobs = await client.enqueue_many(
        [
            pgq.JobSpec("t", {"i": 0}, unique_key="k1"),
            pgq.JobSpec("t", {"i": 1}),
            pgq.JobSpec("t", {"i": 2}, unique_key="k2"),
            pgq.JobSpec("t", {"i": 3}, unique_key="k2"),
            pgq.JobSpec("t", {"i": 4}),
        ]
    )
    assert [j.duplicate for j in jobs] == [True, False, False, True, False]
    assert jobs[0].id == existing.id
    assert jobs[3].id == jobs[2].id
    assert [j.args["i"] for j in (jobs[1], jobs[2], jobs[4])] == [1, 2, 4]
    assert sum((await client.count_by_state()).values()) == 4


async def test_a_finished_job_frees_its_key_unless_its_state_is_listed(
    client: pgq.Client, conn: Conn
) -> None:
    first = await client.enqueue("t", unique_key="once")
    await conn.execute(
        "UPDATE pgq_jobs SET state = 'completed', finalized_at = now() WHERE id = $1", first.id
    )
    second = await client.enqueue("t", unique_key="once")
    assert not second.duplicate and second.id != first.id
    forever = list(pgq.JobState)
    kept = await client.enqueue("t", unique_key="ever", unique_states=forever)
    await conn.execute(
        "UPDATE pgq_jobs SET state = 'completed', finalized_at = now() WHERE id = $1", kept.id
    )
    again = await client.enqueue("t", unique_key="ever", unique_states=forever)
    assert again.duplicate and again.id == kept.id
    with pytest.raises(pgq.ConfigError, match="unknown job state 'done'"):
        await client.enqueue("t", unique_key="x", unique_states=["done"])
    kept_done = ["completed", *(s for s in pgq.JobState if not s.is_final)]
    assert not (await client.enqueue("t", unique_key="done", unique_states=kept_done)).duplicate


async def test_unique_states_leaving_out_a_state_a_job_moves_through_are_refused(
    client: pgq.Client,
) -> None:
    # Free while running, taken while available: a duplicate enqueued while the first job
    # runs would collide with it when it is retried, snoozed or handed back.
    for states, missing in (
        (["available", "scheduled", "retryable", "pending"], "missing: running"),
        (["running"], "missing: scheduled, available, retryable, pending"),
        (list(pgq.JobState)[:-1], "missing: pending"),
        ([], "missing: scheduled, available, running, retryable, pending"),
    ):
        with pytest.raises(pgq.ConfigError, match=missing) as raised:
            await client.enqueue("t", unique_key="k", unique_states=states)
        assert "every state a job passes through before it finishes" in str(raised.value)
    with pytest.raises(pgq.ConfigError, match="^job 1: .* missing: scheduled, running, "):
        await client.enqueue_many(
            [
                pgq.JobSpec("t", unique_key="a"),
                pgq.JobSpec("t", unique_key="b", unique_states=["available"]),
            ]
        )
    assert sum((await client.count_by_state()).values()) == 0  # nothing of the batch written


async def test_retrying_a_finished_job_whose_key_was_taken_leaves_it_finished(
    client: pgq.Client, conn: Conn
) -> None:
    finish = "UPDATE pgq_jobs SET state = $2, finalized_at = now() WHERE id = ANY($1::bigint[])"
    first = await client.enqueue("t", unique_key="report")
    await conn.execute(finish, [first.id], "completed")
    holder = await client.enqueue("t", unique_key="report")  # the key was free again
    other = await client.enqueue("t")
    await conn.execute(finish, [other.id], "discarded")
    assert await client.retry([first.id, other.id]) == [other.id]
    state = "SELECT state::text FROM pgq_jobs WHERE id = $1"
    assert await conn.fetchval(state, first.id) == "completed"
    assert await conn.fetchval(state, holder.id) == "available"
    assert await conn.fetchval(state, other.id) == "available"
    # In the caller's transaction, begun by asyncpg or by a plain BEGIN: it survives.
    async with conn.transaction():
        assert await client.retry([first.id], connection=conn) == []
        assert await conn.fetchval("SELECT count(*) FROM pgq_jobs") == 3
    await conn.execute("BEGIN")
    assert await client.retry([first.id, other.id], connection=conn) == []  # other: available
    assert await conn.fetchval("SELECT count(*) FROM pgq_jobs") == 3
    await conn.execute("COMMIT")
    # Finished jobs sharing a key nobody holds, retried together: the newest is retried.
    a = await client.enqueue("t", unique_key="twice")
    await conn.execute(finish, [a.id], "cancelled")
    c = await client.enqueue("t", unique_key="twice")
    await conn.execute(finish, [c.id], "discarded")
    assert await client.retry([a.id, c.id]) == [c.id]
    assert await conn.fetchval(state, a.id) == "cancelled"
    # A retryable job holds its key: retried with a finished one of the same key, it goes
    # and the finished one stays.
    await conn.execute(
        "UPDATE pgq_jobs SET state = 'retryable', finalized_at = NULL WHERE id = $1", c.id
    )
    assert await client.retry([a.id, c.id]) == [c.id]
    assert await conn.fetchval(state, a.id) == "cancelled"


async def test_unique_states_without_a_key_is_refused(client: pgq.Client) -> None:
    with pytest.raises(pgq.ConfigError, match="give unique_key= or unique=True as well"):
        await client.enqueue("t", unique_states=list(pgq.JobState))
    assert sum((await client.count_by_state()).values()) == 0


async def test_concurrent_enqueuers_of_one_key_make_exactly_one_job(dsn: str) -> None:
    results: list[pgq.Job] = []
    async with pgq.Client(dsn) as client:

        async def enqueuer() -> None:
            for _ in range(5):
                results.append(await client.enqueue("t", unique_key="contended"))

        async with anyio.create_task_group() as tg:
            for _ in range(20):
                tg.start_soon(enqueuer)
        counts = await client.count_by_state()
    assert sum(counts.values()) == 1
    assert len({j.id for j in results}) == 1
    assert sum(not j.duplicate for j in results) == 1


# --------------------------------------------------------------------------- periodic


async def test_periodic_jobs_are_enqueued_once_per_slot_across_leaders(
    dsn: str, conn: Conn
) -> None:
    app = pgq.App()
    ran: list[str] = []

    @app.periodic(every=1, args={"n": 7})
    async def tick(ctx: pgq.JobContext, n: int) -> None:
        ran.append(ctx.job.metadata["pgq_slot"])

    async def slots() -> list[str]:
        return [
            r[0] for r in await conn.fetch("SELECT metadata->>'pgq_slot' FROM pgq_jobs ORDER BY id")
        ]

    # Two leaders in turn, and a third worker that is never leader alongside both.
    for name in ("first", "second"):
        async with pgq.Worker(app, dsn, name=name, **QUICK) as w:
            start = len(await slots())

            async def two_more(start: int = start) -> bool:
                return len(await slots()) >= start + 2

            await until(two_more, limit_s=10)
            assert w.stats()["leader"]
    keys = await slots()
    assert len(keys) == len(set(keys)), "no slot enqueued twice"
    assert await conn.fetchval(
        "SELECT count(*) FROM pgq_jobs WHERE args = '{\"n\": 7}'::jsonb"
    ) == len(keys)


async def test_a_returning_leader_enqueues_at_most_one_missed_slot(dsn: str, conn: Conn) -> None:
    app = pgq.App()

    @app.periodic("* * * * *")
    async def minutely(ctx: pgq.JobContext) -> None: ...

    # The schedule was last run a day ago: 1440 slots were missed while nobody led.
    await conn.execute(
        "INSERT INTO pgq_periodic (name, last_slot) VALUES ('minutely', now() - interval '1 day')"
    )
    async with pgq.Worker(app, dsn, **QUICK):

        async def enqueued() -> bool:
            return bool(await conn.fetchval("SELECT count(*) FROM pgq_jobs"))

        await until(enqueued)
    assert await conn.fetchval("SELECT count(*) FROM pgq_jobs") == 1


async def test_a_new_schedule_waits_for_its_next_slot_unless_run_on_start(
    dsn: str, conn: Conn
) -> None:
    app = pgq.App()

    @app.periodic("0 0 1 1 *")  # next on January 1st
    async def yearly(ctx: pgq.JobContext) -> None: ...

    @app.periodic("0 0 1 1 *", run_on_start=True, name="yearly-now")
    async def yearly_too(ctx: pgq.JobContext) -> None: ...

    async with pgq.Worker(app, dsn, **QUICK) as worker:

        async def baseline() -> bool:
            return bool(await conn.fetchval("SELECT count(*) = 2 FROM pgq_periodic"))

        await until(baseline)
    rows = await conn.fetch("SELECT task FROM pgq_jobs")
    assert [r[0] for r in rows] == ["yearly_too"]
    # The leader records each schedule so that an operator without the App can read it.
    recorded = await conn.fetchrow(
        "SELECT task, queue, schedule, last_slot, next_slot, recorded_by"
        " FROM pgq_periodic WHERE name = 'yearly'"
    )
    assert recorded is not None
    assert (recorded["task"], recorded["queue"]) == ("yearly", "default")
    assert recorded["schedule"] == "0 0 1 1 * (UTC)"
    assert recorded["recorded_by"] == worker.name
    nxt = recorded["next_slot"]
    assert (nxt.month, nxt.day, nxt.hour, nxt.minute) == (1, 1, 0, 0)
    assert nxt > recorded["last_slot"]


# --------------------------------------------------------------------------- cancel


async def test_cancel_before_running_is_immediate(client: pgq.Client) -> None:
    job = await client.enqueue("t", delay=60)
    cancelled = await client.cancel(job.id)
    assert cancelled is not None and cancelled.state is pgq.JobState.CANCELLED
    assert cancelled.finalized_at is not None
    assert cancelled.errors[-1]["message"] == "cancelled by request"
    again = await client.cancel(job.id)  # already final: unchanged
    assert again is not None and again.state is pgq.JobState.CANCELLED


@pytest.mark.parametrize("poll_only", [False, True])
async def test_cancel_of_a_running_async_job(dsn: str, client: pgq.Client, poll_only: bool) -> None:
    app, started = blocking_app()

    job = await client.enqueue("forever")
    async with pgq.Worker(app, dsn, **{**QUICK, "poll_only": poll_only}):
        with anyio.fail_after(10):
            await started.wait()
        assert (await client.cancel(job.id)).state is pgq.JobState.RUNNING  # type: ignore[union-attr]
        done = await client.wait(job.id, timeout=10)
    assert done.state is pgq.JobState.CANCELLED
    assert done.errors[-1]["kind"] == "cancel"


@pytest.mark.parametrize("how", ["cancel request", "shutdown"])
@pytest.mark.parametrize("hook", ["job_started", "job_finished"])
async def test_a_stop_that_lands_in_an_async_hook_still_ends_the_job(
    dsn: str, client: pgq.Client, hook: str, how: str
) -> None:
    """A cancel request or a shutdown reaches the job's task wherever it awaits: inside an
    async ``job_started`` hook (before the task runs) or ``job_finished`` hook (after it
    returned). That hook sees the cancellation; the hooks after it still run; the attempt
    gets its outcome (stopped before it ran: cancelled, or handed back unstarted; or as the
    task finished) and, as every attempt, its ``job_finished``."""
    app = pgq.App()
    in_hook = anyio.Event()
    hook_cancelled: list[bool] = []
    ran: list[int] = []
    finished: list[pgq.JobState | None] = []

    @app.on(hook)  # type: ignore[arg-type]
    async def slow_hook(event: pgq.JobEvent) -> None:
        in_hook.set()
        try:
            await anyio.sleep(30)
        except BaseException:
            hook_cancelled.append(True)
            raise

    @app.on("job_finished")
    def record(event: pgq.JobEvent) -> None:
        finished.append(event.state)

    @app.task
    async def work(ctx: pgq.JobContext) -> str:
        ran.append(ctx.id)
        return "done"

    job = await client.enqueue("work")
    async with pgq.Worker(app, dsn, **{**QUICK, "shutdown_timeout": 0.2}) as worker:
        with anyio.fail_after(10):
            await in_hook.wait()
        if how == "cancel request":
            await client.cancel(job.id)
            await client.wait(job.id, timeout=10)
        else:
            worker.stop()  # the hook outlives the shutdown timeout: the job is cancelled
    done = await client.get_job(job.id)
    assert done is not None
    assert hook_cancelled == [True]
    if hook == "job_finished":
        assert done.state is pgq.JobState.COMPLETED and done.result == "done"
        assert ran == [job.id] and finished == [pgq.JobState.COMPLETED]
    elif how == "cancel request":
        assert done.state is pgq.JobState.CANCELLED and ran == []
        assert done.errors[-1]["kind"] == "cancel"
        assert finished == [pgq.JobState.CANCELLED]
    else:  # handed back unstarted: available again, the attempt not counted
        assert done.state is pgq.JobState.AVAILABLE and ran == [] and done.attempt == 0
        assert done.errors[-1]["kind"] == "shutdown"
        assert finished == [pgq.JobState.AVAILABLE]


@pytest.mark.parametrize("how", ["awaits a cancelled future", "cancels itself"])
async def test_a_cancelled_error_the_worker_did_not_ask_for_fails_the_attempt(
    dsn: str, client: pgq.Client, how: str
) -> None:
    """A task that raises CancelledError the worker did not cause (it awaited a future
    someone else cancelled, or cancelled its own asyncio task) fails like any other
    exception: retried, then discarded; the job is never left running."""
    app = pgq.App()

    @app.task(max_attempts=2, backoff=pgq.Backoff(base_s=0.01, jitter=0))
    async def cancelled_inside(ctx: pgq.JobContext) -> None:
        if how == "cancels itself":
            current = asyncio.current_task()
            assert current is not None
            current.cancel()
            await asyncio.sleep(1)
        fut = asyncio.get_running_loop().create_future()
        fut.cancel()
        await fut

    job = await client.enqueue("cancelled_inside")
    async with pgq.Worker(app, dsn, **QUICK):
        done = await client.wait(job.id, timeout=10)
    assert done.state is pgq.JobState.DISCARDED and done.attempt == 2
    assert [e["kind"] for e in done.errors] == ["exception", "exception"]
    assert done.errors[-1]["message"].startswith("CancelledError")


async def test_a_cancel_request_stops_a_task_that_once_caught_a_cancellation_of_its_own(
    dsn: str, client: pgq.Client
) -> None:
    """A task that cancelled itself and caught it (as an old-style timeout does, leaving its
    asyncio task's cancellation count above zero) is still stopped by a cancel request."""
    app = pgq.App()
    waiting = anyio.Event()

    @app.task
    async def timed_out_once(ctx: pgq.JobContext) -> None:
        current = asyncio.current_task()
        assert current is not None
        current.cancel()
        # its own timeout, handled without uncancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(1)
        waiting.set()
        await asyncio.sleep(30)

    job = await client.enqueue("timed_out_once")
    async with pgq.Worker(app, dsn, **QUICK):
        with anyio.fail_after(10):
            await waiting.wait()
        await client.cancel(job.id)
        done = await client.wait(job.id, timeout=10)
    assert done.state is pgq.JobState.CANCELLED
    assert done.errors[-1]["kind"] == "cancel"


async def test_cancel_of_a_thread_job_sets_cancel_requested(dsn: str, client: pgq.Client) -> None:
    app = pgq.App()
    started, saw = threading.Event(), threading.Event()

    @app.task
    def loop(ctx: pgq.JobContext) -> None:
        started.set()
        for _ in range(1000):
            if ctx.cancel_requested:
                saw.set()
                return
            threading.Event().wait(0.01)

    job = await client.enqueue("loop")
    async with pgq.Worker(app, dsn, **QUICK):
        await anyio.to_thread.run_sync(started.wait, 10)
        await client.cancel(job.id)
        done = await client.wait(job.id, timeout=10)
    assert done.state is pgq.JobState.CANCELLED
    await anyio.to_thread.run_sync(saw.wait, 5)
    assert saw.is_set()


async def test_cancel_racing_completion_ends_in_exactly_one_final_state(
    dsn: str, client: pgq.Client, conn: Conn
) -> None:
    app = pgq.App()

    @app.task
    async def quick(ctx: pgq.JobContext, i: int) -> int:
        await anyio.sleep(0.001 * (i % 5))
        return i

    jobs = await client.enqueue_many([pgq.JobSpec("quick", {"i": i}) for i in range(200)])
    async with pgq.Worker(app, dsn, concurrency=20, **QUICK):
        for job in jobs:
            await client.cancel_many([job.id])
        for job in jobs:
            await client.wait(job.id, timeout=20)
    rows = await conn.fetch("SELECT state::text, finalized_at FROM pgq_jobs")
    assert len(rows) == 200
    assert all(r[0] in ("completed", "cancelled") and r[1] is not None for r in rows)


async def test_a_pending_cancel_request_wins_over_every_outcome_that_would_run_it_again(
    dsn: str, client: pgq.Client
) -> None:
    """The worker never hears of the cancellations (poll only, a poll far away); whatever
    outcome its attempts then write - a failure, a retry, a snooze, a shutdown hand-back -
    the jobs end cancelled and never run again."""
    app = pgq.App()
    started: dict[str, anyio.Event] = {}
    release = anyio.Event()
    starts: list[str] = []

    @app.task(max_attempts=5)
    async def act(ctx: pgq.JobContext, how: str) -> None:
        starts.append(how)
        started[how].set()
        if how == "hang":
            await anyio.sleep(3600)
        await release.wait()
        if how == "raise":
            raise ValueError("failed after the cancel request")
        if how == "retry":
            raise pgq.Retry(delay=0)
        if how == "snooze":
            raise pgq.Snooze(0)

    kinds = ["raise", "retry", "snooze", "hang"]
    started.update({k: anyio.Event() for k in kinds})
    jobs = await client.enqueue_many([pgq.JobSpec("act", {"how": k}) for k in kinds])
    settings = {**QUICK, "poll_only": True, "poll_interval": 60.0, "shutdown_timeout": 0.5}
    async with pgq.Worker(app, dsn, queues={"default": 4}, **settings) as worker:
        with anyio.fail_after(10):
            for event in started.values():
                await event.wait()
        states = await client.cancel_many([j.id for j in jobs])
        assert set(states.values()) == {pgq.JobState.RUNNING}, "requests only"
        release.set()
        for job in jobs[:3]:
            await client.wait(job.id, timeout=10)
        worker.stop()  # the hanging job is handed back at shutdown
    for job in jobs:
        done = await client.get_job(job.id)
        assert done is not None and done.state is pgq.JobState.CANCELLED, job.args
        assert done.errors[-1]["message"] == "cancelled by request"
    assert sorted(starts) == sorted(kinds), "no job ran again"


async def test_attempts_are_counted_exactly_before_a_discard(dsn: str, client: pgq.Client) -> None:
    app = pgq.App()
    starts: list[int] = []

    @app.task(max_attempts=3, backoff=pgq.Backoff(base_s=0.01, jitter=0))
    async def flaky(ctx: pgq.JobContext) -> None:
        starts.append(ctx.attempt)
        if len(starts) == 1:
            raise pgq.Snooze(0)  # does not use an attempt
        raise ValueError("always")

    job = await client.enqueue("flaky")
    async with pgq.Worker(app, dsn, **QUICK):
        done = await client.wait(job.id, timeout=20)
    assert done.state is pgq.JobState.DISCARDED
    assert starts == [1, 1, 2, 3]
    assert [e["attempt"] for e in done.errors] == [1, 2, 3]


# --------------------------------------------------------------------------- pause


async def test_pause_stops_every_worker_and_resume_restarts_them(
    dsn: str, client: pgq.Client, conn: Conn
) -> None:
    app = pgq.App()
    ran: Counter[str] = Counter()

    @app.task(queue="mail")
    async def send(ctx: pgq.JobContext) -> None:
        ran[ctx.job.metadata["batch"]] += 1

    await client.pause_queue("mail")
    async with (
        pgq.Worker(app, dsn, name="w1", **QUICK) as w1,
        pgq.Worker(app, dsn, name="w2", **QUICK) as w2,
    ):
        paused = await client.enqueue_many(
            [pgq.JobSpec("send", queue="mail", metadata={"batch": "a"}) for _ in range(10)]
        )
        assert len(paused) == 10, "a paused queue still accepts jobs"
        # Several fetches by each worker pass (a poll is 0.1 s) and claim nothing.
        before = [_producer(w)["fetches"] for w in (w1, w2)]

        async def fetched_thrice() -> bool:
            now = [_producer(w)["fetches"] for w in (w1, w2)]
            return all(n >= b + 3 for n, b in zip(now, before, strict=True))

        await until(fetched_thrice)
        assert [_producer(w)["claimed"] for w in (w1, w2)] == [0, 0]
        assert ran == Counter()
        await client.resume_queue("mail")
        for job in paused:
            await client.wait(job.id, timeout=10)
        assert ran["a"] == 10
        await client.pause_queue("*")
        (later,) = await client.enqueue_many(
            [pgq.JobSpec("send", queue="mail", metadata={"batch": "b"})]
        )
        await anyio.sleep(0.5)
        assert ran["b"] == 0
        await client.resume_queue("*")
        await client.wait(later.id, timeout=10)
    assert ran["b"] == 1
    queues = {q.name: q for q in await client.list_queues()}
    assert not queues["mail"].paused


async def test_a_burst_worker_ends_when_its_queue_is_paused(dsn: str, client: pgq.Client) -> None:
    app = pgq.App()

    @app.task(queue="mail")
    async def send(ctx: pgq.JobContext) -> None:
        raise AssertionError("a paused queue's job ran")

    for paused in ("mail", "*"):
        await client.pause_queue(paused)
        job = await client.enqueue("send", queue="mail")
        with anyio.fail_after(10):
            await pgq.Worker(app, dsn, **QUICK).run(burst=True)
        stored = await client.get_job(job.id)
        assert stored is not None and stored.state is pgq.JobState.AVAILABLE
        await client.resume_queue(paused)


# --------------------------------------------------------------------------- retention


async def test_retention_deletes_old_finished_jobs_only(
    dsn: str, client: pgq.Client, conn: Conn
) -> None:
    ids = {}
    for state in ("completed", "cancelled", "discarded"):
        ids[state] = await conn.fetchval(
            "INSERT INTO pgq_jobs (task, state, finalized_at) VALUES ('t', $1, now() - interval '2 hours')"
            " RETURNING id",
            state,
        )
    for state in ("available", "scheduled", "retryable"):
        ids[state] = await conn.fetchval(
            "INSERT INTO pgq_jobs (task, state, created_at, scheduled_at) VALUES ('t', $1,"
            " now() - interval '30 days', now() + interval '1 day') RETURNING id",
            state,
        )
    recent = await conn.fetchval(
        "INSERT INTO pgq_jobs (task, state, finalized_at) VALUES ('t', 'completed', now()) RETURNING id"
    )
    settings = {
        **QUICK,
        "retention_completed": 3600,
        "retention_cancelled": 3600,
        "retention_discarded": None,
    }
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
    assert pool is not None
    try:
        retention = Retention(pool, pgq.WorkerSettings.resolve(settings))
        assert await retention.run_once() == 2
    finally:
        await pool.close()
    left = {r[0] for r in await conn.fetch("SELECT id FROM pgq_jobs")}
    assert ids["completed"] not in left and ids["cancelled"] not in left
    assert ids["discarded"] in left, "None keeps forever"
    assert {ids["available"], ids["scheduled"], ids["retryable"], recent} <= left


# --------------------------------------------------------------------------- results


async def test_wait_returns_the_result_or_the_errors(dsn: str, client: pgq.Client) -> None:
    app = pgq.App()

    @app.task
    async def double(ctx: pgq.JobContext, n: int) -> dict[str, int]:
        return {"double": n * 2}

    @app.task(max_attempts=1)
    async def broken(ctx: pgq.JobContext) -> None:
        raise ValueError("nope")

    ok = await client.enqueue("double", {"n": 21})
    bad = await client.enqueue("broken")
    async with pgq.Worker(app, dsn, **QUICK):
        done = await client.wait(ok.id, timeout=10)
        failed = await client.wait(bad.id, timeout=10)
    assert done.state is pgq.JobState.COMPLETED and done.result == {"double": 42}
    assert (
        failed.state is pgq.JobState.DISCARDED and failed.errors[0]["message"] == "ValueError: nope"
    )


async def test_wait_times_out_and_knows_unknown_jobs(client: pgq.Client) -> None:
    job = await client.enqueue("nobody_runs_this")
    with pytest.raises(TimeoutError):
        await client.wait(job.id, timeout=0.3)
    with pytest.raises(LookupError, match="no job 999999"):
        await client.wait(999999, timeout=1)


# --------------------------------------------------------------------------- hooks


async def test_middleware_and_events(dsn: str, client: pgq.Client) -> None:
    app = pgq.App()
    seen: list[tuple[str, int, str | None]] = []
    order: list[str] = []

    @app.middleware
    async def outer(ctx: pgq.JobContext, call_next: Any) -> Any:
        order.append("outer in")
        try:
            return await call_next()
        finally:
            order.append("outer out")

    @app.middleware
    async def inner(ctx: pgq.JobContext, call_next: Any) -> Any:
        order.append("inner in")
        result = await call_next()
        return {"wrapped": result}

    @app.on("job_started")
    def started(event: pgq.JobEvent) -> None:
        seen.append((event.name, event.job.id, None))

    @app.on("job_finished")
    async def finished(event: pgq.JobEvent) -> None:
        seen.append((event.name, event.job.id, event.state.value if event.state else None))

    @app.on("job_retried")
    def retried(event: pgq.JobEvent) -> None:
        seen.append((event.name, event.job.id, event.error["message"] if event.error else None))

    @app.on("job_finished")
    def broken_hook(event: pgq.JobEvent) -> None:
        raise RuntimeError("a failing hook never loses a job")

    @app.task(backoff=pgq.Backoff(base_s=0.01, jitter=0), max_attempts=2)
    async def flaky(ctx: pgq.JobContext) -> str:
        order.append("task")
        if ctx.attempt == 1:
            raise ValueError("first time")
        return "ok"

    job = await client.enqueue("flaky")
    async with pgq.Worker(app, dsn, **QUICK):
        done = await client.wait(job.id, timeout=10)
    assert done.state is pgq.JobState.COMPLETED and done.result == {"wrapped": "ok"}
    assert order == ["outer in", "inner in", "task", "outer out"] * 2
    assert seen == [
        ("job_started", job.id, None),
        ("job_finished", job.id, "retryable"),
        ("job_retried", job.id, "ValueError: first time"),
        ("job_started", job.id, None),
        ("job_finished", job.id, "completed"),
    ]


async def test_failing_middleware_retries_the_job(dsn: str, client: pgq.Client) -> None:
    app = pgq.App()
    calls = Counter[str]()

    @app.middleware
    async def flaky_middleware(ctx: pgq.JobContext, call_next: Any) -> Any:
        calls["mw"] += 1
        if ctx.attempt == 1:
            raise ConnectionError("metrics backend down")
        return await call_next()

    @app.task(backoff=pgq.Backoff(base_s=0.01, jitter=0))
    async def work(ctx: pgq.JobContext) -> str:
        return "done"

    job = await client.enqueue("work")
    async with pgq.Worker(app, dsn, **QUICK):
        done = await client.wait(job.id, timeout=10)
    assert done.state is pgq.JobState.COMPLETED and done.attempt == 2
    assert "metrics backend down" in done.errors[0]["message"]


def rescue_listening_app() -> tuple[pgq.App, list[pgq.JobEvent]]:
    """An App with a no-op task ``t`` and a hook that keeps every job_rescued event."""
    app = pgq.App()
    rescued: list[pgq.JobEvent] = []
    app.on("job_rescued")(rescued.append)

    @app.task
    async def t(ctx: pgq.JobContext) -> None: ...

    return app, rescued


async def test_rescued_event_fires_in_the_leader(dsn: str, client: pgq.Client, conn: Conn) -> None:
    import uuid

    app, rescued = rescue_listening_app()

    ghost = uuid.uuid4()
    job_id = await conn.fetchval(
        "INSERT INTO pgq_jobs (task, state, attempt, producer_id, attempted_at) VALUES"
        " ('t', 'running', 1, $1, now() - interval '1 hour') RETURNING id",
        ghost,
    )
    async with pgq.Worker(app, dsn, **QUICK):
        await client.wait(job_id, timeout=10)
    assert [(e.job.id, e.reason) for e in rescued] == [(job_id, "producer row missing")]


async def test_a_job_rescued_hook_that_never_returns_holds_up_no_rescue(
    dsn: str, client: pgq.Client, conn: Conn
) -> None:
    """The leader rescues a job whose hook hangs, then another, rescued in a later round:
    the hook holds up neither the round nor the job."""
    import uuid

    app = pgq.App()
    heard: list[int] = []
    entered = anyio.Event()

    @app.on("job_rescued")
    async def hang(event: pgq.JobEvent) -> None:
        heard.append(event.job.id)
        entered.set()
        await anyio.Event().wait()  # never set

    @app.task
    async def t(ctx: pgq.JobContext) -> None: ...

    ghost = "INSERT INTO pgq_jobs (task, state, attempt, producer_id, attempted_at) VALUES" \
        " ('t', 'running', 1, $1, now() - interval '1 hour') RETURNING id"  # fmt: skip
    first = await conn.fetchval(ghost, uuid.uuid4())
    async with pgq.Worker(app, dsn, **QUICK) as worker:
        await client.wait(first, timeout=10)
        with anyio.fail_after(10):
            await entered.wait()
        second = await conn.fetchval(ghost, uuid.uuid4())
        done = await client.wait(second, timeout=10)
        assert done.state is pgq.JobState.COMPLETED

        async def both_waiting() -> bool:  # the second queued behind the hanging first
            return bool(worker.stats()["rescue_events_waiting"] == 2)

        await until(both_waiting)
        assert heard == [first]
        # pgq's own metric counts each rescue at once, whatever the App's hook does.
        metric = 'pgq_jobs_rescued_total{reason="producer row missing"} 2.0'
        assert metric in (await worker.render_metrics()).decode()


@pytest.mark.parametrize("row_deletable", [True, False])
async def test_rescued_event_fires_when_a_restarted_worker_takes_over_its_previous_run(
    dsn: str, client: pgq.Client, conn: Conn, row_deletable: bool
) -> None:
    """A worker restarted under its stable name takes its previous run's jobs back (not the
    leader: stale_after is far off) and reports each to its job_rescued hooks, also when
    deleting the previous run's row then fails."""
    import uuid

    if not row_deletable:
        await conn.execute(REFUSE_PRODUCER_DELETES)

    app, rescued = rescue_listening_app()

    previous = uuid.uuid4()
    # The previous run's row: silent for 5 s, past its fencing bound of 0.5 s, and far from
    # the 60 s after which the leader would rescue it.
    await conn.execute(
        "INSERT INTO pgq_producers (id, worker_id, worker_name, queue, concurrency,"
        " heartbeat_at, fence_after_s)"
        " VALUES ($1, $2, 'stable-7', 'default', 5, now() - interval '5 seconds', 0.5)",
        previous,
        uuid.uuid4(),
    )
    job_id = await conn.fetchval(
        "INSERT INTO pgq_jobs (task, state, attempt, producer_id, attempted_at) VALUES"
        " ('t', 'running', 1, $1, now() - interval '5 seconds') RETURNING id",
        previous,
    )
    async with pgq.Worker(
        app, dsn, name="stable-7", **{**QUICK, "stale_after": 60.0, "reap_after": 120.0}
    ):
        job = await client.wait(job_id, timeout=10)
    assert job.state is pgq.JobState.COMPLETED and job.attempt == 2
    assert [(e.job.id, e.job.task, e.job.attempt, e.reason) for e in rescued] == [
        (job_id, "t", 1, "worker restarted")
    ]
    # A takeover applies no backoff: the job is runnable at once, without a promotion.
    assert rescued[0].state is pgq.JobState.AVAILABLE
    left = await conn.fetchval("SELECT count(*) FROM pgq_producers WHERE id = $1", previous)
    assert left == (0 if row_deletable else 1)


#: A real error for every delete of a producer row.
REFUSE_PRODUCER_DELETES = """
CREATE FUNCTION refuse_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'deletes refused by the test'; END $$;
CREATE TRIGGER refuse_delete BEFORE DELETE ON pgq_producers
    FOR EACH ROW EXECUTE FUNCTION refuse_delete();
"""


def _producer(worker: pgq.Worker) -> dict[str, Any]:
    (producer,) = worker.stats()["producers"]
    return dict(producer)


async def job_of_a_run_named(conn: Conn, name: str, heartbeat_at: str) -> int:
    """A producer row of another run under ``name`` (its heartbeat the SQL expression
    ``heartbeat_at``, fencing bound 1 s), and a job of task 't' running under it."""
    import uuid

    producer = uuid.uuid4()
    await conn.execute(
        "INSERT INTO pgq_producers (id, worker_id, worker_name, queue, concurrency,"
        f" heartbeat_at, fence_after_s) VALUES ($1, $2, $3, 'default', 5, {heartbeat_at}, 1.0)",
        producer,
        uuid.uuid4(),
        name,
    )
    return int(
        await conn.fetchval(
            "INSERT INTO pgq_jobs (task, state, attempt, producer_id, attempted_at) VALUES"
            " ('t', 'running', 1, $1, now()) RETURNING id",
            producer,
        )
    )


async def burst_under_name(app: pgq.App, dsn: str, name: str) -> None:
    """Run a burst worker named ``name`` (far from stale_after) to its end."""
    with anyio.fail_after(30):
        await pgq.Worker(
            app, dsn, name=name, **{**QUICK, "stale_after": 60.0, "reap_after": 120.0}
        ).run(burst=True)


async def test_a_burst_worker_restarted_under_its_name_runs_its_previous_runs_jobs_first(
    dsn: str, client: pgq.Client, conn: Conn
) -> None:
    """The previous run (killed) beat a moment ago: its job is running and not yet past the
    fencing bound, so neither rescuable nor gone. A burst worker of the same name waits
    for the bound, takes the job over and runs it before it exits, instead of leaving it
    running."""

    app = pgq.App()

    @app.task
    async def t(ctx: pgq.JobContext) -> None: ...

    job_id = await job_of_a_run_named(conn, "stable-8", "now()")
    await burst_under_name(app, dsn, "stable-8")
    job = await client.get_job(job_id)
    assert job is not None and job.state is pgq.JobState.COMPLETED and job.attempt == 2, job


async def test_a_burst_worker_does_not_wait_for_a_live_process_of_its_name(
    dsn: str, client: pgq.Client, conn: Conn
) -> None:
    """Another process under the same name that beats on (its heartbeat newer than the
    burst's start) keeps its running job, and the burst worker exits without waiting for
    it."""

    app = pgq.App()

    @app.task
    async def t(ctx: pgq.JobContext) -> None: ...

    # Its heartbeat an hour ahead: it beats on, whenever the burst looks.
    job_id = await job_of_a_run_named(conn, "stable-9", "now() + interval '1 hour'")
    await burst_under_name(app, dsn, "stable-9")
    job = await client.get_job(job_id)
    assert job is not None and job.state is pgq.JobState.RUNNING and job.attempt == 1, job
