"""A producer: the per-queue state machine of a worker, whole. It claims jobs of one queue
into its free slots (and some ahead of them), starts each claimed job as a slot frees,
hands back those that must not start, and sends each attempt's outcome to the worker's
writer. Read top to bottom: the claim loop (:meth:`Producer.run`), the claim, a claimed
batch into the slots, what the rest of the worker asks of it; then the state it keeps in
parts of their own: the queue's limits (:class:`LimitsCache`), claim-ahead sizing
(:class:`AheadSizing`), the slots (:class:`Slots`), its counters and its test signals. Its
ids and health are liveness's (``pgq._worker.liveness``)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from time import monotonic
from typing import Any

import anyio
import anyio.abc

from pgq._core.hooks import Hooks
from pgq._db import claims
from pgq._db.claims import ClaimPlan, QueueLimits
from pgq._db.connections import DATABASE_ERRORS, Pool
from pgq._db.producers import Beat
from pgq._worker.attempt import (
    CANCEL,
    FENCED,
    RESCUED,
    SHUTDOWN,
    WAITED,
    Execution,
    Outcome,
    ResourceFailures,
    internal_failure,
    runner,
    stopped_before_start,
)
from pgq._worker.liveness import ProducerHealth, ProducerIdentity, clock
from pgq._worker.outcomes import InTransactionOutcomes
from pgq.app import Task
from pgq.job import Job

log = logging.getLogger("pgq.producer")

#: While a queue's limits hold its claims back, look again this often: a slot frees when
#: another worker's outcome is written, which nothing announces.
LIMIT_RECHECK_S = 0.1
#: A claim asks for up to half the slots, or up to this many when jobs are claimed ahead:
#: larger claims drain short jobs faster but write more WAL per job (docs/architecture.md).
CLAIM_BATCH = 50
#: How long the check of a task's own committed outcome may take when it is asked again
#: after a stop interrupted it (a stop must not wait on a database that does not answer).
IN_TRANSACTION_RECHECK_S = 5.0

#: Receives each attempt's outcome (the worker's completer).
OutcomeSink = Callable[[Outcome], None]


class Producer:
    """Runs up to ``concurrency`` jobs of ``queue`` at once.

    It claims jobs for the free slots in one statement (at most half the slots, or up to
    ``CLAIM_BATCH`` with the jobs wanted ahead, so that claims overlap running jobs), when
    woken (new jobs announced, the producer healthy again, an outcome written while the
    queue's limits held claims back), when a slot frees after a full batch, or every
    ``poll_interval``. A claimed job counts as running in the database (and for the queue's
    limits) from its claim. At most ``concurrency`` execute at once; the others, claimed
    ahead, wait for a slot in claim order, each for as long as its patience. A job starts
    the moment a slot frees, unless it waited past its patience or the producer stopped or
    fenced itself meanwhile: then it is handed back unstarted, available again at once in
    its place in the queue. An unhealthy producer (its heartbeats keep failing) claims
    nothing until a heartbeat succeeds, and hands back the jobs it holds unstarted; a
    limited queue's claim grants jobs ahead of the free slots only out of room to spare."""

    __slots__ = (
        "_async_commit", "_claim_pool", "_empty", "_execute", "_gate", "_half_slots",
        "_hurry_outcomes", "_in_transaction", "_limiter", "_outcomes", "_poll_interval",
        "_slot", "_stopping", "_tasks", "_waiting", "_wake", "_worker_name", "claims",
        "concurrency", "counters", "fenced", "fetching", "handed_back", "health", "identity",
        "limits", "plan", "queue", "resources", "running", "sizing",
    )  # fmt: skip

    def __init__(
        self,
        *,
        queue: str,
        concurrency: int,
        tasks: Mapping[str, Task],
        pool: Pool,
        outcomes: OutcomeSink,
        hurry_outcomes: Callable[[], None] = lambda: None,
        claim_pool: Pool | None = None,
        limiter: anyio.CapacityLimiter,
        poll_interval: float,
        fence_after_s: float,
        hooks: Hooks | None = None,
        worker_name: str = "",
        claim_ahead: int = -1,
        async_commit: bool = False,
    ) -> None:
        self.queue = queue
        self.concurrency = concurrency
        #: Its ids: liveness alone changes them (re-registration).
        self.identity = ProducerIdentity()
        self.health = ProducerHealth(
            queue, fence_after_s, on_healthy=self.wake, on_fenced=self._fenced
        )
        self._tasks = tasks = dict(tasks)
        self.plan = ClaimPlan(
            queue,
            tuple(tasks),
            tuple(t.timeout for t in tasks.values()),
            tuple(t.max_attempts for t in tasks.values()),
        )
        self.counters = ProducerCounters()
        self.sizing = AheadSizing(concurrency, claim_ahead)
        self.limits = LimitsCache(lambda: claims.queue_limits(pool, queue))
        #: Attempts that failed for want of a resource.
        self.resources = ResourceFailures(queue)
        self._outcomes = outcomes
        self._hurry_outcomes = hurry_outcomes
        self._limiter = limiter
        # How each attempt runs, chosen once from the hooks; and each task's writer of the
        # outcome a task writes in its own transaction (each attempt's context gets it).
        self._execute = runner(hooks if hooks else None)
        self._in_transaction = {
            name: InTransactionOutcomes(pool, task) for name, task in tasks.items()
        }
        # The claim: on claim_pool when given (connections that keep cached plans, which
        # the limited claim's function keeps for its own statements too).
        self._claim_pool = pool if claim_pool is None else claim_pool
        self._worker_name = worker_name
        self._async_commit = async_commit
        # The claim loop.
        self._half_slots = max(1, (concurrency + 1) // 2)
        self._poll_interval = poll_interval
        self._wake = anyio.Event()
        self._stopping = False
        #: True while a claim is in flight.
        self.fetching = False
        # At most `concurrency` jobs execute at once; claimed jobs beyond them wait here.
        self._gate = Slots(concurrency)
        #: Every claimed job not ended yet, by id: executing, or waiting for a slot.
        self.running: dict[int, Execution] = {}
        # Claimed and waiting for a slot (a part of `running`).
        self._waiting: set[Execution] = set()
        # Set as each job ends (asyncio's own event: set once per job, it skips anyio's layer).
        self._slot = asyncio.Event()
        self._empty = anyio.Event()
        self._empty.set()
        #: Test signals: claims that came back (with jobs or without); jobs handed back
        #: unstarted (any reason but a cancel), and those of them handed back because the
        #: producer fenced itself.
        self.claims = Signal()
        self.handed_back = Signal()
        self.fenced = Signal()

    # ------------------------------------------------------------------ the claim loop

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Claim, and start what comes back, until :meth:`stop_fetching`; then wait for the
        running jobs."""
        async with anyio.create_task_group() as tg:
            task_status.started()
            await self._claim_loop(tg)

    async def _claim_loop(self, tg: anyio.abc.TaskGroup) -> None:
        more = True  # fetch at once on start
        failures = 0
        health = self.health
        while not self._stopping:
            if not health.healthy:
                await health.wait_healthy()
                more = True
                continue
            # Jobs ahead of the free slots: not before the limits are known. A limited
            # queue's budget is shared by every worker: its claim grants jobs ahead only out
            # of room to spare, so one worker never takes the whole budget and leaves the
            # others idle.
            capacity = self.concurrency + (self.sizing.ahead if self.limits.known else 0)
            if len(self.running) >= capacity:
                await self._wait_for_room(capacity)
                continue
            if not more:
                pause = LIMIT_RECHECK_S if self.limits.held_back else self._poll_interval
                with anyio.move_on_after(pause):
                    await self._wake.wait()
                if self._stopping:
                    continue
            if not health.may_claim():
                continue
            # A notification that arrives during the fetch sets the new event: not lost.
            self._wake = anyio.Event()
            limit = self._limit(capacity)
            fences = health.fences
            try:
                jobs = await self._fetch(limit)
            except DATABASE_ERRORS as exc:
                failures += 1
                delay = min(self._poll_interval * failures, 5.0)
                log.warning(
                    "queue %s: fetch failed (%s); retrying in %.1fs", self.queue, exc, delay
                )
                more = False
                await anyio.sleep(delay)
                continue
            failures = 0
            more = len(jobs) == limit
            if jobs and self._stopping:
                # Claimed while the worker began to stop: hand them straight back rather
                # than start them.
                self.hand_back(jobs, SHUTDOWN)
                break
            if jobs and (fences != health.fences or not health.may_claim()):
                # The producer fenced itself while the claim was out (the process held up,
                # its heartbeats failing): a peer may have rescued these attempts since the
                # claim committed. Hand them back (fenced out where rescued), never start.
                self.hand_back(jobs, FENCED)
                continue
            if jobs:
                self.start(tg, jobs)

    def _limit(self, capacity: int) -> int:
        """How many jobs the next claim asks for: at most half the slots (or CLAIM_BATCH,
        when that many are free with the jobs wanted ahead): the next claim overlaps the
        running batch."""
        half = max(1, (capacity + 1) // 2)
        free = capacity - len(self.running)
        return min(free, max(self._half_slots, min(half, CLAIM_BATCH)))

    async def _wait_for_room(self, capacity: int) -> None:
        """Return once fewer than ``capacity`` jobs run (at once when they do), or a stop
        began."""
        self._slot = asyncio.Event()
        if len(self.running) >= capacity:
            await self._slot.wait()

    async def _fetch(self, limit: int) -> list[Job]:
        self.fetching = True
        try:
            # Shielded: a claim cut off between the server's commit and our reading of the
            # rows would leave jobs running that nobody runs (until rescued).
            started = monotonic()
            producer_id = self.identity.claim_sent()
            self.counters.claim_sent()
            with anyio.CancelScope(shield=True), anyio.fail_after(30):
                jobs = await self._claim(
                    limit, producer_id, slots_free=self.concurrency - len(self.running)
                )
            self.sizing.claim_took(monotonic() - started)
        finally:
            self.fetching = False
            self.identity.claim_ended()
        self.counters.claim_returned(len(jobs))
        self.claims.fire()
        return jobs

    # ------------------------------------------------------------------ the claim

    async def _claim(self, limit: int, producer_id: uuid.UUID, *, slots_free: int) -> list[Job]:
        """Claim up to ``limit`` jobs of the plan's queue and tasks under ``producer_id``, in
        claim order: in one statement on an unlimited queue, under the queue's lock (usage
        counted) in one call on a limited one. Those beyond ``slots_free`` are claimed
        ahead, which a limited queue grants only where its limits leave room to spare."""
        now = anyio.current_time()
        limits = await self.limits.current(now)
        if limits.limited:
            now_part = max(0, min(limit, slots_free))
            jobs, held_back, under_lock = await claims.claim_limited(
                self._claim_pool,
                self.plan,
                producer_id,
                self._worker_name,
                now_part,
                ahead=limit - now_part,
                async_commit=self._async_commit,
            )
            self.limits.claimed_limited(held_back, under_lock)
            return jobs
        self.limits.claiming_unlimited()
        jobs = await claims.claim(
            self._claim_pool,
            self.plan,
            producer_id,
            self._worker_name,
            limit,
            async_commit=self._async_commit,
        )
        if not jobs:
            self.limits.found_nothing(now)
        return jobs

    # ------------------------------------------------------------------ a claimed batch

    def start(self, tg: anyio.abc.TaskGroup, jobs: list[Job]) -> None:
        """Start a claimed batch in ``tg``: each job executes as a slot frees."""
        health, fences, now = self.health, self.health.fences, clock

        def fence() -> bool:
            # Not if the producer fenced itself since the claim, even if it beats again
            # now: a peer may have rescued these attempts meanwhile.
            return health.fences == fences and health.may_start(now())

        own = self._in_transaction
        executions = [Execution(job, own[job.task], fence) for job in jobs]
        self.admit(executions)
        tg.start_soon(self._run_batch, executions, name=f"pgq batch of {len(jobs)}")

    def admit(self, executions: list[Execution]) -> None:
        """Count claimed attempts as running (from their claim, as the database does)."""
        running = self.running
        for execution in executions:
            running[execution.ctx.job.id] = execution
        if self._empty.is_set():
            # A new event only when the last was set: one that is waited on must be the one
            # set when the last job ends.
            self._empty = anyio.Event()

    def spawn(self, executions: list[Execution]) -> list[asyncio.Task[None]]:
        """Create each admitted attempt's asyncio task (it takes its first step when the
        caller next yields)."""
        loop = asyncio.get_running_loop()
        tasks = []
        for execution in executions:
            execution.task = loop.create_task(self._run_one(execution))
            tasks.append(execution.task)
        return tasks

    async def _run_batch(self, executions: list[Execution]) -> None:
        """Run one claimed batch, each job in an asyncio task of its own (cheaper than an
        anyio task per job, and cancellable one by one); returns when all have ended."""
        tasks = self.spawn(executions)
        try:
            # Each job releases its slot as it ends; the batch only has to outlive them all.
            for t in tasks:
                if not t.done():
                    await asyncio.wait((t,))
                if not t.cancelled() and t.exception() is not None:  # retrieved, never lost
                    log.error("a job's task failed in pgq itself", exc_info=t.exception())
        except BaseException:
            # The worker is being torn down: nothing may outlive this batch.
            for execution in executions:
                execution.tear_down()
            with anyio.CancelScope(shield=True):
                await asyncio.wait(tasks)
            raise

    async def _run_one(self, execution: Execution) -> None:
        execution.started = True  # from here a cancel cancels this task (see Execution)
        job = execution.ctx.job
        task = self._tasks[job.task]
        try:
            began = monotonic()
            if not self._gate.take_free():  # claimed ahead: wait for a slot (most need not)
                if not await self._wait_for_slot(execution):
                    return
                execution.waited_s = monotonic() - began
                began += execution.waited_s
            if execution.reason is None and (self._stopping or not execution.fence()):
                # The slot came after a stop began, or while this producer is fenced (or
                # silent past its fencing bound: its jobs may be rescued any moment, or may
                # have been): hand the job back rather than start it.
                execution.reason = SHUTDOWN if self._stopping else FENCED
            if execution.reason is not None:
                self._gate.release()
                self._not_started(job, execution.reason)
                return
            try:
                outcome = await self._execute(task, execution, self._limiter)
            except Exception as exc:  # never an attempt without an outcome
                outcome = internal_failure(job, task, exc)
            finally:
                self._gate.release()
                self.sizing.job_took(monotonic() - began)
            if outcome.resource is not None:
                self.resources.record(job.task, job.id, outcome.resource)
            if execution.ctx._own_outcomes:
                state = await in_transaction_state(self._in_transaction[job.task], execution)
                if state is not None:  # the task's own transaction wrote the outcome
                    self.counters.counted_in_transaction(state)
                    return
            self._outcome(outcome)
        finally:
            if self.running.get(job.id) is execution:  # not a later attempt of the same job
                del self.running[job.id]
            self._slot.set()
            if not self.running:
                self._empty.set()

    async def _wait_for_slot(self, execution: Execution) -> bool:
        """Wait, claimed, for a slot; False when the job was handed back (its outcome sent)
        instead: cancelled or stopped meanwhile, or no slot freed within the patience."""
        job = execution.ctx.job
        patience = self.sizing.patience()
        timeout = self._tasks[job.task].timeout
        if timeout is not None:
            # Its timeout counts from the claim: hand it back while half of it is left,
            # rather than start it with little or no time to run.
            patience = timeout / 2 if patience is None else min(patience, timeout / 2)
        if execution.reason is not None or self._stopping or not self.health.healthy:
            # Cancelled before its task began, or a stop began (or the producer fenced
            # itself) before this job came to wait (stop and the fence did not see it):
            # none would interrupt the wait.
            execution.reason = execution.reason or (SHUTDOWN if self._stopping else FENCED)
            self._not_started(job, execution.reason)
            return False
        self._waiting.add(execution)
        try:
            async with asyncio.timeout(patience) as waiting:
                await self._gate.acquire()
            return True
        except TimeoutError:
            if not waiting.expired():
                raise
            # The jobs ahead of it take longer than learnt: let another worker have it.
            self.sizing.waited_too_long()
            self._not_started(job, WAITED)
            return False
        except asyncio.CancelledError:
            # Cancelled or stopped before a slot freed: cancelled, or handed back.
            if execution.judge_cancel() == "raise":
                raise
            self._not_started(job, execution.reason or SHUTDOWN)
            return False
        finally:
            self._waiting.discard(execution)

    def hand_back(self, jobs: list[Job], reason: str) -> None:
        """Hand back, unstarted, jobs of a claim that must not start (``reason``: why)."""
        for job in jobs:
            self._not_started(job, reason)

    def _not_started(self, job: Job, reason: str) -> None:
        """The job ends unstarted: cancelled, or handed back (``reason``: why)."""
        self._outcome(stopped_before_start(job, reason))
        if reason != CANCEL:
            self.handed_back.fire()
            if reason == FENCED:
                self.fenced.fire()

    def _outcome(self, outcome: Outcome) -> None:
        """An attempt ended: its outcome to the completer, written at once (not after the
        gather window) while the queue's limits hold claims back: it frees a slot."""
        self._outcomes(outcome)
        if self.limits.held_back:
            self._hurry_outcomes()

    # ------------------------------------------------------------------ control

    def wake(self) -> None:
        """Fetch now (new jobs were announced, or the producer became healthy)."""
        self._wake.set()

    def limits_changed(self) -> None:
        """The queue's limits were set or cleared (or a notification may have been missed):
        read them before the next claim."""
        self.limits.changed()
        self._wake.set()

    def stop_fetching(self) -> None:
        """Claim nothing more and start nothing more; running jobs go on, jobs claimed ahead
        are handed back (those waiting for a slot now, and every job that comes to wait or
        to start from now on)."""
        self._stopping = True
        self._wake.set()
        self.health.release()
        self._slot.set()
        self.cancel_waiting(SHUTDOWN)

    def lost(self, job_ids: set[int]) -> None:
        """These jobs' attempts were rescued (re-registration did not adopt them): any of
        them still waiting for a slot is handed back, never started (its outcome is fenced
        out). Those already executing go on, as before, their outcomes rejected."""
        for execution in list(self._waiting):
            if execution.ctx.job.id in job_ids:
                execution.cancel(RESCUED)

    def _fenced(self) -> None:
        """The producer fenced itself: every job waiting, claimed ahead, for a slot is
        handed back now (its hand-back is fenced out where a peer rescued it already),
        rather than started once the producer beats again."""
        self.cancel_waiting(FENCED)

    def cancel_waiting(self, reason: str) -> None:
        """Hand back every job waiting, claimed ahead, for a slot (``reason``: why)."""
        for execution in list(self._waiting):
            execution.cancel(reason)

    def cancel(self, job_ids: set[int], reason: str) -> list[int]:
        """Stop those of ``job_ids`` this producer runs; returns their ids."""
        hit = [i for i in job_ids if i in self.running]
        for job_id in hit:
            self.running[job_id].cancel(reason)
        return hit

    def cancel_running(self, reason: str) -> None:
        """Cancel every running job; each records its interruption as its outcome."""
        for execution in list(self.running.values()):
            execution.cancel(reason)

    async def wait_empty(self) -> None:
        """Return when no job runs."""
        await self._empty.wait()

    def counted(self, outcomes: list[Outcome], accepted: bool) -> None:
        """Count outcomes of this producer's as the database took them (written, or
        rejected by the fence)."""
        if not outcomes:
            return
        if self.limits.held_back:
            # Written: the jobs no longer count against the queue's limit. Claim again now.
            self._wake.set()
        self.counters.counted(outcomes, accepted)

    # ------------------------------------------------------------------ read

    @property
    def id(self) -> uuid.UUID:
        """The producer's row id now (re-registration changes it)."""
        return self.identity.id

    @property
    def claims_sent(self) -> int:
        """Claims sent so far."""
        return self.counters.claims_sent

    @property
    def slots(self) -> Slots:
        """The execution slots."""
        return self._gate

    @property
    def waiting(self) -> int:
        """How many claimed jobs wait for a slot now."""
        return len(self._waiting)

    def ids(self) -> list[uuid.UUID]:
        """Every id the database may hold jobs of this producer's under."""
        return self.identity.ids()

    def running_ids(self) -> list[int]:
        """The ids of the jobs running now."""
        return list(self.running)

    def knows(self, job_id: int, token: uuid.UUID | None) -> bool:
        """Whether it runs, or holds for a slot, that attempt (job and token)."""
        execution = self.running.get(job_id)
        return execution is not None and execution.ctx.job.attempt_token == token

    def beat(self) -> Beat:
        """This producer's heartbeat row as of now."""
        c = self.counters
        return Beat(
            self.identity.id,
            len(self.running),
            self.health.healthy,
            c.claimed,
            c.completed,
            c.failed,
            c.rejected_outcomes,
        )

    def stats(self) -> dict[str, Any]:
        """A snapshot for :meth:`pgq.Worker.stats`."""
        return {
            "producer_id": str(self.identity.id),
            "queue": self.queue,
            "healthy": self.health.healthy,
            "consecutive_failures": self.health.consecutive_failures,
            "last_heartbeat_ok_at": self.health.last_ok_at,
            "concurrency": self.concurrency,
            "running": len(self.running),
            "executing": self._gate.in_use,
            "claim_ahead": self.sizing.ahead,
            **self.counters.stats(),
            "resource_failures": dict(self.resources.by_task),
        }


