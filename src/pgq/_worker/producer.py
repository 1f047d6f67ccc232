"""A producer: claims jobs of one queue into its free slots and runs them."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Mapping
from time import monotonic
from typing import Any

import anyio
import anyio.abc

from pgq._hooks import Hooks
from pgq._store import claims
from pgq._store.claims import ClaimPlan, QueueLimits
from pgq._store.connections import DATABASE_ERRORS, Pool
from pgq._store.producers import Beat
from pgq._worker.executor import (
    FENCED,
    RESCUED,
    SHUTDOWN,
    WAITED,
    Execution,
    internal_failure,
    runner,
    stopped_before_start,
)
from pgq._worker.liveness import ProducerHealth, ProducerIdentity, clock
from pgq._worker.outcome import Outcome
from pgq._worker.resources import ResourceFailures
from pgq._worker.settle import Settler
from pgq._worker.slots import Slots
from pgq.app import Task
from pgq.job import Job

log = logging.getLogger("pgq.producer")

#: While a queue's limits hold its claims back, look again this often: a slot frees when
#: another worker's outcome is written, which nothing announces.
LIMIT_RECHECK_S = 0.1
#: An idle producer of an unlimited queue reads the queue's limits again this often.
LIMITS_REFRESH_S = 10.0

#: Receives each attempt's outcome (the worker's completer).
OutcomeSink = Callable[[Outcome], None]

#: How much the running averages of claim time and job duration move with each sample.
_EWMA = 0.1
#: Claim ahead enough jobs for this many claim round trips' worth of finishing jobs.
AHEAD_ROUND_TRIPS = 2.0
#: A job claimed ahead is handed back if no slot frees within this many average job
#: durations (at least MIN_PATIENCE_S): a worker must not sit on jobs another could run.
PATIENCE_JOBS = 4.0
MIN_PATIENCE_S = 0.25
#: How long the check of a task's own committed outcome may take when it is asked again
#: after a stop interrupted it (a stop must not wait on a database that does not answer).
RECHECK_S = 5.0
#: The most jobs a producer claims ahead of its free slots, however short its jobs.
MAX_AHEAD = 500
#: ... and at most this many per slot: a worker killed outright takes its claimed jobs with
#: it until they are rescued, attempts spent, so what one worker holds stays bounded.
MAX_AHEAD_PER_SLOT = 4
#: A claim asks for up to half the slots, or up to this many when jobs are claimed ahead:
#: larger claims drain short jobs faster but write more WAL per job (docs/architecture.md).
CLAIM_BATCH = 50


class Producer:
    """Runs up to ``concurrency`` jobs of ``queue`` at once.

    It claims jobs for its free slots in one statement (at most half its slots, or up to
    ``CLAIM_BATCH`` with the jobs wanted ahead, so that claims overlap running jobs), when
    notified of new jobs, when a slot frees after a full batch, or every ``poll_interval``. An unhealthy
    producer (its heartbeats keep failing) claims nothing until a heartbeat succeeds.

    With short jobs it also claims some ahead of its free slots (``ahead``): as many as
    finish, on average, during two claim round trips (from running averages of both), at
    most four per slot and ``MAX_AHEAD`` in all, none when jobs take long or the queue has
    flow-control limits; or
    ``claim_ahead`` of them, when that is 0 or more. A claimed job counts as running in the
    database (and for the queue's limits) from its claim; it starts the moment a slot frees,
    in claim order, without waiting for a round trip, unless it waited past its patience
    or the producer stopped or fenced itself meanwhile: then it is handed back unstarted,
    available again at once in its place in the queue, and (after a wait past its patience)
    none is claimed ahead until a job ends.
    """

    def __init__(
        self,
        *,
        queue: str,
        concurrency: int,
        tasks: Mapping[str, Task],
        pool: Pool,
        outcomes: OutcomeSink,
        limiter: anyio.CapacityLimiter,
        poll_interval: float,
        fence_after_s: float,
        hooks: Hooks | None = None,
        worker_name: str = "",
        claim_ahead: int = -1,
        async_commit: bool = False,
    ) -> None:
        #: Its ids: liveness alone changes them (re-registration).
        self.identity = ProducerIdentity()
        self.queue = queue
        self.concurrency = concurrency
        self._worker_name, self._async_commit = worker_name, async_commit
        self.health = ProducerHealth(
            queue, fence_after_s, on_healthy=self.wake, on_fenced=self._hand_back_waiting
        )
        # At most `concurrency` jobs execute at once; claimed jobs beyond them wait here.
        self._gate = Slots(concurrency)
        self._half_slots = max(1, (concurrency + 1) // 2)
        #: Jobs claimed ahead of free slots, wanted now (see the class docstring); fixed
        #: when ``claim_ahead`` is 0 or more, else sized as jobs run.
        self._fixed_ahead = claim_ahead >= 0
        self._claim_ahead = max(claim_ahead, 0)
        self.ahead = self._claim_ahead
        self._claim_s: float | None = None
        # For _learn, once per job: ahead = _ahead_factor * claim time / job time (the
        # jobs that finish during AHEAD_ROUND_TRIPS claims), at most _most_ahead.
        self._ahead_factor = concurrency * AHEAD_ROUND_TRIPS
        self._most_ahead = min(MAX_AHEAD, MAX_AHEAD_PER_SLOT * concurrency)
        self._job_s: float | None = None
        self._tasks = dict(tasks)
        self.plan = ClaimPlan(
            queue,
            tuple(self._tasks),
            tuple(t.timeout for t in self._tasks.values()),
            tuple(t.max_attempts for t in self._tasks.values()),
        )
        self._pool = pool
        self._settlers = {name: Settler(pool, task) for name, task in self._tasks.items()}
        self._outcomes = outcomes
        self._limiter = limiter
        self._poll_interval = poll_interval
        self._hooks = hooks if hooks else None
        self._execute = runner(self._hooks)
        self.running: dict[int, Execution] = {}
        # Claimed and waiting for a slot (a part of `running`).
        self._waiting: set[Execution] = set()
        self._wake = anyio.Event()
        # Set as each job ends (asyncio's own event: set once per job, it skips anyio's layer).
        self._slot = asyncio.Event()
        self._empty = anyio.Event()
        self._empty.set()
        self._stopping = False
        self.resources = ResourceFailures(queue)  # attempts failed for want of a resource
        # The queue's flow-control limits as last read (None: to be read before a claim),
        # and a count of the changes announced, so that a read overtaken by one is not kept.
        self._limits: QueueLimits | None = None
        self._limits_read_at, self._limits_changes = 0.0, 0
        # Set while the queue's limits hold claims back: look again soon, not after a poll.
        self._held_back = False
        #: True while a claim is in flight.
        self.fetching = False
        # Counters, reported in each heartbeat and in Worker.stats().
        self.claims_sent = self.fetches = self.claimed = 0
        self.completed = self.failed = self.rejected_outcomes = 0

    # ------------------------------------------------------------------ control

    def wake(self) -> None:
        """Fetch now (new jobs were announced, or the producer became healthy)."""
        self._wake.set()

    def limits_changed(self) -> None:
        """The queue's limits were set or cleared (or a notification may have been missed):
        read them before the next claim."""
        self._limits = None
        self._limits_changes += 1
        self._wake.set()

    def stop_fetching(self) -> None:
        """Claim nothing more; running jobs go on, jobs claimed ahead are handed back."""
        self._stopping = True
        self._wake.set()
        self._slot.set()
        self.health.release()
        for execution in list(self._waiting):
            execution.cancel(SHUTDOWN)

    def lost(self, job_ids: set[int]) -> None:
        """These jobs' attempts were rescued (re-registration did not adopt them): any of
        them still waiting for a slot is handed back, never started (its outcome is fenced
        out). Those already executing go on, as before, their outcomes rejected."""
        for execution in list(self._waiting):
            if execution.ctx.job.id in job_ids:
                execution.cancel(RESCUED)

    def _hand_back_waiting(self) -> None:
        """The producer fenced itself: every job waiting, claimed ahead, for a slot is
        handed back now (its hand-back is fenced out where a peer rescued it already),
        rather than started once the producer beats again."""
        for execution in list(self._waiting):
            execution.cancel(FENCED)

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
        if self._held_back:
            # Written: the jobs no longer count against the queue's limit. Claim again now.
            self._wake.set()
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

    # ------------------------------------------------------------------ liveness

    @property
    def id(self) -> uuid.UUID:
        """The producer's row id now (re-registration changes it)."""
        return self.identity.id

    def beat(self) -> Beat:
        """This producer's heartbeat row as of now."""
        return Beat(
            self.identity.id,
            len(self.running),
            self.health.healthy,
            self.claimed,
            self.completed,
            self.failed,
            self.rejected_outcomes,
        )

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

    # ------------------------------------------------------------------ loop

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Fetch and run jobs until :meth:`stop_fetching`, then wait for running jobs."""
        async with anyio.create_task_group() as tg:
            task_status.started()
            await self._fetch_loop(tg)

    async def _fetch_loop(self, tg: anyio.abc.TaskGroup) -> None:
        more = True  # fetch at once on start
        failures = 0
        while not self._stopping:
            if not self.health.healthy:
                await self.health.wait_healthy()
                more = True
                continue
            # A limited queue's budget is shared by every worker: claim none ahead there
            # (nor before the limits are known), or one worker would take the whole budget
            # and leave the others idle.
            limits = self._limits
            unlimited = limits is not None and not limits.limited
            capacity = self.concurrency + (self.ahead if unlimited else 0)
            if len(self.running) >= capacity:
                self._slot = asyncio.Event()
                if len(self.running) >= capacity:
                    await self._slot.wait()
                continue
            if not more:
                pause = LIMIT_RECHECK_S if self._held_back else self._poll_interval
                with anyio.move_on_after(pause):
                    await self._wake.wait()
                if self._stopping:
                    continue
            if not self.health.may_claim():
                continue
            # A notification that arrives during the fetch sets the new event: not lost.
            self._wake = anyio.Event()
            # At most half the slots per claim (or CLAIM_BATCH, when that many are free with
            # the jobs wanted ahead): the next claim overlaps the running batch.
            half = max(1, (capacity + 1) // 2)
            limit = min(capacity - len(self.running), max(self._half_slots, min(half, CLAIM_BATCH)))
            fences = self.health.fences
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
                for job in jobs:
                    self._outcomes(stopped_before_start(job, SHUTDOWN))
                break
            if jobs and (fences != self.health.fences or not self.health.may_claim()):
                # The producer fenced itself while the claim was out (the process held up,
                # its heartbeats failing): a peer may have rescued these attempts since the
                # claim committed. Hand them back (fenced out where rescued), never start.
                for job in jobs:
                    self._outcomes(stopped_before_start(job, FENCED))
                continue
            if jobs:
                self._start(tg, jobs)

    async def _fetch(self, limit: int) -> list[Job]:
        self.fetching = True
        try:
            # Shielded: a claim cut off between the server's commit and our reading of the
            # rows would leave jobs running that nobody runs (until rescued).
            started = monotonic()
            producer_id = self.identity.claim_sent()
            self.claims_sent += 1
            with anyio.CancelScope(shield=True), anyio.fail_after(30):
                jobs = await self._claim(limit, producer_id)
            self._claim_s = _average(self._claim_s, monotonic() - started)
        finally:
            self.fetching = False
            self.identity.claim_ended()
        self.fetches += 1
        self.claimed += len(jobs)
        return jobs

    async def _claim(self, limit: int, producer_id: uuid.UUID) -> list[Job]:
        now = anyio.current_time()
        limits = self._limits
        if limits is None:
            changes = self._limits_changes
            limits = await claims.queue_limits(self._pool, self.queue)
            if changes == self._limits_changes:  # else read again next time
                self._limits, self._limits_read_at = limits, now
        if limits.limited:
            jobs, self._held_back, under_lock = await claims.claim_limited(
                self._pool,
                self.plan,
                producer_id,
                self._worker_name,
                limit,
                async_commit=self._async_commit,
            )
            if not under_lock.limited:  # cleared meanwhile: back to the single statement
                self._limits = under_lock
            return jobs
        self._held_back = False
        jobs = await claims.claim(
            self._pool,
            self.plan,
            producer_id,
            self._worker_name,
            limit,
            async_commit=self._async_commit,
        )
        if not jobs and now - self._limits_read_at > LIMITS_REFRESH_S:
            # Limits set while no notification could reach us (poll_only, a lost LISTEN):
            # the unlimited claim yields nothing on a limited queue, so look again.
            self._limits = None
        return jobs

    def _start(self, tg: anyio.abc.TaskGroup, jobs: list[Job]) -> None:
        health, fences, now = self.health, self.health.fences, clock

        def fence() -> bool:
            # Not if the producer fenced itself since the claim, even if it beats again
            # now: a peer may have rescued these attempts meanwhile.
            return health.fences == fences and health.may_start(now())

        executions = [Execution(job, self._settlers[job.task], fence) for job in jobs]
        for execution in executions:
            self.running[execution.ctx.job.id] = execution
        if self._empty.is_set():
            # A new event only when the last was set: one that is waited on must be the one
            # set when the last job ends.
            self._empty = anyio.Event()
        tg.start_soon(self._run_batch, executions, name=f"pgq batch of {len(jobs)}")

    async def _run_batch(self, executions: list[Execution]) -> None:
        """Run one claimed batch, each job in an asyncio task of its own (cheaper than an
        anyio task per job, and cancellable one by one); returns when all have ended."""
        loop = asyncio.get_running_loop()
        tasks = []
        for execution in executions:
            execution.task = loop.create_task(self._run_one(execution))
            tasks.append(execution.task)
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
                self._outcomes(stopped_before_start(job, execution.reason))
                return
            try:
                outcome = await self._execute(task, execution, self._limiter)
            except Exception as exc:  # never an attempt without an outcome
                outcome = internal_failure(job, task, exc)
            finally:
                self._gate.release()
                self._learn(monotonic() - began)
            if outcome.resource is not None:
                self.resources.record(job.task, job.id, outcome.resource)
            if execution.ctx._settled and await self._settled_by_the_task(execution):
                return
            self._outcomes(outcome)
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
        patience = self._patience()
        timeout = self._tasks[job.task].timeout
        if timeout is not None:
            # Its timeout counts from the claim: hand it back while half of it is left,
            # rather than start it with little or no time to run.
            patience = timeout / 2 if patience is None else min(patience, timeout / 2)
        if execution.reason is not None or self._stopping or not self.health.healthy:
            # Cancelled before its task began, or a stop began (or the producer fenced
            # itself) before this job came to wait (stop_fetching and the fence did not see
            # it): none would interrupt the wait.
            execution.reason = execution.reason or (SHUTDOWN if self._stopping else FENCED)
            self._outcomes(stopped_before_start(job, execution.reason))
            return False
        self._waiting.add(execution)
        try:
            async with asyncio.timeout(patience) as waiting:
                await self._gate.acquire()
            return True
        except TimeoutError:
            if not waiting.expired():
                raise
            # The jobs ahead of it take longer than learnt: claim none ahead until a job
            # ends (so that this one is not claimed straight back), and let another
            # worker have it.
            self.ahead, self._job_s = 0, None
            self._outcomes(stopped_before_start(job, WAITED))
            return False
        except asyncio.CancelledError:
            # Cancelled or stopped before a slot freed: cancelled, or handed back.
            if execution.judge_cancel() == "raise":
                raise
            self._outcomes(stopped_before_start(job, execution.reason or SHUTDOWN))
            return False
        finally:
            self._waiting.discard(execution)

    def _patience(self) -> float | None:
        """How long a claimed job may wait for a slot before it is handed back: a few job
        durations as learnt (no limit while nothing is learnt)."""
        if self._job_s is None:
            return None
        return max(MIN_PATIENCE_S, PATIENCE_JOBS * self._job_s)

    def _learn(self, job_s: float) -> None:
        """Fold a job's duration into the running average, and size ``ahead`` from it."""
        # Once per job: _average and the limits inlined.
        average = self._job_s
        average = job_s if average is None else average + _EWMA * (job_s - average)
        self._job_s = average
        if self._fixed_ahead:
            self.ahead = self._claim_ahead
            return
        claim_s = self._claim_s
        if claim_s is None:
            return
        finishing = round(self._ahead_factor * claim_s / (average if average > 1e-6 else 1e-6))
        self.ahead = finishing if finishing < self._most_ahead else self._most_ahead

    async def _settled_by_the_task(self, execution: Execution) -> bool:
        """Whether the task's own transaction settled its attempt and committed: then that
        is the outcome, and the worker writes none (a write would only be fenced out)."""
        settler = self._settlers[execution.ctx.job.task]
        for asked in range(2):
            try:
                # Asked again, the check is bounded: it no longer answers to a stop.
                async with asyncio.timeout(RECHECK_S if asked else None):
                    state = await settler.committed(execution.ctx)
                break
            except asyncio.CancelledError:
                # A stop or cancel request that came as the attempt ended, and interrupted
                # the check: the attempt is over either way. The worker cancels an attempt
                # once, so the check asked again runs to its end. (Interrupted twice, by
                # someone else: the worker's outcome is written, fenced out if need be.)
                if execution.judge_cancel() == "raise":
                    raise
                if asked:
                    return False
            except DATABASE_ERRORS as exc:  # TimeoutError included
                log.warning(
                    "job %d: could not check its transactional outcome (%s); writing the worker's",
                    execution.ctx.job.id,
                    str(exc) or type(exc).__name__,
                )
                return False
        if state == "completed":
            self.completed += 1
        elif state in ("retryable", "discarded"):
            self.failed += 1
        return state is not None

    # ------------------------------------------------------------------ stats

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
            "claim_ahead": self.ahead,
            "fetches": self.fetches,
            "claimed": self.claimed,
            "completed": self.completed,
            "failed": self.failed,
            "rejected_outcomes": self.rejected_outcomes,
            "resource_failures": dict(self.resources.by_task),
        }


def _average(current: float | None, sample: float) -> float:
    """An exponentially weighted running average (the first sample starts it)."""
    return sample if current is None else current + _EWMA * (sample - current)
