"""The promoter: due scheduled and retryable jobs become available, and wake their queues.

Every worker runs it, leader or not, so a due job never waits for a leader; the statement
passes over rows another worker's promotion holds (SKIP LOCKED), and each worker's rounds
are jittered so that a fleet's spread out.
"""

from __future__ import annotations

import random

from pgq._db import maintenance
from pgq._db.connections import Pool

#: Jobs one statement promotes at most: short transactions, few locks.
BATCH = 1000


class Promoter:
    """Promotes due jobs every ``schedule_interval`` at most (each wait drawn between half
    and all of it)."""

    name = "promoter"
    eager = True

    def __init__(self, pool: Pool, interval_s: float) -> None:
        self._pool = pool
        self._interval_s = interval_s

    @property
    def interval_s(self) -> float:
        """The wait before the next round: drawn anew on each read, so a due job waits at
        most ``schedule_interval`` for some worker's round."""
        return self._interval_s * random.uniform(0.5, 1.0)

    async def run_once(self) -> int:
        """Promote every due job, a batch at a time; returns how many became available."""
        total = 0
        async with self._pool.acquire() as conn:
            while True:
                n = await maintenance.promote_due(conn, BATCH)
                total += n
                if n < BATCH:
                    return total
