"""Throughput: the leader counts the jobs finished each minute into ``pgq_throughput``, so
the dashboard's chart reads one row per minute and queue rather than an hour of jobs."""

from __future__ import annotations

from datetime import datetime

from pgq._db import inspect
from pgq._db.connections import Pool

#: A leader's first round counts the chart's hour: from the start of the minute this long
#: ago.
BACKFILL_S = 3600.0
#: The rounds after count from the start of the minute this long before the previous
#: round began (the database's clock): an outcome whose transaction commits up to LATE_S
#: after the end of the minute it began in is still counted (a job counts in the minute its
#: transaction began). A round 15 s after the last then reads 75 s of finished jobs on
#: average, where recounting the two whole minutes before the current one read 150 s: at
#: thousands of jobs a second, each round is an index scan of hundreds of thousands.
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
        #: The database's clock at this worker's last round.
        self._last_round: datetime | None = None

    async def run_once(self) -> None:
        """Count the minutes since :data:`LATE_S` before this worker's last round (the
        last hour on its first, or after a gap in its leadership), and forget those past
        :data:`KEEP_S`."""
        self._last_round = await inspect.rollup_throughput(
            self._pool, since=self._last_round, late_s=LATE_S, backfill_s=BACKFILL_S
        )
        await inspect.trim_throughput(self._pool, keep_s=KEEP_S)
