"""The leader's services other than periodic jobs: the promoter, the rescuer, the reaper and
retention. Each has a ``run_once()`` that does one round and returns what it did."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import asyncpg

from pgq import sql
from pgq.db import Pool
from pgq.hooks import Hooks, JobEvent
from pgq.job import Job, JobState
from pgq.settings import WorkerSettings

log = logging.getLogger("pgq.maintenance")

#: Rows one statement of a service touches at most: short transactions, few locks.
BATCH = 1000


class Promoter:
    """Makes due scheduled and retryable jobs available, and wakes their queues."""

    name = "promoter"
    eager = True

    def __init__(self, pool: Pool, interval_s: float) -> None:
        self._pool = pool
        self.interval_s = interval_s

    async def run_once(self) -> int:
        """Returns how many jobs became available."""
        total = 0
        async with self._pool.acquire() as conn:
            while True:
                rows = await conn.fetch(sql.PROMOTE_DUE, BATCH)
                n = sum(int(r[1]) for r in rows)
                total += n
                if n < BATCH:
                    return total


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
    """Rescues the running jobs of producers that went silent or whose row is gone, and jobs
    that overran their timeout under a live producer; judged in SQL on the database clock."""

    name = "rescuer"
    eager = False

    def __init__(
        self,
        pool: Pool,
        settings: WorkerSettings,
        worker_id: uuid.UUID,
        *,
        sick_queues: Callable[[], list[str]],
        after_rescue: Callable[[], None],
        hooks: Hooks | None = None,
    ) -> None:
        self._pool = pool
        self._settings = settings
        self._worker_id = worker_id
        self._sick_queues = sick_queues
        self._after_rescue = after_rescue
        self._hooks = hooks
        self._skipping = False
        self.interval_s = settings.rescue_interval
        self.rescued = 0

    async def run_once(self) -> RescueResult:
        """One round; a leader whose own producers are unhealthy skips it (its view of the
        database is suspect, and so is its judgement of others)."""
        sick = self._sick_queues()
        if sick:
            if not self._skipping:
                log.warning(
                    "leader skips rescue rounds: its own producers (%s) are unhealthy",
                    ", ".join(sick),
                )
                self._skipping = True
            return RescueResult(skipped=True)
        if self._skipping:
            log.info("leader resumes rescue rounds")
            self._skipping = False
        s = self._settings
        counts = {"retryable": 0, "discarded": 0, "cancelled": 0}
        async with self._pool.acquire() as conn:
            while True:
                rows = await conn.fetch(
                    sql.RESCUE_JOBS, self._worker_id, s.stale_after, s.rescue_grace, BATCH
                )
                for r in rows:
                    counts[r["state"]] += 1
                    log.warning(
                        "rescued job %d -> %s: %s (worker %s, silent %.1fs)",
                        r["id"],
                        r["state"],
                        r["reason"],
                        r["worker_name"] or "unknown",
                        r["silent_s"],
                    )
                    await self._emit(r)
                if len(rows) < BATCH:
                    break
        result = RescueResult(counts["retryable"], counts["discarded"], counts["cancelled"])
        self.rescued += result.rescued
        if result.retried:
            self._after_rescue()  # first rescues are due at once: promote them now
        return result

    async def _emit(self, r: asyncpg.Record) -> None:
        if self._hooks is None or not self._hooks.wants("job_rescued"):
            return
        state = JobState(r["state"])
        job = Job(
            id=r["id"], queue=r["queue"], task=r["task"], args={}, state=state, attempt=r["attempt"]
        )
        await self._hooks.emit(JobEvent("job_rescued", job, state, reason=r["reason"]))


class Reaper:
    """Deletes producer rows silent for ``reap_after`` once none of their jobs runs."""

    name = "reaper"
    eager = False

    def __init__(self, pool: Pool, settings: WorkerSettings) -> None:
        self._pool = pool
        self._reap_after = settings.reap_after
        self.interval_s = settings.rescue_interval
        self.reaped = 0

    async def run_once(self) -> int:
        """Returns how many producer rows were deleted."""
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(sql.REAP_PRODUCERS, self._reap_after)
        for r in rows:
            log.info("reaped producer %s (worker %s, queue %s)", r[0], r[1], r[2])
        self.reaped += len(rows)
        return len(rows)


class Retention:
    """Deletes finished jobs past their state's retention, in small batches."""

    name = "retention"
    eager = False

    def __init__(self, pool: Pool, settings: WorkerSettings) -> None:
        self._pool = pool
        self._keep = (
            ("completed", settings.retention_completed),
            ("cancelled", settings.retention_cancelled),
            ("discarded", settings.retention_discarded),
        )
        self.interval_s = settings.retention_interval
        self.deleted = 0

    async def run_once(self) -> int:
        """Returns how many jobs were deleted."""
        deleted = 0
        for state, keep_s in self._keep:
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