async def in_transaction_state(own: InTransactionOutcomes, execution: Execution) -> str | None:
    """After an attempt whose task wrote its outcome in its own transaction: the state that
    committed transaction left the job in; None when none committed, or when that could not
    be told: then the worker writes its outcome (fenced out, if the task's did commit)."""
    for asked in range(2):
        try:
            # Asked again, the check is bounded: it no longer answers to a stop.
            async with asyncio.timeout(IN_TRANSACTION_RECHECK_S if asked else None):
                return await own.committed(execution.ctx)
        except asyncio.CancelledError:
            # A stop or cancel request that came as the attempt ended, and interrupted the
            # check: the attempt is over either way. The worker cancels an attempt once, so
            # the check asked again runs to its end. (Interrupted twice, by someone else:
            # the worker's outcome is written, fenced out if need be.)
            if execution.judge_cancel() == "raise":
                raise
            if asked:
                return None
        except DATABASE_ERRORS as exc:  # TimeoutError included
            log.warning(
                "job %d: could not check its transactional outcome (%s); writing the worker's",
                execution.ctx.job.id,
                str(exc) or type(exc).__name__,
            )
            return None
    return None  # pragma: no cover - the loop returns


#: An idle producer of an unlimited queue reads the queue's limits again this often.
LIMITS_REFRESH_S = 10.0


