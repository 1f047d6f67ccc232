"""Retention: finished jobs past their state's retention are deleted, in small batches,
paced so that a round does not hold a connection back to back."""

from __future__ import annotations

import logging
import time

import anyio

from pgq._db import maintenance
from pgq._db.connections import Pool
from pgq.job import JobState
from pgq.settings import WorkerSettings

log = logging.getLogger("pgq.retention")

#: Jobs one statement deletes at most: short transactions that never hold many locks.
BATCH = 1000
#: After each full batch the round pauses this many times as long as the batch took: a
#: queue finishing thousands of jobs a second has a round of hundreds of batches a minute,
#: which back to back held a connection and a core for seconds (in the soak they overlapped
#: its worst stalls: docs/architecture.md). Paced, a round deletes
#: at half the speed of one connection.
PACE = 1.0
#: A round paces itself only for this share of ``retention_interval``; past it, it deletes
#: back to back. A queue finishing faster than a paced round deletes then keeps at most
#: the jobs of that half interval at half speed more than an unpaced round would leave.
PACED_SHARE = 0.5


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
        paced_until = time.monotonic() + self.interval_s * PACED_SHARE
        for state, keep_s in self._keep:
            if keep_s is None:
                continue
            while True:
                began = time.monotonic()
                n = await maintenance.delete_finished(self._pool, state, keep_s, BATCH)
                deleted += n
                if n < BATCH:
                    break
                now = time.monotonic()
                if now < paced_until:
                    await anyio.sleep(min((now - began) * PACE, paced_until - now))
        if deleted:
            log.info("retention deleted %d finished jobs", deleted)
        self.deleted += deleted
        return deleted
