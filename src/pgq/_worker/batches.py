"""Batch running: a producer's claimed jobs started into its execution slots, each in an
asyncio task of its own, with the fencing check before each start; and the hand-back of
those that must not start."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Mapping
from time import monotonic

import anyio
import anyio.abc

from pgq._worker.attempt import (
    CANCEL,
    FENCED,
    SHUTDOWN,
    WAITED,
    Execution,
    Outcome,
    ResourceFailures,
    Runner,
    internal_failure,
    stopped_before_start,
)
from pgq._worker.counters import ProducerCounters
from pgq._worker.liveness import ProducerHealth, clock
from pgq._worker.settle_check import SettleCheck
from pgq._worker.signals import Signal
from pgq._worker.sizing import AheadSizing
from pgq._worker.slots import Slots
from pgq.app import Task
from pgq.job import Job

log = logging.getLogger("pgq.producer")

#: Receives each attempt's outcome (the worker's completer).
OutcomeSink = Callable[[Outcome], None]


class BatchRunner:
    """Runs claimed jobs: at most ``concurrency`` execute at once, the others (claimed
    ahead) wait for a slot in claim order, each for as long as its patience. A job starts
    the moment a slot frees, without waiting for a round trip, unless it waited past its
    patience or the producer stopped or fenced itself meanwhile: then it is handed back
    unstarted, available again at once in its place in the queue."""

    __slots__ = (
        "_counters", "_empty", "_execute", "_gate", "_health", "_limiter", "_outcomes",
        "_settle", "_sizing", "_slot", "_stopping", "_tasks", "_waiting", "fenced",
        "handed_back", "resources", "running",
    )  # fmt: skip

    def __init__(
        self,
        *,
        concurrency: int,
        tasks: Mapping[str, Task],
        execute: Runner,
        settle: SettleCheck,
        outcomes: OutcomeSink,
        limiter: anyio.CapacityLimiter,
        health: ProducerHealth,
        sizing: AheadSizing,
        counters: ProducerCounters,
        resources: ResourceFailures,
    ) -> None:
        self._tasks = tasks
        self._execute = execute
        self._settle = settle
        self._outcomes = outcomes
        self._limiter = limiter
        self._health = health
        self._sizing = sizing
        self._counters = counters
        #: Attempts that failed for want of a resource.
        self.resources = resources
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
        self._stopping = False
        #: Test signals: jobs handed back unstarted (any reason but a cancel), and those of
        #: them handed back because the producer fenced itself.
        self.handed_back = Signal()
        self.fenced = Signal()

    # ------------------------------------------------------------------ read

    @property
    def slots(self) -> Slots:
        """The execution slots."""
        return self._gate

    @property
    def waiting(self) -> int:
        """How many claimed jobs wait for a slot now."""
        return len(self._waiting)

    def knows(self, job_id: int, token: uuid.UUID | None) -> bool:
        """Whether it runs, or holds for a slot, that attempt (job and token)."""
        execution = self.running.get(job_id)
        return execution is not None and execution.ctx.job.attempt_token == token

    async def wait_empty(self) -> None:
        """Return when no job runs."""
        await self._empty.wait()

    async def wait_for_room(self, capacity: int) -> None:
        """Return once fewer than ``capacity`` jobs run (at once when they do), or a stop
        began."""
        self._slot = asyncio.Event()
        if len(self.running) >= capacity:
            await self._slot.wait()

    # ------------------------------------------------------------------ control

    def stop(self) -> None:
        """Start nothing more: the jobs waiting for a slot are handed back, and every job
        that comes to wait or to start from now on."""
        self._stopping = True
        self._slot.set()
        self.cancel_waiting(SHUTDOWN)

    def cancel_waiting(self, reason: str) -> None:
        """Hand back every job waiting, claimed ahead, for a slot (``reason``: why)."""
        for execution in list(self._waiting):
            execution.cancel(reason)

    def cancel_waiting_among(self, job_ids: set[int], reason: str) -> None:
        """Hand back those of ``job_ids`` still waiting for a slot."""
        for execution in list(self._waiting):
            if execution.ctx.job.id in job_ids:
                execution.cancel(reason)

    def cancel(self, job_ids: set[int], reason: str) -> list[int]:
        """Stop those of ``job_ids`` that run here; returns their ids."""
        hit = [i for i in job_ids if i in self.running]
        for job_id in hit:
            self.running[job_id].cancel(reason)
        return hit

    def cancel_running(self, reason: str) -> None:
        """Cancel every running job; each records its interruption as its outcome."""
        for execution in list(self.running.values()):
            execution.cancel(reason)

    def hand_back(self, jobs: list[Job], reason: str) -> None:
        """Hand back, unstarted, jobs of a claim that must not start (``reason``: why)."""
        for job in jobs:
            self._not_started(job, reason)

    # ------------------------------------------------------------------ run

    def start(self, tg: anyio.abc.TaskGroup, jobs: list[Job]) -> None:
        """Start a claimed batch in ``tg``: each job executes as a slot frees."""
        health, fences, now = self._health, self._health.fences, clock

        def fence() -> bool:
            # Not if the producer fenced itself since the claim, even if it beats again
            # now: a peer may have rescued these attempts meanwhile.
            return health.fences == fences and health.may_start(now())

        settlers = self._settle.settlers
        executions = [Execution(job, settlers[job.task], fence) for job in jobs]
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
                self._sizing.job_took(monotonic() - began)
            if outcome.resource is not None:
                self.resources.record(job.task, job.id, outcome.resource)
            if execution.ctx._settled:
                state = await self._settle.committed(execution)
                if state is not None:  # the task's own transaction wrote the outcome
                    self._counters.settled(state)
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
        patience = self._sizing.patience()
        timeout = self._tasks[job.task].timeout
        if timeout is not None:
            # Its timeout counts from the claim: hand it back while half of it is left,
            # rather than start it with little or no time to run.
            patience = timeout / 2 if patience is None else min(patience, timeout / 2)
        if execution.reason is not None or self._stopping or not self._health.healthy:
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
            self._sizing.waited_too_long()
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

    def _not_started(self, job: Job, reason: str) -> None:
        """The job ends unstarted: cancelled, or handed back (``reason``: why)."""
        self._outcomes(stopped_before_start(job, reason))
        if reason != CANCEL:
            self.handed_back.fire()
            if reason == FENCED:
                self.fenced.fire()
