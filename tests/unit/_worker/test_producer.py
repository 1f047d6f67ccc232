"""The producer without a database: its identity, claim-ahead sizing, the queue's limits,
the counters, the check of a task's own outcome, then a producer whose attempts and claims
are the test's (batch running, the claim loop), and its slots. Tests wait on the
producer's test signals, never on fixed sleeps."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import anyio
import pytest

import pgq
from pgq._db.claims import QueueLimits
from pgq._worker.attempt import Execution, Outcome
from pgq._worker.liveness import ProducerIdentity
from pgq._worker.outcomes import InTransactionOutcomes
from pgq._worker.producer import (
    LIMITS_REFRESH_S,
    MIN_PATIENCE_S,
    AheadSizing,
    LimitsCache,
    Producer,
    ProducerCounters,
    Signal,
    Slots,
    in_transaction_state,
)
from pgq.app import Task
from pgq.job import Job, JobContext

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def job(job_id: int, task: str = "t") -> Job:
    return pgq.Job(
        job_id, "default", task, {}, pgq.JobState.RUNNING, attempt=1, attempt_token=uuid.uuid4()
    )


# --------------------------------------------------------------------------- signals


async def test_a_signal_wakes_its_waiter_once_it_fired_often_enough() -> None:
    signal = Signal()
    reached = anyio.Event()

    async def wait() -> None:
        await signal.wait(2)
        reached.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        signal.fire()
        await anyio.wait_all_tasks_blocked()
        assert not reached.is_set()
        signal.fire()
        with anyio.fail_after(5):
            await reached.wait()
    assert signal.count == 2
    with anyio.fail_after(1):
        await signal.wait(1)  # already past: at once


# --------------------------------------------------------------------------- identity


def test_an_identity_re_registers_under_one_new_id_until_it_lands() -> None:
    old = uuid.uuid4()
    identity = ProducerIdentity(old)
    assert identity.ids() == [old] and identity.reregistering_as is None
    new = identity.reregister_as()
    assert identity.reregister_as() == new  # a try that timed out: the next reuses it
    assert identity.ids() == [old, new] and identity.id == old
    assert identity.reregistered() == old
    assert identity.id == new and identity.former_ids == [old]
    assert identity.reregistering_as is None and identity.ids() == [new, old]
    identity.former_ids.append(uuid.uuid4())  # a copy: the identity is not changed
    assert identity.former_ids == [old]
    identity.released([old])
    assert identity.former_ids == [] and identity.ids() == [new]


def test_an_identity_tells_the_id_its_claim_in_flight_went_under() -> None:
    identity = ProducerIdentity()
    assert identity.claiming_as is None
    sent = identity.claim_sent()
    assert sent == identity.id == identity.claiming_as
    identity.reregister_as()
    identity.reregistered()
    assert identity.claiming_as == sent != identity.id  # still in flight, under the old id
    identity.claim_ended()
    assert identity.claiming_as is None


# --------------------------------------------------------------------------- sizing


def test_claim_ahead_sizing_waits_for_both_averages_and_is_reset_by_a_long_wait() -> None:
    sizing = AheadSizing(10)
    assert sizing.ahead == 0 and sizing.patience() is None
    sizing.job_took(0.010)  # no claim time yet: nothing to size from
    assert sizing.ahead == 0
    sizing.claim_took(0.001)
    sizing.job_took(0.010)
    assert sizing.ahead == 2
    assert sizing.patience() == MIN_PATIENCE_S  # four short jobs are less than the least
    sizing.waited_too_long()
    assert sizing.ahead == 0 and sizing.patience() is None
    fixed = AheadSizing(10, claim_ahead=3)
    assert fixed.ahead == 3
    fixed.waited_too_long()
    assert fixed.ahead == 0
    fixed.job_took(1.0)  # a job ended: back to the fixed number
    assert fixed.ahead == 3 and fixed.patience() == 4.0


# --------------------------------------------------------------------------- limits


async def test_the_limits_are_read_once_then_again_after_a_change() -> None:
    reads: list[QueueLimits] = []

    async def read() -> QueueLimits:
        reads.append(QueueLimits(concurrency=5))
        return reads[-1]

    limits = LimitsCache(read)
    assert not limits.unlimited and not limits.held_back and not limits.known
    assert (await limits.current(0.0)).limited
    assert limits.known and not limits.unlimited  # limited: jobs ahead only as granted
    await limits.current(1.0)
    assert len(reads) == 1
    limits.changed()
    assert not limits.known  # none claimed ahead until they are read again
    await limits.current(2.0)
    assert len(reads) == 2
    limits.claimed_limited(True, QueueLimits(concurrency=5))
    assert limits.held_back
    limits.claimed_limited(False, QueueLimits())  # cleared meanwhile, seen under the lock
    assert limits.unlimited and not limits.held_back


async def test_a_read_overtaken_by_a_change_is_used_once_and_not_kept() -> None:
    limits: LimitsCache

    async def read() -> QueueLimits:
        limits.changed()  # announced while the read was out
        return QueueLimits()

    limits = LimitsCache(read)
    assert not (await limits.current(0.0)).limited
    assert not limits.unlimited and not limits.known  # not kept: read again before the next claim


async def test_an_unlimited_claim_that_finds_nothing_reads_old_limits_again() -> None:
    async def read() -> QueueLimits:
        return QueueLimits()

    limits = LimitsCache(read)
    await limits.current(100.0)
    limits.claiming_unlimited()
    limits.found_nothing(100.0 + LIMITS_REFRESH_S / 2)
    assert limits.unlimited
    limits.found_nothing(100.0 + LIMITS_REFRESH_S * 2)
    assert not limits.unlimited


# --------------------------------------------------------------------------- counters


def test_the_counters_count_outcomes_as_the_database_took_them() -> None:
    counters = ProducerCounters()
    counters.claim_sent()
    counters.claim_returned(3)
    j = job(1)
    done = Outcome.of(j, "completed")
    failed = Outcome.of(j, "retryable", error="e")
    handed_back = Outcome.of(j, "available", error="e", attempt_delta=-1)
    counters.counted([done, failed, handed_back], accepted=True)
    counters.counted([done], accepted=False)
    counters.counted_in_transaction("completed")
    counters.counted_in_transaction("discarded")
    counters.counted_in_transaction("cancelled")
    assert counters.claims_sent == 1
    assert counters.stats() == {
        "fetches": 1, "claimed": 3, "completed": 2, "failed": 2, "rejected_outcomes": 1,
    }  # fmt: skip


# --------------------------------------------------------------------------- in-transaction outcome


class FakeInTransaction(InTransactionOutcomes):
    """A settler whose check answers ``state``, or raises it."""

    def __init__(self, answer: str | BaseException | None) -> None:
        super().__init__(None, None)  # type: ignore[arg-type]
        self.answer = answer

    async def committed(self, ctx: JobContext) -> str | None:
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


async def test_the_settle_check_answers_the_committed_state_or_none() -> None:
    execution = Execution(job(1))
    assert await in_transaction_state(FakeInTransaction("completed"), execution) == "completed"
    assert await in_transaction_state(FakeInTransaction(None), execution) is None
    unanswered = FakeInTransaction(OSError("cut off"))
    assert await in_transaction_state(unanswered, execution) is None  # the worker writes its own


# --------------------------------------------------------------------------- batch running


class ScriptedClaimer:
    """Answers each claim with the next batch of jobs (then none), recording each limit."""

    def __init__(self, batches: list[list[Job]], before: Any = None) -> None:
        self.batches = batches
        self.limits: list[int] = []
        self.before = before

    async def claim(self, limit: int, producer_id: uuid.UUID, *, slots_free: int) -> list[Job]:
        self.limits.append(limit)
        if self.before is not None:
            self.before()
        return self.batches.pop(0) if self.batches else []


class TestProducer(Producer):
    """A producer whose attempts are the test's (``Parts.execute``) and whose claims a
    :class:`ScriptedClaimer` answers."""

    __test__ = False

    def __init__(self, parts: Parts, concurrency: int, claim_ahead: int) -> None:
        super().__init__(
            queue="default",
            concurrency=concurrency,
            tasks=parts.tasks,
            pool=None,  # type: ignore[arg-type]
            outcomes=parts.outcomes.append,
            limiter=anyio.CapacityLimiter(1),
            poll_interval=3600.0,  # only a wake or a full batch claims again
            fence_after_s=3600.0,
            claim_ahead=claim_ahead,
        )
        self._execute = parts.execute
        self._in_transaction = {"t": FakeInTransaction(None)}
        self.claimer: ScriptedClaimer | None = None

    async def _claim(self, limit: int, producer_id: uuid.UUID, *, slots_free: int) -> list[Job]:
        assert self.claimer is not None
        return await self.claimer.claim(limit, producer_id, slots_free=slots_free)


class Parts:
    """A producer (and the parts it holds) whose attempts complete unless the test holds
    them, and whose outcomes go to a list."""

    def __init__(self, concurrency: int = 1, claim_ahead: int = -1) -> None:
        app = pgq.App()

        @app.task(name="t")
        async def t(ctx: pgq.JobContext) -> None: ...

        self.tasks: dict[str, Task] = dict(app.tasks)
        self.outcomes: list[Outcome] = []
        self.started: list[int] = []
        self.release = anyio.Event()
        self.hold = False
        self.runner = TestProducer(self, concurrency, claim_ahead)
        self.health = self.runner.health
        self.sizing = self.runner.sizing
        self.counters = self.runner.counters

    async def execute(
        self, task: Task, execution: Execution, limiter: anyio.CapacityLimiter
    ) -> Outcome:
        self.started.append(execution.ctx.job.id)
        if self.hold:
            await self.release.wait()
        return Outcome.of(execution.ctx.job, "completed")

    def states(self) -> list[tuple[int, str]]:
        return sorted((o.job_id, o.state) for o in self.outcomes)


async def test_a_batch_runs_each_job_into_a_slot_and_says_when_none_runs() -> None:
    parts = Parts(concurrency=2)
    async with anyio.create_task_group() as tg:
        parts.runner.start(tg, [job(1), job(2), job(3)])
        assert sorted(parts.runner.running) == [1, 2, 3]  # running from the claim
        with anyio.fail_after(5):
            await parts.runner.wait_empty()
    assert parts.states() == [(1, "completed"), (2, "completed"), (3, "completed")]
    assert parts.runner.running == {} and parts.runner.slots.in_use == 0
    assert parts.runner.handed_back.count == 0


async def test_jobs_waiting_for_a_slot_are_handed_back_when_the_producer_fences_itself() -> None:
    parts = Parts(concurrency=1, claim_ahead=2)
    parts.hold = True
    async with anyio.create_task_group() as tg:
        parts.runner.start(tg, [job(1), job(2), job(3)])
        await anyio.wait_all_tasks_blocked()
        assert parts.started == [1] and parts.runner.waiting == 2
        for _ in range(3):  # heartbeats fail: the producer fences itself
            parts.health.beat_failed(OSError("cut off"), 3, 3)
        with anyio.fail_after(5):
            await parts.runner.fenced.wait(2)
        parts.release.set()
    assert parts.started == [1]
    assert parts.states() == [(1, "completed"), (2, "available"), (3, "available")]
    assert parts.runner.handed_back.count == 2


async def test_a_stop_hands_back_the_waiting_jobs_and_lets_the_running_one_end() -> None:
    parts = Parts(concurrency=1, claim_ahead=1)
    parts.hold = True
    async with anyio.create_task_group() as tg:
        parts.runner.start(tg, [job(1), job(2)])
        await anyio.wait_all_tasks_blocked()
        parts.runner.stop_fetching()
        with anyio.fail_after(5):
            await parts.runner.handed_back.wait(1)
        assert parts.runner.fenced.count == 0 and 1 in parts.runner.running
        parts.release.set()
    assert parts.states() == [(1, "completed"), (2, "available")]


# --------------------------------------------------------------------------- claim loop


def claim_loop(parts: Parts, claimer: ScriptedClaimer, concurrency: int) -> TestProducer:
    """The producer of ``parts``, claiming from ``claimer``."""
    assert parts.runner.concurrency == concurrency
    parts.runner.claimer = claimer
    return parts.runner


async def test_the_claim_loop_claims_half_the_slots_and_again_after_a_full_batch() -> None:
    parts = Parts(concurrency=4, claim_ahead=0)
    claimer = ScriptedClaimer([[job(1), job(2)], [job(3)]])
    loop = claim_loop(parts, claimer, concurrency=4)
    async with anyio.create_task_group() as tg:
        tg.start_soon(loop.run)
        with anyio.fail_after(5):
            await loop.claims.wait(2)  # a full batch: claim again at once
            await parts.runner.wait_empty()
        loop.stop_fetching()
    assert claimer.limits == [2, 2]
    assert parts.states() == [(1, "completed"), (2, "completed"), (3, "completed")]
    assert parts.counters.claims_sent == 2 and parts.counters.claimed == 3
    assert not loop.fetching


async def test_a_claim_that_spans_a_fence_is_handed_back_never_started() -> None:
    parts = Parts(concurrency=2, claim_ahead=0)

    def fence() -> None:  # the heartbeats fail while the claim is out
        for _ in range(3):
            parts.health.beat_failed(OSError("cut off"), 3, 0)

    claimer = ScriptedClaimer([[job(1)]], before=fence)
    loop = claim_loop(parts, claimer, concurrency=2)
    async with anyio.create_task_group() as tg:
        tg.start_soon(loop.run)
        with anyio.fail_after(5):
            await parts.runner.fenced.wait(1)
        assert loop.claims.count == 1  # and no claim while fenced
        loop.stop_fetching()
        parts.health.release()
    assert parts.started == [] and parts.states() == [(1, "available")]


# --------------------------------------------------------------------------- slots


async def test_free_slots_are_taken_without_waiting_until_none_is_left() -> None:
    slots = Slots(2)
    assert not slots.locked() and slots.in_use == 0
    assert slots.take_free() and slots.take_free()
    assert slots.in_use == 2
    assert slots.locked() and not slots.take_free()
    slots.release()
    assert not slots.locked() and slots.take_free()


async def test_waiters_get_slots_in_the_order_they_came_and_no_newcomer_cuts_in() -> None:
    slots = Slots(1)
    assert slots.take_free()
    order: list[int] = []
    took = [asyncio.Event() for _ in range(3)]

    async def wait(i: int) -> None:
        await slots.acquire()
        order.append(i)
        took[i].set()

    tasks = [asyncio.create_task(wait(i)) for i in range(3)]
    await asyncio.sleep(0)  # all three are waiting
    slots.release()
    assert not slots.take_free(), "the released slot belongs to the first waiter"
    for i in range(3):
        await asyncio.wait_for(took[i].wait(), 10)
        assert order == list(range(i + 1))
        slots.release()  # the job that took it ends
    await asyncio.gather(*tasks)
    assert slots.take_free() and slots.locked()


async def test_a_waiter_cancelled_while_waiting_leaves_the_line() -> None:
    slots = Slots(1)
    assert slots.take_free()
    first = asyncio.create_task(slots.acquire())
    second = asyncio.create_task(slots.acquire())
    await asyncio.sleep(0)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    slots.release()
    await asyncio.wait_for(second, 10)  # the slot went to the one still waiting
    assert slots.locked()
    slots.release()
    assert not slots.locked()


async def test_a_waiter_cancelled_after_a_slot_was_handed_to_it_passes_the_slot_on() -> None:
    slots = Slots(1)
    assert slots.take_free()
    first = asyncio.create_task(slots.acquire())
    second = asyncio.create_task(slots.acquire())
    await asyncio.sleep(0)
    slots.release()  # handed to the first ...
    first.cancel()  # ... which is cancelled before it resumes
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, 10)
    slots.release()
    assert not slots.locked() and slots.take_free() and not slots.take_free()


async def test_a_timeout_on_the_wait_loses_no_slot() -> None:
    slots = Slots(1)
    assert slots.take_free()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await slots.acquire()
    slots.release()
    assert slots.take_free() and not slots.take_free()


@pytest.mark.parametrize("first", ["handoff", "timeout"])
async def test_a_timeout_in_the_same_tick_as_a_handoff_loses_no_slot(first: str) -> None:
    """Whichever comes first, the waiter either holds the slot or has passed it on."""
    slots = Slots(1)
    assert slots.take_free()
    loop = asyncio.get_running_loop()
    when = loop.time() + 0.05
    released = asyncio.Event()
    holds: list[bool] = []

    def release() -> None:
        slots.release()
        released.set()

    async def wait() -> None:
        try:
            async with asyncio.timeout_at(when):
                await slots.acquire()
        except TimeoutError:
            holds.append(False)
        else:
            holds.append(True)

    task = asyncio.create_task(wait())
    await asyncio.sleep(0)
    loop.call_at(when - 1e-6 if first == "handoff" else when + 1e-6, release)
    await asyncio.wait_for(task, 10)
    await asyncio.wait_for(released.wait(), 10)
    if holds == [True]:
        slots.release()  # the job that took it ends
    assert not slots.locked() and slots.take_free() and not slots.take_free()


def test_a_waiting_coroutine_closed_leaves_the_line() -> None:
    slots = Slots(1)
    assert slots.take_free()

    async def main() -> None:
        waiting = slots.acquire()
        waiting.send(None)  # now waiting in line
        assert slots.locked()
        waiting.close()
        slots.release()

    asyncio.run(main())
    assert slots.take_free() and not slots.take_free()