class LimitsCache:
    """The limits of one queue (None: to be read before the next claim), and whether they
    hold the producer's claims back now."""

    __slots__ = ("_changes", "_held_back", "_limits", "_read", "_read_at")

    def __init__(self, read: Callable[[], Awaitable[QueueLimits]]) -> None:
        self._read = read
        self._limits: QueueLimits | None = None
        # When they were read, and a count of the changes announced, so that a read
        # overtaken by one is not kept.
        self._read_at, self._changes = 0.0, 0
        self._held_back = False

    @property
    def unlimited(self) -> bool:
        """Whether the queue is known to have no limits (claims may go ahead of the slots)."""
        limits = self._limits
        return limits is not None and not limits.limited

    @property
    def known(self) -> bool:
        """Whether the queue's limits are known (read, and no change announced since)."""
        return self._limits is not None

    @property
    def held_back(self) -> bool:
        """Whether the limits held the last claim back: look again soon, not after a poll,
        and as soon as an outcome is written."""
        return self._held_back

    def changed(self) -> None:
        """The queue's limits were set or cleared (or a notification may have been missed):
        read them before the next claim."""
        self._limits = None
        self._changes += 1

    async def current(self, now: float) -> QueueLimits:
        """The limits a claim at ``now`` goes by: as known, or read now (and kept unless a
        change was announced meanwhile)."""
        limits = self._limits
        if limits is None:
            changes = self._changes
            limits = await self._read()
            if changes == self._changes:  # else read again next time
                self._limits, self._read_at = limits, now
        return limits

    def claimed_limited(self, held_back: bool, under_lock: QueueLimits) -> None:
        """A limited claim came back: whether the limits held it back, and the limits as it
        read them under the queue's lock."""
        self._held_back = held_back
        if not under_lock.limited:  # cleared meanwhile: back to the single statement
            self._limits = under_lock

    def claiming_unlimited(self) -> None:
        """An unlimited claim goes out: nothing holds it back."""
        self._held_back = False

    def found_nothing(self, now: float) -> None:
        """An unlimited claim found no job: limits set while no notification could reach
        us (poll_only, a lost LISTEN) would look like this, so read them again if they are
        old."""
        if now - self._read_at > LIMITS_REFRESH_S:
            self._limits = None


