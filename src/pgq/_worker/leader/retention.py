"""Retention: finished jobs past their state's retention are deleted, in small batches."""

from __future__ import annotations

import logging

from pgq._store import maintenance
from pgq._store.connections import Pool
from pgq.job import JobState
from pgq.settings import WorkerSettings

log = logging.getLogger("pgq.retention")

#: Jobs one statement deletes at most: short transactions that never hold many locks.
BATCH = 1000


class Retention:
    """Deletes every ``retention_interval`` while its worker leads."""

    name = "retention"
    eager = False

    def __init__(self, pool: Pool, settings: WorkerSettings) -> None:
        self._pool = pool
        self._keep = (
            (JobState.COMPLETED, settings.retention_completed),
            (JobState.CANCELLED, settings.retention_cancelled),
            (JobState.DISCARDED, settings.retention_discarded),
        )
        self.interval_s = settings.retention_interval
        #: Jobs deleted since the worker started.
        self.deleted = 0

    async def run_once(self) -> int:
        """Returns how many jobs were deleted."""
        deleted = 0
        for state, keep_s in self._keep:
            if keep_s is None:
                continue
            while True:
                n = await maintenance.delete_finished(self._pool, state, keep_s, BATCH)
                deleted += n
                if n < BATCH:
                    break
        if deleted:
            log.info("retention deleted %d finished jobs", deleted)
        self.deleted += deleted
        return deleted
