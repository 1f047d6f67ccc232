"""The leader's maintenance loops."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence

import anyio

from pgq import sql
from pgq.app import App
from pgq.db import DATABASE_ERRORS, Pool
from pgq.hooks import JobEvent
from pgq.job import Job, JobState
from pgq.leader import Elector
from pgq.maintenance.periodic import Periodic
from pgq.producer import Producer
from pgq.settings import WorkerSettings

log = logging.getLogger("pgq.maintenance")

BATCH = 1000


class Maintenance:
    """Runs the scheduler every ``schedule_interval`` and the rescuer and reaper every
    ``rescue_interval``, while this worker leads."""

    def __init__(
        self,
        pool: Pool,
        elector: Elector,
        producers: Sequence[Producer],
        settings: WorkerSettings,
        worker_id: uuid.UUID,
        app: App | None = None,
    ) -> None:
        self._pool = pool
        self._app = app
        self._periodic = Periodic(pool, app, worker_id) if app and app.schedules else None
        self._elector = elector
        self._producers = producers
        self._settings = settings
        self._worker_id = worker_id
        self._skipping = False
        self.rescued = 0
        self.discarded_by_rescue = 0
        self.reaped = 0
        self.rounds = 0
        self.deleted = 0

    async def run_scheduler(self) -> None:
        """Make due scheduled and retryable jobs available and enqueue periodic jobs,
        while leading."""
        while True:
            if self._elector.is_leader:
                try:
                    if self._periodic is not None:
                        await self._periodic.tick(self._elector.terms)
                    await self.promote_due()
                except DATABASE_ERRORS as exc:
                    log.warning("scheduler round failed: %s", exc)
                except Exception:  # a bug here must not stop the jobs: say it loudly, go on
                    log.exception("scheduler round failed")
            await anyio.sleep(self._settings.schedule_interval)

    async def run_rescuer(self) -> None:
        """Rescue and reap, while leading."""
        while True:
            await anyio.sleep(self._settings.rescue_interval)
            if not self._elector.is_leader:
                continue
            try:
                await self.rescue_round()
            except DATABASE_ERRORS as exc:
                log.warning("rescue round failed: %s", exc)
            except Exception:
                log.exception("rescue round failed")

    async def run_retention(self) -> None:
        """Delete old finished jobs, while leading."""
        while True:
            await anyio.sleep(self._settings.retention_interval)
            if not self._elector.is_leader:
                continue
            try:
                await self.retention_round()
            except DATABASE_ERRORS as exc:
                log.warning("retention round failed: %s", exc)
            except Exception:
                log.exception("retention round failed")

    async def retention_round(self) -> int:
        """Delete finished jobs past their state's retention, in small batches."""
        s = self._settings
        deleted = 0
        for state, keep_s in (
            ("completed", s.retention_completed),
            ("cancelled", s.retention_cancelled),
            ("discarded", s.retention_discarded),
        ):
            if keep_s is None:
                continue
            while True:
                async with self._pool.acquire() as conn:
                    status = await conn.execute(sql.DELETE_FINISHED, state, keep_s, BATCH)
                n = int(status.split()[-1])
                deleted += n
                if n < BATCH:
                    break
        if deleted:
            log.info("retention deleted %d finished jobs", deleted)
        self.deleted += deleted
        return deleted

    async def promote_due(self) -> int:
        """One scheduler step; returns how many jobs became available."""
        total = 0
        async with self._pool.acquire() as conn:
            while True:
                rows = await conn.fetch(sql.PROMOTE_DUE, BATCH)
                n = sum(int(r[1]) for r in rows)
                total += n
                if n < BATCH:
                    return total

    async def rescue_round(self) -> int:
        """Rescue what the protocol says to, then reap; returns how many jobs were rescued."""
        sick = [p for p in self._producers if not p.healthy]
        if sick:
            # Our own heartbeats fail: our view of the database is suspect, and so is our
            # judgement of others. The lease will lapse to a healthier worker if this lasts.
            if not self._skipping:
                log.warning(
                    "leader skips rescue rounds: its own producers (%s) are unhealthy",
                    ", ".join(p.queue for p in sick),
                )
                self._skipping = True
            return 0
        if self._skipping:
            log.info("leader resumes rescue rounds")
            self._skipping = False
        s = self._settings
        rescued = 0
        async with self._pool.acquire() as conn:
            while True:
                rows = await conn.fetch(
                    sql.RESCUE_JOBS, self._worker_id, s.stale_after, s.rescue_grace, BATCH
                )
                for r in rows:
                    log.warning(
                        "rescued job %d -> %s: %s (worker %s, silent %.1fs)",
                        r[0],
                        r[1],
                        r[2],
                        r[3] or "unknown",
                        r[4],
                    )
                    if r[1] == "discarded":
                        self.discarded_by_rescue += 1
                    if self._app is not None and self._app.hooks.wants("job_rescued"):
                        job = Job(
                            id=r[0],
                            queue=r[5],
                            task=r[6],
                            args={},
                            state=JobState(r[1]),
                            attempt=r[7],
                        )
                        await self._app.hooks.emit(
                            JobEvent("job_rescued", job, JobState(r[1]), reason=r[2])
                        )
                rescued += len(rows)
                if len(rows) < BATCH:
                    break
            reaped = await conn.fetch(sql.REAP_PRODUCERS, s.reap_after)
        if rescued:
            await self.promote_due()  # first rescues are due at once: no wait for the scheduler
        for r in reaped:
            log.info("reaped producer %s (worker %s, queue %s)", r[0], r[1], r[2])
        self.rescued += rescued
        self.reaped += len(reaped)
        self.rounds += 1
        return rescued