#: How much the running averages of claim time and job duration move with each sample.
EWMA = 0.1
#: Claim ahead enough jobs for this many claim round trips' worth of finishing jobs.
AHEAD_ROUND_TRIPS = 2.0
#: A job claimed ahead is handed back if no slot frees within this many average job
#: durations (at least MIN_PATIENCE_S): a worker must not sit on jobs another could run.
PATIENCE_JOBS = 4.0
MIN_PATIENCE_S = 0.25
#: The most jobs a producer claims ahead of its free slots, however short its jobs.
MAX_AHEAD = 500
#: ... and at most this many per slot: a worker killed outright takes its claimed jobs with
#: it until they are rescued, attempts spent, so what one worker holds stays bounded.
MAX_AHEAD_PER_SLOT = 4


class AheadSizing:
    """``ahead``: as many jobs as finish, on average, during two claim round trips (from
    running averages of both), at most four per slot and ``MAX_AHEAD`` in all, none when
    jobs take long; or ``claim_ahead`` of them, when that is 0 or more. A job that waited
    past its patience sets it to none until a job ends."""

    __slots__ = ("_claim_s", "_factor", "_fixed", "_job_s", "_most", "ahead")

    def __init__(self, concurrency: int, claim_ahead: int = -1) -> None:
        #: Jobs to claim ahead of free slots now.
        self.ahead = max(claim_ahead, 0)
        self._fixed = claim_ahead if claim_ahead >= 0 else None
        self._claim_s: float | None = None
        self._job_s: float | None = None
        # For job_took, once per job: ahead = _factor * claim time / job time (the jobs
        # that finish during AHEAD_ROUND_TRIPS claims), at most _most.
        self._factor = concurrency * AHEAD_ROUND_TRIPS
        self._most = min(MAX_AHEAD, MAX_AHEAD_PER_SLOT * concurrency)

    def claim_took(self, claim_s: float) -> None:
        """Fold a claim's round trip into its running average."""
        current = self._claim_s
        self._claim_s = claim_s if current is None else current + EWMA * (claim_s - current)

    def job_took(self, job_s: float) -> None:
        """Fold a job's duration into the running average, and size ``ahead`` from it."""
        # Once per job: the average and the limits inlined.
        average = self._job_s
        average = job_s if average is None else average + EWMA * (job_s - average)
        self._job_s = average
        if self._fixed is not None:
            self.ahead = self._fixed
            return
        claim_s = self._claim_s
        if claim_s is None:
            return
        finishing = round(self._factor * claim_s / (average if average > 1e-6 else 1e-6))
        self.ahead = finishing if finishing < self._most else self._most

    def patience(self) -> float | None:
        """How long a claimed job may wait for a slot before it is handed back: a few job
        durations as learnt (no limit while nothing is learnt)."""
        if self._job_s is None:
            return None
        return max(MIN_PATIENCE_S, PATIENCE_JOBS * self._job_s)

    def waited_too_long(self) -> None:
        """A job claimed ahead found no slot within its patience: the jobs ahead of it take
        longer than learnt. Claim none ahead until a job ends (so that it is not claimed
        straight back), and learn job durations afresh."""
        self.ahead, self._job_s = 0, None


