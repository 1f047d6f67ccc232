"""The promoter: due scheduled and retryable jobs become available, and wake their queues."""

from __future__ import annotations

from pgq._store import maintenance
from pgq._store.connections import Pool

#: Jobs one statement promotes at most: short transactions, few locks.
BATCH = 1000


class Promoter:
    """Promotes due jobs every ``interval_s`` (the ``schedule_interval`` setting)."""

    name = "promoter"
    eager = True

    def __init__(self, pool: Pool, interval_s: float) -> None:
        self._pool = pool
        self.interval_s = interval_s

    async def run_once(self) -> int:
        """Promote every due job, a batch at a time; returns how many became available."""
        total = 0
        async with self._pool.acquire() as conn:
            while True:
                n = await maintenance.promote_due(conn, BATCH)
                total += n
                if n < BATCH:
                    return total
