"""Runs the leader's services, each in a loop of its own, while this worker leads; and the
few every worker runs whether it leads or not (the promotion of due jobs: no leader stands
on the path of a due job). The small services follow, each with its ``run_once()``: the
promoter, the reaper, the throughput rollup, the table's statistics and the report of
unrunnable jobs (the rescuer, periodic jobs and retention have modules of their own).

One failing service (a broken periodic schedule, retention that cannot delete, a rescue
statement the server refuses) never stops the others: each runs and fails on its own, its
failures are counted, and each distinct error is logged once until the service recovers.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

import anyio

from pgq._db import inspect, maintenance, queues
from pgq._db.connections import DATABASE_ERRORS, Pool
from pgq._db.queues import Unrunnable
from pgq._worker.leader.elector import Elector
from pgq.settings import WorkerSettings

log = logging.getLogger("pgq.leader")

#: The least time one question off the lead may take (a connection that stalls without
#: breaking would otherwise hold the service's loop).
UNSURE_BOUND_S = 5.0


class LeaderService(Protocol):
    """A duty only the leader performs, every ``interval_s`` seconds."""

    name: str
    #: Run at once when the loop starts, rather than after the first interval.
    eager: bool

    @property
    def interval_s(self) -> float:
        """Seconds before the next round (read before each wait)."""
        ...

    async def run_once(self) -> Any:
        """One round; returns what it did. Raises when the round failed."""
        ...


@runtime_checkable
class AsksUnsure(Protocol):
    """A service whose rounds may leave an outcome unknown (a commit whose reply was lost)
    and find it out later, whether or not this worker still leads."""

    async def ask_unsure(self) -> None:
        """Find out what became of what earlier rounds left unknown."""
        ...


@dataclass
class ServiceStatus:
    """How a leader service has fared, for :meth:`pgq.Worker.stats`."""

    runs: int = 0
    failures: int = 0
    consecutive_failures: int = 0
    last_error: str | None = None
    _logged: set[str] = field(default_factory=set, repr=False)

    def snapshot(self) -> dict[str, Any]:
        """The counters as plain values."""
        return {
            "runs": self.runs,
            "failures": self.failures,
            "consecutive_failures": self.consecutive_failures,
            "last_error": self.last_error,
        }


class LeaderServices:
    """Starts a loop per service; each loop runs its service only while ``elector`` leads,
    but for those named in ``everywhere``, which run on every worker."""

    def __init__(
        self,
        elector: Elector,
        services: list[LeaderService],
        everywhere: frozenset[str] = frozenset(),
    ) -> None:
        self._elector = elector
        self._everywhere = everywhere
        self.services = {s.name: s for s in services}
        self.status = {s.name: ServiceStatus() for s in services}
        self._wake = {s.name: anyio.Event() for s in services}

    def wake(self, name: str) -> None:
        """Run service ``name`` now rather than at its next interval (if leading)."""
        if name in self._wake:
            self._wake[name].set()

    async def run(self) -> None:
        """Run every service's loop until cancelled."""
        async with anyio.create_task_group() as tg:
            for service in self.services.values():
                tg.start_soon(self._loop, service, name=f"pgq leader service {service.name}")

    async def _loop(self, service: LeaderService) -> None:
        first = True
        while True:
            if not (first and service.eager):
                with anyio.move_on_after(service.interval_s):
                    await self._wake[service.name].wait()
            first = False
            self._wake[service.name] = anyio.Event()
            if self._elector.is_leader or service.name in self._everywhere:
                await self.run_service(service.name)
            else:
                await self._ask_unsure(service)

    async def _ask_unsure(self, service: LeaderService) -> None:
        """Off the lead, a service still asks what became of what its rounds left unknown (each
        distinct failure logged once, like a round's)."""
        if not isinstance(service, AsksUnsure):
            return
        logged = self.status[service.name]._logged
        try:
            with anyio.fail_after(max(service.interval_s, UNSURE_BOUND_S)):
                await service.ask_unsure()
        except Exception as exc:
            text = f"could not settle what its rounds left unknown: {type(exc).__name__}: {exc}"
            if text not in logged:
                logged.add(text)
                expected = isinstance(exc, (TimeoutError, *DATABASE_ERRORS))
                log.log(
                    logging.WARNING if expected else logging.ERROR,
                    "leader service %s %s (asking again)",
                    service.name,
                    text,
                    exc_info=None if expected else exc,
                )
            return
        logged.difference_update([t for t in logged if t.startswith("could not settle")])

    async def run_service(self, name: str) -> Any:
        """Run one round of service ``name`` now, recording its success or failure;
        returns its result, or None when it failed."""
        service, status = self.services[name], self.status[name]
        try:
            result = await service.run_once()
        except Exception as exc:
            self._failed(service, status, exc)
            return None
        status.runs += 1
        if status.consecutive_failures:
            log.info(
                "leader service %s recovered after %d failed rounds",
                service.name,
                status.consecutive_failures,
            )
        status.consecutive_failures = 0
        status._logged.clear()
        return result

    @staticmethod
    def _failed(service: LeaderService, status: ServiceStatus, exc: Exception) -> None:
        status.runs += 1
        status.failures += 1
        status.consecutive_failures += 1
        text = f"{type(exc).__name__}: {exc}"
        status.last_error = text[:1000]
        if text in status._logged:
            log.debug("leader service %s failed again: %s", service.name, text)
            return
        status._logged.add(text)
        expected = isinstance(exc, DATABASE_ERRORS)
        log.log(
            logging.WARNING if expected else logging.ERROR,
            "leader service %s failed: %s (the other services go on; this error is logged "
            "once until the service recovers)",
            service.name,
            text,
            exc_info=None if expected else exc,
        )


