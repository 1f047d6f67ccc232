"""Throughput: the leader counts the jobs finished each minute into ``pgq_throughput``, so
the dashboard's chart reads one row per minute and queue rather than an hour of jobs."""

from __future__ import annotations

import math
import time

from pgq._store import inspect
from pgq._store.connections import Pool

#: Minutes counted before the current one on a leader's first round (the chart's hour),
#: and on the rounds after: those since the last round, and one more for outcomes that
#: committed late.
BACKFILL_MINUTES = 60
RECOUNT_MINUTES = 1
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
        """Count the minutes since this worker's last round (the last hour on its first,
        or after a gap in its leadership), and forget those past :data:`KEEP_S`."""
        started = time.monotonic()
        back = BACKFILL_MINUTES
        if self._last_round is not None:
            since = math.ceil((started - self._last_round) / 60)
            back = min(BACKFILL_MINUTES, since + RECOUNT_MINUTES)
        await inspect.rollup_throughput(self._pool, minutes_back=back)
        await inspect.trim_throughput(self._pool, keep_s=KEEP_S)
        self._last_round = started
