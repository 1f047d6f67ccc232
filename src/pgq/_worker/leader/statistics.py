"""Statistics: the leader analyzes the jobs table when it holds rows but has no column
statistics.

Without them the planner guesses that a queue has almost no available job. The worker's
claims are spared (their connections plan with index scans only), but a claim planned at
the server's defaults read and sorted all 100,000 waiting jobs, 35 ms per claim of 10
against 0.7 ms once analyzed (``benchmarks/bench_no_stats.py``), and the other statements
are planned from the same guesses. Autovacuum analyzes the table on its own
once enough rows changed, but nothing makes it do so before it vacuums it: analyze
thresholds set high, or a VACUUM without ANALYZE, leave a table vacuumed and never analyzed.
"""

from __future__ import annotations

import logging

from pgq._db import maintenance
from pgq._db.connections import Pool

log = logging.getLogger("pgq.statistics")

#: Seconds between two looks at the table's statistics (a query of the catalogs).
INTERVAL_S = 60.0
#: Pages (8 MB) past which a table whose rows were never counted is analyzed too. Planned
#: from its size alone, the claim kept to the index up to 320,000 rows and read every
#: available job from 400,000; below this, autovacuum's first analyze (after 50 rows and a
#: tenth of the table changed) comes long before.
UNCOUNTED_PAGES = 1000


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
        seen = await maintenance.jobs_statistics(self._pool, UNCOUNTED_PAGES)
        if seen.analyzed or not seen.worth_analyzing:
            return False  # analyzed; or nothing alive when last counted, or small uncounted
        await maintenance.analyze_jobs(self._pool)
        after = await maintenance.jobs_statistics(self._pool, UNCOUNTED_PAGES)
        if after.analyzed:
            self.analyzed += 1
            log.info(
                "analyzed the jobs table, which had no column statistics yet (claims are "
                "planned from them: without, one can read every available job of a queue)"
            )
            return True
        if after.worth_analyzing and not self._refused:
            # ANALYZE counts the rows as it samples them (none alive: worth it no more):
            # still worth it and no statistics mean the server skipped the table.
            self._refused = True
            log.warning(
                "the jobs table has no column statistics, and ANALYZE as this worker's role "
                "left it so: claims can read every available job of a queue until it is "
                "analyzed; run ANALYZE pgq_jobs as its owner, and check that autovacuum "
                "analyzes it"
            )
        return False
