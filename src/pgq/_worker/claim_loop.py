"""The claim loop: when a producer claims, and how many jobs."""

from __future__ import annotations

import logging
from time import monotonic

import anyio
import anyio.abc

from pgq._db.connections import DATABASE_ERRORS
from pgq._worker.attempt import FENCED, SHUTDOWN
from pgq._worker.batches import BatchRunner
from pgq._worker.claimer import Claimer
from pgq._worker.counters import ProducerCounters
from pgq._worker.limits import LimitsCache
from pgq._worker.liveness import ProducerHealth, ProducerIdentity
from pgq._worker.signals import Signal
from pgq._worker.sizing import AheadSizing
from pgq.job import Job

log = logging.getLogger("pgq.producer")

#: While a queue's limits hold its claims back, look again this often: a slot frees when
#: another worker's outcome is written, which nothing announces.
LIMIT_RECHECK_S = 0.1
#: A claim asks for up to half the slots, or up to this many when jobs are claimed ahead:
#: larger claims drain short jobs faster but write more WAL per job (docs/architecture.md).
CLAIM_BATCH = 50


class ClaimLoop:
    """Claims jobs for the free slots in one statement (at most half the slots, or up to
    ``CLAIM_BATCH`` with the jobs wanted ahead, so that claims overlap running jobs), when
    woken (new jobs announced, the producer healthy again, an outcome written while the
    queue's limits held claims back), when a slot frees after a full batch, or every
    ``poll_interval``. An unhealthy producer claims nothing until a heartbeat succeeds; a
    limited queue's claim grants jobs ahead of the free slots only out of room to spare."""

    __slots__ = (
        "_claimer", "_concurrency", "_counters", "_half_slots", "_health", "_identity",
        "_limits", "_poll_interval", "_queue", "_runner", "_sizing", "_stopping", "_wake",
        "claims", "fetching",
    )  # fmt: skip

    def __init__(
        self,
        *,
        queue: str,
        concurrency: int,
        poll_interval: float,
        claimer: Claimer,
        runner: BatchRunner,
        identity: ProducerIdentity,
        health: ProducerHealth,
        limits: LimitsCache,
        sizing: AheadSizing,
        counters: ProducerCounters,
    ) -> None:
        self._queue = queue
        self._concurrency = concurrency
        self._half_slots = max(1, (concurrency + 1) // 2)
        self._poll_interval = poll_interval
        self._claimer = claimer
        self._runner = runner
        self._identity = identity
        self._health = health
        self._limits = limits
        self._sizing = sizing
        self._counters = counters
        self._wake = anyio.Event()
        self._stopping = False
        #: True while a claim is in flight.
        self.fetching = False
        #: Test signal: claims that came back (with jobs or without).
        self.claims = Signal()

    def wake(self) -> None:
        """Claim now (new jobs were announced, or the producer became healthy)."""
        self._wake.set()

    def stop(self) -> None:
        """Claim nothing more."""
        self._stopping = True
        self._wake.set()

    async def run(self, tg: anyio.abc.TaskGroup) -> None:
        """Claim, and start what comes back in ``tg``, until :meth:`stop`."""
        more = True  # fetch at once on start
        failures = 0
        health, runner = self._health, self._runner
        while not self._stopping:
            if not health.healthy:
                await health.wait_healthy()
                more = True
                continue
            # Jobs ahead of the free slots: not before the limits are known. A limited
            # queue's budget is shared by every worker: its claim grants jobs ahead only out
            # of room to spare, so one worker never takes the whole budget and leaves the
            # others idle.
            capacity = self._concurrency + (self._sizing.ahead if self._limits.known else 0)
            if len(runner.running) >= capacity:
                await runner.wait_for_room(capacity)
                continue
            if not more:
                pause = LIMIT_RECHECK_S if self._limits.held_back else self._poll_interval
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
                    "queue %s: fetch failed (%s); retrying in %.1fs", self._queue, exc, delay
                )
                more = False
                await anyio.sleep(delay)
                continue
            failures = 0
            more = len(jobs) == limit
            if jobs and self._stopping:
                # Claimed while the worker began to stop: hand them straight back rather
                # than start them.
                runner.hand_back(jobs, SHUTDOWN)
                break
            if jobs and (fences != health.fences or not health.may_claim()):
                # The producer fenced itself while the claim was out (the process held up,
                # its heartbeats failing): a peer may have rescued these attempts since the
                # claim committed. Hand them back (fenced out where rescued), never start.
                runner.hand_back(jobs, FENCED)
                continue
            if jobs:
                runner.start(tg, jobs)

    def _limit(self, capacity: int) -> int:
        """How many jobs the next claim asks for: at most half the slots (or CLAIM_BATCH,
        when that many are free with the jobs wanted ahead): the next claim overlaps the
        running batch."""
        half = max(1, (capacity + 1) // 2)
        free = capacity - len(self._runner.running)
        return min(free, max(self._half_slots, min(half, CLAIM_BATCH)))

    async def _fetch(self, limit: int) -> list[Job]:
        self.fetching = True
        try:
            # Shielded: a claim cut off between the server's commit and our reading of the
            # rows would leave jobs running that nobody runs (until rescued).
            started = monotonic()
            producer_id = self._identity.claim_sent()
            self._counters.claim_sent()
            with anyio.CancelScope(shield=True), anyio.fail_after(30):
                jobs = await self._claimer.claim(
                    limit, producer_id, slots_free=self._concurrency - len(self._runner.running)
                )
            self._sizing.claim_took(monotonic() - started)
        finally:
            self.fetching = False
            self._identity.claim_ended()
        self._counters.claim_returned(len(jobs))
        self.claims.fire()
        return jobs
