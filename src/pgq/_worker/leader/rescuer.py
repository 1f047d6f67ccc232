"""The rescuer: running jobs whose producer went silent or vanished, or that overran their
timeout under a live one, are taken back, judged in SQL on the database clock."""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import anyio

from pgq._db import maintenance
from pgq._db.connections import DATABASE_ERRORS, Connection, Pool
from pgq._db.maintenance import Rescued
from pgq._worker.leader.services import UNSURE_BOUND_S
from pgq._worker.recovery import RescueReports, Unsure, report_rescue
from pgq.job import JobState
from pgq.settings import WorkerSettings

log = logging.getLogger("pgq.rescuer")

#: Jobs one statement rescues at most.
BATCH = 1000


@dataclass(frozen=True, slots=True)
class RescueResult:
    """One rescue round: jobs made retryable, discarded (out of attempts) or cancelled (a
    cancel request was pending); ``skipped`` when this leader's own producers are unhealthy."""

    retried: int = 0
    discarded: int = 0
    cancelled: int = 0
    skipped: bool = False

    @property
    def rescued(self) -> int:
        """Every job the round took from its producer."""
        return self.retried + self.discarded + self.cancelled


class Rescuer:
    """Rescues every ``rescue_interval`` while its worker leads."""

    name = "rescuer"
    eager = False

    def __init__(
        self,
        pool: Pool,
        settings: WorkerSettings,
        leader_id: uuid.UUID,
        *,
        sick_queues: Callable[[], list[str]],
        after_rescue: Callable[[], None] = lambda: None,
        reports: RescueReports | None = None,
    ) -> None:
        self._pool = pool
        self._stale_after = settings.stale_after
        self._grace = settings.rescue_grace
        self._leader_id = leader_id
        self._sick_queues = sick_queues
        self._after_rescue = after_rescue
        self._reports = reports
        self._skipping = False
        self._unsure: Unsure[Rescued] = Unsure(log)
        self.interval_s = settings.rescue_interval
        #: Jobs rescued since the worker started.
        self.rescued = 0

    async def run_once(self) -> RescueResult:
        """One round. A leader whose own producers are unhealthy skips it: its view of the
        database is suspect, and so is its judgement of others; the lease lapses to a
        healthier worker if this lasts. It still asks what became of its rescues whose
        commit's reply was lost: the likeliest moment to ask is right after a cut."""
        sick = self._sick_queues()
        if sick:
            if not self._skipping:
                log.warning(
                    "leader skips rescue rounds: its own producers (%s) are unhealthy",
                    ", ".join(sick),
                )
                self._skipping = True
            # Bounded, and its failure is not the round's: the database is suspect now.
            with anyio.move_on_after(UNSURE_BOUND_S), contextlib.suppress(*DATABASE_ERRORS):
                await self.ask_unsure()
            return RescueResult(skipped=True)
        if self._skipping:
            log.info("leader resumes rescue rounds")
            self._skipping = False
        counts = dict.fromkeys(JobState, 0)
        async with self._pool.acquire() as conn:
            # A round whose commit's reply was lost is reported now, as far as it landed.
            self._report(await self._unsure.landed(conn), counts)
            while True:
                rows = await self._unsure.commit(conn, self._rescue_batch)
                self._report(rows, counts)
                if len(rows) < BATCH:
                    break
        result = RescueResult(
            counts[JobState.RETRYABLE], counts[JobState.DISCARDED], counts[JobState.CANCELLED]
        )
        if result.retried:
            self._after_rescue()  # first rescues are due at once: promote them now
        return result

    async def ask_unsure(self) -> None:
        """Report the rescues whose commit's reply was lost that have landed since. Asked
        while this worker does not lead, and as it stops: the question needs no lease, and
        a leader cut off long enough to lose its commit's reply often loses its lease too."""
        if self._unsure.waiting:
            self._report(await self._unsure.landed(self._pool), dict.fromkeys(JobState, 0))

    @property
    def unsure(self) -> int:
        """Jobs whose rescue's commit has an outcome still unknown."""
        return self._unsure.waiting

    async def _rescue_batch(self, conn: Connection, token: str) -> list[Rescued]:
        # The token reaches the error entries through the transaction's pgq.rescue.
        return await maintenance.rescue(
            conn, self._leader_id, stale_after=self._stale_after, grace=self._grace, limit=BATCH
        )

    def _report(self, rows: list[Rescued], counts: dict[JobState, int]) -> None:
        self.rescued += len(rows)  # at once: a later batch of the round may fail
        for r in rows:
            counts[r.state] += 1
            log.warning(
                "rescued job %d -> %s: %s (worker %s, silent %.1fs)",
                r.id,
                r.state,
                r.reason,
                r.worker_name or "unknown",
                r.silent_s,
            )
            report_rescue(self._reports, r)
