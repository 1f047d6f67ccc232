"""A producer: claims jobs of one queue into free slots and runs them; tracks its health."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Mapping
from typing import Any

import anyio
import anyio.abc

from pgq import serde, sql
from pgq.app import Task
from pgq.completer import Completer
from pgq.db import DATABASE_ERRORS, Pool
from pgq.executor import SHUTDOWN, Execution, execute, internal_failure, interrupted
from pgq.hooks import Hooks
from pgq.job import Job, JobState

log = logging.getLogger("pgq.producer")


class Producer:
    """Runs up to ``concurrency`` jobs of ``queue`` at once.

    It claims as many jobs as it has free slots in one statement, when notified of new
    jobs, when a slot frees after a full batch, or every ``poll_interval``. An unhealthy
    producer (its heartbeats keep failing) claims nothing until a heartbeat succeeds.
    """

    def __init__(
        self,
        *,
        queue: str,
        concurrency: int,
        tasks: Mapping[str, Task],
        pool: Pool,
        completer: Completer,
        limiter: anyio.CapacityLimiter,
        poll_interval: float,
        fence_after_s: float = float("inf"),
        hooks: Hooks | None = None,
    ) -> None:
        self.id = uuid.uuid4()
        self.queue = queue
        self.concurrency = concurrency
        self._batch_max = max(1, (concurrency + 1) // 2)
        self._tasks = dict(tasks)
        self._task_names = list(self._tasks)
        self._timeouts = [t.timeout for t in self._tasks.values()]
        self._max_attempts = [t.max_attempts for t in self._tasks.values()]
        self._pool = pool
        self._completer = completer
        self._limiter = limiter
        self._poll_interval = poll_interval
        self._hooks = hooks if hooks else None
        self.running: dict[int, Execution] = {}
        self._wake = anyio.Event()
        self._slot = anyio.Event()
        self._healthy = anyio.Event()
        self._healthy.set()
        self._empty = anyio.Event()
        self._empty.set()
        self._stopping = False
        self.fetching = False
        # Health, as the heartbeat sees it.
        self.consecutive_failures = 0
        self.last_heartbeat_ok_at: float | None = None  # time.time() of the last success
        # Claiming stops once this long has passed since the last proof of life (the
        # registration, then each heartbeat), even if the heartbeat loop itself is held up.
        self._fence_after_s = fence_after_s
        self._alive_at = anyio.current_time()
        # Counters.
        self.claimed = 0
        self.completed = 0
        self.failed = 0
        self.rejected_outcomes = 0

    # ------------------------------------------------------------------ control

    @property
    def healthy(self) -> bool:
        """False while the producer has fenced itself (claims nothing)."""
        return self._healthy.is_set()

    def set_healthy(self, healthy: bool) -> None:
        """Fence (False) or unfence (True); unfencing fetches at once."""
        if healthy and not self._healthy.is_set():
            self._healthy.set()
            self.wake()
        elif not healthy and self._healthy.is_set():
            self._healthy = anyio.Event()

    def heartbeat_ok(self, now: float) -> None:
        """A heartbeat landed: reset the failure count and unfence."""
        self._alive_at = anyio.current_time()
        self.last_heartbeat_ok_at = now
        if self.consecutive_failures or not self.healthy:
            log.info("queue %s: heartbeat ok again; claiming resumes", self.queue)
        self.consecutive_failures = 0
        self.set_healthy(True)

    def heartbeat_failed(self, exc: BaseException, max_failures: int) -> None:
        """A heartbeat failed; the ``max_failures``-th in a row fences the producer."""
        self.consecutive_failures += 1
        reason = str(exc) or type(exc).__name__
        if self.consecutive_failures >= max_failures and self.healthy:
            log.warning(
                "queue %s: %d heartbeats failed in a row (last: %s); claiming nothing until "
                "one succeeds (%d jobs keep running)",
                self.queue,
                self.consecutive_failures,
                reason,
                len(self.running),
            )
            self.set_healthy(False)
        else:
            log.warning(
                "queue %s: heartbeat failed (%d in a row): %s",
                self.queue,
                self.consecutive_failures,
                reason,
            )

    def wake(self) -> None:
        """Fetch now (new jobs were announced, or the producer became healthy)."""
        self._wake.set()

    def stop_fetching(self) -> None:
        """Claim nothing more; running jobs go on."""
        self._stopping = True
        self._wake.set()
        self._slot.set()
        self._healthy.set()

    def cancel_running(self, reason: str) -> None:
        """Cancel every running job; each records its interruption as its outcome."""
        for execution in list(self.running.values()):
            execution.cancel(reason)

    async def wait_empty(self) -> None:
        """Return when no job runs."""
        await self._empty.wait()

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
            if not self._healthy.is_set():
                await self._healthy.wait()
                more = True
                continue
            if len(self.running) >= self.concurrency:
                self._slot = anyio.Event()
                if len(self.running) >= self.concurrency:
                    await self._slot.wait()
                continue
            if not more:
                with anyio.move_on_after(self._poll_interval):
                    await self._wake.wait()
                if self._stopping or not self._healthy.is_set():
                    continue
            if anyio.current_time() - self._alive_at > self._fence_after_s:
                log.warning(
                    "queue %s: no heartbeat for %.1fs; claiming nothing until one lands",
                    self.queue,
                    anyio.current_time() - self._alive_at,
                )
                self.set_healthy(False)
                continue
            # A notification that arrives during the fetch sets the new event: not lost.
            self._wake = anyio.Event()
            # At most half the slots per claim: the next claim overlaps the running batch.
            limit = min(self.concurrency - len(self.running), self._batch_max)
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
                # Claimed while the worker began to stop: hand them straight back
                # (retryable at once, the attempt not counted) rather than start them.
                for job in jobs:
                    self._completer.add(interrupted(job, SHUTDOWN))
                break
            if jobs:
                executions = [Execution(job) for job in jobs]
                for execution in executions:
                    self.running[execution.ctx.job.id] = execution
                if self._empty.is_set():
                    # A new event only when the last was set: one that is waited on must
                    # be the one set when the last job ends.
                    self._empty = anyio.Event()
                tg.start_soon(self._run_batch, executions, name=f"pgq batch of {len(jobs)}")

    async def _fetch(self, limit: int) -> list[Job]:
        self.fetching = True
        try:
            # Shielded: a claim cut off between the server's commit and our reading of the
            # rows would leave jobs running that nobody runs (until rescued).
            with anyio.CancelScope(shield=True), anyio.fail_after(30):
                async with self._pool.acquire() as conn:
                    rows = await conn.fetch(
                        sql.FETCH_JOBS,
                        self.queue,
                        self._task_names,
                        limit,
                        self.id,
                        self._timeouts,
                        self._max_attempts,
                    )
        finally:
            self.fetching = False
        self.claimed += len(rows)
        return [
            Job(
                id=r[0],
                queue=r[1],
                task=r[2],
                args=serde.loads(r[3]),
                state=JobState.RUNNING,
                priority=r[4],
                attempt=r[5],
                max_attempts=r[6],
                scheduled_at=r[7],
                attempted_at=r[8],
                created_at=r[9],
                producer_id=self.id,
                tags=list(r[10]),
                metadata=serde.loads(r[11]),
                attempt_token=r[12],
            )
            for r in rows
        ]

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
            for t in tasks:
                t.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.wait(tasks)
            raise

    async def _run_one(self, execution: Execution) -> None:
        job = execution.ctx.job
        task = self._tasks[job.task]
        try:
            try:
                outcome = await execute(task, execution, self._limiter, self._hooks)
            except Exception as exc:  # never an attempt without an outcome
                outcome = internal_failure(job, task, exc)
            self._completer.add(outcome)
        finally:
            del self.running[job.id]
            self._slot.set()
            if not self.running:
                self._empty.set()

    # ------------------------------------------------------------------ stats

    def stats(self) -> dict[str, Any]:
        """A snapshot for :meth:`pgq.Worker.stats`."""
        return {
            "producer_id": str(self.id),
            "queue": self.queue,
            "healthy": self.healthy,
            "consecutive_failures": self.consecutive_failures,
            "last_heartbeat_ok_at": self.last_heartbeat_ok_at,
            "concurrency": self.concurrency,
            "running": len(self.running),
            "claimed": self.claimed,
            "completed": self.completed,
            "failed": self.failed,
            "rejected_outcomes": self.rejected_outcomes,
        }
