"""The reaper: producer rows silent for ``reap_after``, whose jobs were all rescued, go."""

from __future__ import annotations

import logging

from pgq._db import maintenance
from pgq._db.connections import Pool
from pgq.settings import WorkerSettings

log = logging.getLogger("pgq.reaper")


class Reaper:
    """Reaps every ``rescue_interval`` while its worker leads."""

    name = "reaper"
    eager = False

    def __init__(self, pool: Pool, settings: WorkerSettings) -> None:
        self._pool = pool
        self._after_s = settings.reap_after
        self.interval_s = settings.rescue_interval
        #: Producer rows deleted since the worker started.
        self.reaped = 0

    async def run_once(self) -> int:
        """Returns how many producer rows were deleted."""
        rows = await maintenance.reap(self._pool, self._after_s)
        for r in rows:
            log.info("reaped producer %s (worker %s, queue %s)", r.id, r.worker_name, r.queue)
        self.reaped += len(rows)
        return len(rows)
