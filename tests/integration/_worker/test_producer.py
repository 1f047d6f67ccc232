"""A producer against real Postgres: what it claims, in which order, how many ahead of its
free slots, and what it hands back unstarted."""

import asyncio
import uuid

import anyio
import anyio.lowlevel
import asyncpg
import pytest

import pgq
from pgq._worker.attempt import CANCEL, Execution, Outcome
from pgq._worker.producer import Producer
from tests.tests_support import burst, until

pytestmark = pytest.mark.anyio


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