class Slots:
    """A counting gate like :class:`asyncio.Semaphore`, cut to what a producer does once
    per job: :meth:`take_free` takes a free slot without a coroutine, and :meth:`release`
    hands the slot straight to the longest waiter (no newcomer can take it in between).
    ``asyncio.Semaphore`` looks for cancelled waiters with a generator on every check,
    which cost more than the rest of a no-op job's slot handling."""

    __slots__ = ("_free", "_n", "_waiters")

    def __init__(self, n: int) -> None:
        self._n = n
        self._free = n
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def in_use(self) -> int:
        """How many slots are taken."""
        return self._n - self._free

    def locked(self) -> bool:
        """Whether a newcomer would have to wait (no free slot, or others wait already)."""
        return self._free <= 0 or bool(self._waiters)

    def take_free(self) -> bool:
        """Take a slot if one is free and nobody waits; never waits."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return True
        return False

    async def acquire(self) -> None:
        """Take a slot, waiting in line for one if none is free. A waiter stopped (cancelled,
        timed out, closed) leaves the line, and passes on a slot handed to it meanwhile."""
        if self.take_free():
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except BaseException:  # cancelled, timed out, or the coroutine closed
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed a slot, but stopped before it resumed
            elif waiter in self._waiters:  # (release() drops a cancelled one it meets)
                self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        """Give a slot back: to the first waiter still waiting, else to the free ones."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1