# --------------------------------------------------------------------------- the promoter
# The promoter: due scheduled and retryable jobs become available, and wake their queues.
#
# Every worker runs it, leader or not, so a due job never waits for a leader; the statement
# passes over rows another worker's promotion holds (SKIP LOCKED), and each worker's rounds
# are jittered so that a fleet's spread out.

#: Jobs one statement promotes at most: short transactions, few locks.
PROMOTE_BATCH = 1000


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
                n = await maintenance.promote_due(conn, PROMOTE_BATCH)
                total += n
                if n < PROMOTE_BATCH:
                    return total


# --------------------------------------------------------------------------- the reaper
# The reaper: producer rows silent for ``reap_after``, whose jobs were all rescued, go.

reaper_log = logging.getLogger("pgq.reaper")


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
            reaper_log.info(
                "reaped producer %s (worker %s, queue %s)", r.id, r.worker_name, r.queue
            )
        self.reaped += len(rows)
        return len(rows)


# --------------------------------------------------------------------------- throughput
# Throughput: the leader counts the jobs finished each minute into ``pgq_throughput``, so
# the dashboard's chart reads one row per minute and queue rather than an hour of jobs.

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


# --------------------------------------------------------------------------- statistics
# Statistics: the leader analyzes the jobs table when it holds rows but has no column
# statistics.
#
# Without them the planner guesses that a queue has almost no available job. The worker's
# claims are spared (their connections plan with index scans only), but a claim planned at
# the server's defaults read and sorted all 100,000 waiting jobs, 35 ms per claim of 10
# against 0.7 ms once analyzed (``benchmarks/bench_no_stats.py``), and the other statements
# are planned from the same guesses. Autovacuum analyzes the table on its own
# once enough rows changed, but nothing makes it do so before it vacuums it: analyze
# thresholds set high, or a VACUUM without ANALYZE, leave a table vacuumed and never analyzed.

statistics_log = logging.getLogger("pgq.statistics")

#: Seconds between two looks at the table's statistics (a query of the catalogs).
STATISTICS_INTERVAL_S = 60.0
#: Pages (8 MB) past which a table whose rows were never counted is analyzed too. Planned
#: from its size alone, the claim kept to the index up to 320,000 rows and read every
#: available job from 400,000; below this, autovacuum's first analyze (after 50 rows and a
#: tenth of the table changed) comes long before.
UNCOUNTED_PAGES = 1000


class Statistics:
    """Looks every ``interval_s`` while its worker leads, and at once when it starts to."""

    name = "statistics"
    eager = True

    def __init__(self, pool: Pool, interval_s: float = STATISTICS_INTERVAL_S) -> None:
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
            statistics_log.info(
                "analyzed the jobs table, which had no column statistics yet (claims are "
                "planned from them: without, one can read every available job of a queue)"
            )
            return True
        if after.worth_analyzing and not self._refused:
            # ANALYZE counts the rows as it samples them (none alive: worth it no more):
            # still worth it and no statistics mean the server skipped the table.
            self._refused = True
            statistics_log.warning(
                "the jobs table has no column statistics, and ANALYZE as this worker's role "
                "left it so: claims can read every available job of a queue until it is "
                "analyzed; run ANALYZE pgq_jobs as its owner, and check that autovacuum "
                "analyzes it"
            )
        return False


# --------------------------------------------------------------------------- unrunnable jobs
# Jobs nobody can run: available jobs of a task that no live worker of their queue serves
# (enqueued by name without the App, a task renamed by a deploy). pgq never claims a task it
# has not registered, so they would wait in silence: the leader reports them, once per change,
# and leaves them be (deploy the task, or cancel them).

unrunnable_log = logging.getLogger("pgq.unrunnable")


class UnrunnableReport:
    """Looks every ``stale_after`` for jobs due that long whose task no live producer of
    their queue serves; logs a warning when a (queue, task) starts to have such jobs, and a
    line when it stops."""

    name = "unrunnable"
    eager = False

    def __init__(self, pool: Pool, stale_after_s: float) -> None:
        self._pool = pool
        self._stale_after_s = stale_after_s
        self.interval_s = stale_after_s
        #: What the last round found.
        self.found: list[Unrunnable] = []

    async def run_once(self) -> list[Unrunnable]:
        """Returns what it found (logged only where it changed)."""
        s = self._stale_after_s
        found = await queues.unrunnable(self._pool, s, s)
        before = {(u.queue, u.task) for u in self.found}
        for u in found:
            if (u.queue, u.task) not in before:
                unrunnable_log.warning("%s", describe(u))
        now = {(u.queue, u.task) for u in found}
        for queue, task in sorted(before - now):
            unrunnable_log.info(
                "jobs of task %r on queue %r are no longer waiting unserved", task, queue
            )
        self.found = found
        return found


def describe(u: Unrunnable) -> str:
    """One line that names the task, the queue and the count, and says what to do."""
    return (
        f"{u.count} job(s) of task {u.task!r} wait on queue {u.queue!r} (the oldest due "
        f"{u.oldest_s:.0f}s ago) and no live worker of that queue serves the task: deploy a "
        f"worker whose App registers {u.task!r}, or cancel them with `pgq jobs cancel --task "
        f"{u.task} --queue {u.queue} --state available`"
    )
