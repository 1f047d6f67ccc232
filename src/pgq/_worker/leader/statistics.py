"""Statistics: the leader analyzes the jobs table when it holds jobs but the planner has no
column statistics for it.

Without them the planner guesses that a queue has almost no available job. With 100,000
waiting, a claim then read and sorted all of them, 52 ms per claim of 10 against 1.2 ms
once analyzed (``benchmarks/bench_no_stats.py``). Autovacuum analyzes the table on its own
once enough rows changed, but nothing makes it do so before it vacuums it. Autovacuum
thresholds set high, or autovacuum turned off, leave a table vacuumed and never analyzed.
"""

from __future__ import annotations

import logging

from pgq._store import maintenance
from pgq._store.connections import Pool

log = logging.getLogger("pgq.statistics")

#: Seconds between two looks at the table's statistics (a query of the catalogs).
INTERVAL_S = 60.0


class Statistics:
    """Looks every ``interval_s`` while its worker leads, and at once when it starts to."""

    name = "statistics"
    eager = True

    def __init__(self, pool: Pool, interval_s: float = INTERVAL_S) -> None:
        self._pool = pool
        self.interval_s = interval_s
        self._refused = False
        #: Times the table was analyzed by this worker.
        self.analyzed = 0

    async def run_once(self) -> bool:
        """Returns whether this round analyzed the table."""
        seen = await maintenance.jobs_statistics(self._pool)
        if seen.analyzed or not seen.has_pages:
            return False
        if not seen.may_analyze:
            if not self._refused:
                self._refused = True
                log.warning(
                    "the jobs table has no column statistics, and this worker's role may not "
                    "analyze it (only its owner, the database's owner or a superuser may): "
                    "claims can read every available job of a queue until it is analyzed; "
                    "run ANALYZE pgq_jobs as its owner, and check that autovacuum analyzes it"
                )
            return False
        await maintenance.analyze_jobs(self._pool)
        if not (await maintenance.jobs_statistics(self._pool)).analyzed:
            return False  # no row alive to sample: nothing to plan from yet
        self.analyzed += 1
        log.info(
            "analyzed the jobs table, which had no column statistics (claims planned without "
            "them can read every available job of a queue)"
        )
        return True
