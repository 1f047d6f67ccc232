"""Fast recovery for a worker with a stable name (``--name``, ``PGQ_WORKER_NAME``): one that
starts and finds producer rows of its own name left by a previous run rescues their running
jobs as soon as those rows' heartbeats are older than their fencing bound (past it, a live
predecessor has stopped claiming), instead of waiting for the leader's ``stale_after``.

"Older than the fencing bound" adds this worker's ``heartbeat_timeout`` as a margin (the
predecessor's clock starts when it sends a heartbeat, the row's stamp when the statement
begins), judged in SQL with the producer rows locked.

A row of the same name whose heartbeat moves on while this worker watches it belongs to a
live process: two workers misconfigured with one name. That is reported (a warning and
``Worker.stats()["duplicate_names"]``) and its jobs are never touched. The trade: a
predecessor that was cut off rather than dead may still be running a job rescued this way,
which then runs twice, as after any rescue (its late outcome is rejected by the token).
Each job taken over is reported to the ``job_rescued`` hooks, with the reason "worker
restarted".
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable
from datetime import datetime

import anyio

from pgq._db import maintenance as store
from pgq._db.connections import DATABASE_ERRORS, Pool
from pgq._db.maintenance import Rescued
from pgq._worker.leader.rescuer import report_rescue
from pgq._worker.rescue_reports import RescueReports
from pgq._worker.unsure import Unsure

log = logging.getLogger("pgq.worker")

#: Looks at the rows before this worker leaves them to the leader's rescuer.
MAX_ROUNDS = 20
#: Pause after a round that left a row past its bound (a job of it was being written).
RETRY_S = 0.5


class Successor:
    """Takes over the jobs of this worker name's previous run."""

    def __init__(
        self,
        pool: Pool,
        worker_name: str,
        own_ids: Callable[[], list[uuid.UUID]],
        *,
        margin_s: float,
        after_rescue: Callable[[], None],
        reports: RescueReports | None = None,
    ) -> None:
        self._pool = pool
        self._name = worker_name
        self._margin_s = margin_s
        self._own_ids = own_ids
        self._after_rescue = after_rescue
        self._reports = reports
        #: Jobs of a previous run rescued.
        self.rescued = 0
        #: Producer rows of live processes with this worker's name.
        self.duplicates: set[uuid.UUID] = set()
        self._seen: dict[uuid.UUID, datetime] = {}
        self._unsure: Unsure[Rescued] = Unsure(log, what="taken over from the previous run")

    async def run(self) -> None:
        """Watch the rows of this name until each is rescued, found alive, or the rounds
        run out (the leader's rescuer then gets them after ``stale_after``)."""
        for _ in range(MAX_ROUNDS):
            try:
                wait_s = await self.round()
            except DATABASE_ERRORS as exc:
                log.warning("could not look for a previous run of worker %s: %s", self._name, exc)
                wait_s = RETRY_S
            if wait_s is None:
                break
            await anyio.sleep(wait_s)
        while self._unsure.waiting:  # a rescue whose commit's outcome is still unknown
            await anyio.sleep(RETRY_S)
            with contextlib.suppress(*DATABASE_ERRORS):
                self._took_over(await self._unsure.landed(self._pool))

    async def settle(self) -> None:
        """Report the takeovers whose commit's reply was lost that have landed since (as
        this worker stops, before its last rescue reports go out)."""
        if self._unsure.waiting:
            self._took_over(await self._unsure.landed(self._pool))

    @property
    def unsure(self) -> int:
        """Jobs whose takeover's commit has an outcome still unknown."""
        return self._unsure.waiting

    async def round(self) -> float | None:
        """One look: rescue what is past its bound; return how long to wait for the rest
        (None: nothing left to watch)."""
        waits: list[float] = []
        past: list[uuid.UUID] = []
        for row in await store.same_name_producers(self._pool, self._name, self._own_ids()):
            if row.id in self.duplicates or row.fence_after_s is None:
                continue  # alive; or an older pgq's row, which records no bound
            first = self._seen.setdefault(row.id, row.heartbeat_at)
            if row.heartbeat_at > first:
                self.duplicates.add(row.id)
                log.warning(
                    "another live worker is named %s (producer %s beat %.1f s ago): worker "
                    "names must be unique; its jobs are left to it",
                    self._name,
                    row.id,
                    row.age_s,
                )
            elif row.age_s > row.fence_after_s + self._margin_s:
                past.append(row.id)
            else:
                waits.append(row.fence_after_s + self._margin_s - row.age_s + 0.05)
        self._took_over(await self._unsure.landed(self._pool))  # an earlier commit's
        if past:
            async with self._pool.acquire() as conn:
                self._took_over(
                    await self._unsure.commit(
                        conn, lambda c, _: store.rescue_predecessor(c, past, self._margin_s)
                    )
                )
            await self._delete(past)
            waits.append(RETRY_S)  # look again: a row stays while a job of it was locked
        return min(waits) if waits else None

    def _took_over(self, rescued: list[Rescued]) -> None:
        """Count, log and report the jobs of the previous run just rescued."""
        if not rescued:
            return
        self.rescued += len(rescued)
        log.info(
            "worker %s took over %d job(s) of its previous run (silent %.1f s)",
            self._name,
            len(rescued),
            max(r.silent_s for r in rescued),
        )
        self._after_rescue()
        for r in rescued:
            report_rescue(self._reports, r)  # reason "worker restarted"

    async def _delete(self, past: list[uuid.UUID]) -> None:
        """Delete the previous run's rows whose jobs were rescued. The rescue has committed,
        been counted and reported: a failure here only leaves rows, which the next round,
        or the reaper, deletes."""
        try:
            await store.delete_predecessor(self._pool, past, self._margin_s)
        except DATABASE_ERRORS as exc:
            log.warning(
                "could not delete the rows of worker %s's previous run (%s); trying again",
                self._name,
                exc,
            )