class ProducerCounters:
    """Claims sent and returned, jobs claimed, and outcomes as the database took them."""

    __slots__ = ("claimed", "claims_sent", "completed", "failed", "fetches", "rejected_outcomes")

    def __init__(self) -> None:
        self.claims_sent = self.fetches = self.claimed = 0
        self.completed = self.failed = self.rejected_outcomes = 0

    def claim_sent(self) -> None:
        """A claim went out."""
        self.claims_sent += 1

    def claim_returned(self, jobs: int) -> None:
        """A claim came back with ``jobs`` jobs."""
        self.fetches += 1
        self.claimed += jobs

    def counted(self, outcomes: list[Outcome], accepted: bool) -> None:
        """Outcomes as the database took them (written, or rejected by the fence)."""
        if not accepted:
            self.rejected_outcomes += len(outcomes)
            return
        for outcome in outcomes:
            if outcome.state == "completed":
                self.completed += 1
            elif (
                outcome.error is not None
                and outcome.attempt_delta == 0
                and outcome.state != "cancelled"
            ):
                self.failed += 1

    def counted_in_transaction(self, state: str) -> None:
        """A task's own transaction wrote its attempt's outcome (``state``), and committed."""
        if state == "completed":
            self.completed += 1
        elif state in ("retryable", "discarded"):
            self.failed += 1

    def stats(self) -> dict[str, Any]:
        """The counters, for :meth:`pgq.Worker.stats`."""
        return {
            "fetches": self.fetches,
            "claimed": self.claimed,
            "completed": self.completed,
            "failed": self.failed,
            "rejected_outcomes": self.rejected_outcomes,
        }


class Signal:
    """How many times something happened (a claim came back, a job was handed back), and a
    wait until it has happened so many times. Firing costs an addition and a test; the
    event exists only while someone waits."""

    __slots__ = ("_event", "count")

    def __init__(self) -> None:
        #: How many times it fired so far.
        self.count = 0
        self._event: anyio.Event | None = None

    def fire(self, n: int = 1) -> None:
        """It happened ``n`` more times."""
        self.count += n
        event = self._event
        if event is not None:
            self._event = None
            event.set()

    async def wait(self, count: int = 1) -> None:
        """Return once it has happened at least ``count`` times in all."""
        while self.count < count:
            if self._event is None:
                self._event = anyio.Event()
            await self._event.wait()
