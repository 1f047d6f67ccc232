"""Throughput: the leader counts the jobs finished each minute into ``pgq_throughput``, so
the dashboard's chart reads one row per minute and queue rather than an hour of jobs."""

from __future__ import annotations

import time

from pgq._store import inspect
from pgq._store.connections import Pool

#: A leader's first round counts the chart's hour: from the start of the minute this long
#: ago.
BACKFILL_S = 3600.0
#: The rounds after count from the start of the minute this long before the previous
#: round began: an outcome whose transaction commits up to LATE_S after its minute ended
#: is still counted (a job counts in the minute its transaction began). A round then reads
#: about a minute of finished jobs on average, where recounting two whole minutes before
#: the current one read two and a half: at thousands of jobs a second, each round is an
#: index scan of hundreds of thousands of them.
LATE_S = 30.0
#: How long the rollup keeps its minutes.
KEEP_S = 7 * 86400.0


class Throughput:
    """Counts every ``interval_s`` while its worker leads."""

    name = "throughput"
    eager = True

    def __init__(self, pool: Pool, interval_s: float = 15.0) -> None:
        self._pool = pool
        self.interval_s = interval_s
        self._last_round: float | None = None

    async def run_once(self) -> None:
        """Count the minutes since :data:`LATE_S` before this worker's last round (the
        last hour on its first, or after a gap in its leadership), and forget those past
        :data:`KEEP_S`."""
        started = time.monotonic()
        back = BACKFILL_S
        if self._last_round is not None:
            back = min(BACKFILL_S, started - self._last_round + LATE_S)
        await inspect.rollup_throughput(self._pool, back_s=back)
        await inspect.trim_throughput(self._pool, keep_s=KEEP_S)
        self._last_round = started
