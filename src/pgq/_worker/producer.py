"""A producer: claims jobs of one queue into its free slots and runs them, composed of
parts that each own one concern (docs/architecture.md): the claim loop, the claim and the
queue's limits, claim-ahead sizing, batch running, the settle check and the counters. Its
ids and health are liveness's."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import anyio.abc

from pgq._core.hooks import Hooks
from pgq._db import claims
from pgq._db.claims import ClaimPlan
from pgq._db.connections import Pool
from pgq._db.producers import Beat
from pgq._worker.attempt import FENCED, RESCUED, Execution, Outcome, ResourceFailures, runner
from pgq._worker.batches import BatchRunner, OutcomeSink
from pgq._worker.claim_loop import ClaimLoop
from pgq._worker.claimer import Claimer
from pgq._worker.counters import ProducerCounters
from pgq._worker.limits import LimitsCache
from pgq._worker.liveness import ProducerHealth, ProducerIdentity
from pgq._worker.outcomes import Settler
from pgq._worker.settle_check import SettleCheck
from pgq._worker.sizing import AheadSizing
from pgq.app import Task

__all__ = ["OutcomeSink", "Producer"]


class Producer:
    """Runs up to ``concurrency`` jobs of ``queue`` at once (see :class:`ClaimLoop` for
    when it claims, :class:`AheadSizing` for how many it claims ahead of its free slots,
    :class:`BatchRunner` for how claimed jobs start or are handed back).

    A claimed job counts as running in the database (and for the queue's limits) from its
    claim; an unhealthy producer (its heartbeats keep failing) claims nothing until a
    heartbeat succeeds, and hands back the jobs it holds unstarted."""

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
        tasks = dict(tasks)
        self.plan = ClaimPlan(
            queue,
            tuple(tasks),
            tuple(t.timeout for t in tasks.values()),
            tuple(t.max_attempts for t in tasks.values()),
        )
        self.counters = ProducerCounters()
        self._outcomes = outcomes
        self._hurry_outcomes = hurry_outcomes
        self.sizing = AheadSizing(concurrency, claim_ahead)
        self.limits = LimitsCache(lambda: claims.queue_limits(pool, queue))
        self.runner = BatchRunner(
            concurrency=concurrency,
            tasks=tasks,
            execute=runner(hooks if hooks else None),
            settle=SettleCheck({name: Settler(pool, task) for name, task in tasks.items()}),
            outcomes=self._outcome,
            limiter=limiter,
            health=self.health,
            sizing=self.sizing,
            counters=self.counters,
            resources=ResourceFailures(queue),
        )
        self.loop = ClaimLoop(
            queue=queue,
            concurrency=concurrency,
            poll_interval=poll_interval,
            claimer=Claimer(
                pool,
                self.plan,
                self.limits,
                worker_name=worker_name,
                async_commit=async_commit,
                claim_pool=claim_pool,
            ),
            runner=self.runner,
            identity=self.identity,
            health=self.health,
            limits=self.limits,
            sizing=self.sizing,
            counters=self.counters,
        )

    # ------------------------------------------------------------------ read

    @property
    def id(self) -> uuid.UUID:
        """The producer's row id now (re-registration changes it)."""
        return self.identity.id

    @property
    def running(self) -> dict[int, Execution]:
        """Every claimed job not ended yet, by id: executing, or waiting for a slot."""
        return self.runner.running

    @property
    def fetching(self) -> bool:
        """Whether a claim is in flight."""
        return self.loop.fetching

    @property
    def claims_sent(self) -> int:
        """Claims sent so far."""
        return self.counters.claims_sent

    @property
    def resources(self) -> ResourceFailures:
        """Attempts that failed for want of a resource."""
        return self.runner.resources

    def ids(self) -> list[uuid.UUID]:
        """Every id the database may hold jobs of this producer's under."""
        return self.identity.ids()

    def running_ids(self) -> list[int]:
        """The ids of the jobs running now."""
        return list(self.runner.running)

    def knows(self, job_id: int, token: uuid.UUID | None) -> bool:
        """Whether it runs, or holds for a slot, that attempt (job and token)."""
        return self.runner.knows(job_id, token)

    # ------------------------------------------------------------------ control

    def wake(self) -> None:
        """Fetch now (new jobs were announced, or the producer became healthy)."""
        self.loop.wake()

    def limits_changed(self) -> None:
        """The queue's limits were set or cleared (or a notification may have been missed):
        read them before the next claim."""
        self.limits.changed()
        self.loop.wake()

    def stop_fetching(self) -> None:
        """Claim nothing more; running jobs go on, jobs claimed ahead are handed back."""
        self.loop.stop()
        self.health.release()
        self.runner.stop()

    def lost(self, job_ids: set[int]) -> None:
        """These jobs' attempts were rescued (re-registration did not adopt them): any of
        them still waiting for a slot is handed back, never started (its outcome is fenced
        out). Those already executing go on, as before, their outcomes rejected."""
        self.runner.cancel_waiting_among(job_ids, RESCUED)

    def _fenced(self) -> None:
        """The producer fenced itself: every job waiting, claimed ahead, for a slot is
        handed back now (its hand-back is fenced out where a peer rescued it already),
        rather than started once the producer beats again."""
        self.runner.cancel_waiting(FENCED)

    def cancel(self, job_ids: set[int], reason: str) -> list[int]:
        """Stop those of ``job_ids`` this producer runs; returns their ids."""
        return self.runner.cancel(job_ids, reason)

    def cancel_running(self, reason: str) -> None:
        """Cancel every running job; each records its interruption as its outcome."""
        self.runner.cancel_running(reason)

    async def wait_empty(self) -> None:
        """Return when no job runs."""
        await self.runner.wait_empty()

    def _outcome(self, outcome: Outcome) -> None:
        """An attempt ended: its outcome to the completer, written at once (not after the
        gather window) while the queue's limits hold claims back: it frees a slot."""
        self._outcomes(outcome)
        if self.limits.held_back:
            self._hurry_outcomes()

    def counted(self, outcomes: list[Outcome], accepted: bool) -> None:
        """Count outcomes of this producer's as the database took them (written, or
        rejected by the fence)."""
        if not outcomes:
            return
        if self.limits.held_back:
            # Written: the jobs no longer count against the queue's limit. Claim again now.
            self.loop.wake()
        self.counters.counted(outcomes, accepted)

    # ------------------------------------------------------------------ run

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Fetch and run jobs until :meth:`stop_fetching`, then wait for running jobs."""
        async with anyio.create_task_group() as tg:
            task_status.started()
            await self.loop.run(tg)

    # ------------------------------------------------------------------ liveness, stats

    def beat(self) -> Beat:
        """This producer's heartbeat row as of now."""
        c = self.counters
        return Beat(
            self.identity.id,
            len(self.runner.running),
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
            "running": len(self.runner.running),
            "executing": self.runner.slots.in_use,
            "claim_ahead": self.sizing.ahead,
            **self.counters.stats(),
            "resource_failures": dict(self.runner.resources.by_task),
        }
