"""Control of a running worker from outside: notifications (new jobs, a resigned leader,
cancel requests), the poll that backs them up, and the end of a burst."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime

import anyio

from pgq._db import claims, maintenance, queues
from pgq._db.connections import DATABASE_ERRORS, Pool, Target
from pgq._db.listen import CancelRequested, LimitsChanged, Notifier, parse_control
from pgq._db.sql import CHANNEL_CONTROL, CHANNEL_JOBS, CHANNEL_LEADER
from pgq._worker.attempt import CANCEL
from pgq._worker.leader.services import describe
from pgq._worker.outcomes import Completer
from pgq._worker.producer import Producer
from pgq.settings import WorkerSettings

log = logging.getLogger("pgq.control")


class Control:
    """Routes a worker's notifications to its producers and elector, polls for cancel
    requests a notification may have missed, and tells when a burst is over."""

    def __init__(
        self,
        pool: Pool,
        producers: Sequence[Producer],
        settings: WorkerSettings,
        *,
        wake_leader: Callable[[], None],
        stable_name: str | None = None,
    ) -> None:
        self._pool = pool
        self._producers = producers
        self._settings = settings
        self._wake_leader = wake_leader
        #: The worker's name when it is stable: jobs running under its previous run's
        #: producers are this worker's to take over, so a burst waits for them too.
        self._stable_name = stable_name
        #: Running jobs cancelled on request (by notification or by poll).
        self.cancelled = 0
        self._notifier: Notifier | None = None

    @property
    def listen_reconnects(self) -> int:
        """Times the LISTEN connection was lost and made again."""
        return self._notifier.reconnects if self._notifier else 0

    def notifier(self, target: Target, worker_name: str) -> Notifier:
        """The LISTEN connection that feeds this control."""
        self._notifier = Notifier(
            target.dsn,
            {
                CHANNEL_JOBS: self.on_jobs,
                CHANNEL_LEADER: lambda _payload: self._wake_leader(),
                CHANNEL_CONTROL: self.on_control,
            },
            on_connect=self.wake_all,
            connect_kwargs=target.options(f"pgq listen {worker_name}"),
        )
        return self._notifier

    def on_jobs(self, queue: str) -> None:
        """New jobs in ``queue`` (``*``: in every queue)."""
        for producer in self._producers:
            if queue in (producer.queue, "*"):
                producer.wake()

    def on_control(self, payload: str) -> None:
        """A control message; an unknown kind (from a newer pgq) is ignored."""
        event = parse_control(payload)
        if isinstance(event, CancelRequested):
            self.cancel({event.job_id})
        elif isinstance(event, LimitsChanged):
            for producer in self._producers:
                if producer.queue == event.queue:
                    producer.limits_changed()

    def wake_all(self) -> None:
        """Fetch now, everywhere (notifications may have been missed: a change of limits
        among them)."""
        for producer in self._producers:
            producer.limits_changed()  # wakes it too

    def cancel(self, job_ids: set[int]) -> None:
        """Stop the running jobs among ``job_ids``: each ends ``cancelled``."""
        for producer in self._producers:
            for job_id in producer.cancel(job_ids, CANCEL):
                log.info("job %d: cancel requested; cancelling it", job_id)
                self.cancelled += 1

    def _busy(self, completer: Completer) -> bool:
        return any(p.running or p.fetching for p in self._producers) or bool(completer.pending)

    async def poll_cancels(self) -> None:
        """The poll fallback for cancel requests (no LISTEN, or a lost notification)."""
        while True:
            await anyio.sleep(self._settings.poll_interval)
            running = [
                i
                for p in self._producers
                for i, execution in p.running.items()
                if execution.reason != CANCEL
            ]
            if not running:
                continue
            try:
                pending = await claims.cancel_requested(self._pool, running)
            except DATABASE_ERRORS as exc:
                log.warning("cancel check failed: %s", exc)
                continue
            if pending:
                self.cancel(pending)

    async def watch_burst(
        self,
        completer: Completer,
        stop: Callable[[], None],
        make_due: Callable[[], Awaitable[int]] | None = None,
    ) -> None:
        """Call ``stop`` once nothing runs, nothing is being claimed or written, and the
        database holds no job these producers could run now, nor a job of their queues
        running under a producer that is gone or silent past the fencing bound (it will be
        rescued, then run), nor, under a stable name, one running under the previous run's
        producers that have not beaten since the burst began (this worker takes them over
        once that run is past its fencing bound; a live process of the same name, beating,
        keeps its jobs, and is not waited for). With ``make_due`` (tests: time travel), jobs scheduled for later
        are made due and run, until it finds none."""
        orphans_said = False
        since: datetime | None = None  # the database's clock as the burst began to check
        while True:
            # Wait for the jobs to end and their outcomes to be written (events, so the
            # check below runs as soon as the last one is durable), then for any claim in
            # flight, which sets no event: look again shortly.
            for producer in self._producers:
                await producer.wait_empty()
            await completer.wait_idle()
            if self._busy(completer):
                await anyio.sleep(0.005)
                continue
            try:
                await maintenance.promote_due(self._pool, 1000)
                if since is None:
                    since = await maintenance.database_now(self._pool)
                own = [i for p in self._producers for i in p.ids()]
                bound = self._settings.fencing_bound
                left = [
                    await claims.leftovers(self._pool, p.plan, bound, self._stable_name, own, since)
                    for p in self._producers
                ]
                # A producer that claimed while the database was being asked has a job
                # the answer no longer shows: look again once it is done.
                if self._busy(completer):
                    continue
                made_due = (
                    await make_due()
                    if make_due is not None and not any(r.runnable or r.orphaned for r in left)
                    else 0
                )
            except DATABASE_ERRORS as exc:
                log.warning("burst check failed: %s", exc)
                await anyio.sleep(self._settings.poll_interval)
                continue
            if made_due:
                self.wake_all()
            elif any(r.runnable for r in left):
                # Runnable jobs are left (another worker's to claim, or just promoted):
                # let the producers claim them, and look again in a while.
                self.wake_all()
                await anyio.sleep(0.05)
            elif any(r.orphaned for r in left):
                if not orphans_said:
                    log.info("burst: waiting for the rescue of jobs whose worker is gone")
                    orphans_said = True
                await anyio.sleep(min(self._settings.rescue_interval, 1.0))
            else:
                log.info("burst: no runnable job left")
                await self._say_unrunnable()
                stop()
                return

    async def _say_unrunnable(self) -> None:
        """At the end of a burst: the jobs of its queues that no live worker serves."""
        mine = {p.queue for p in self._producers}
        try:
            found = await queues.unrunnable(self._pool, self._settings.stale_after, 0.0)
        except DATABASE_ERRORS as exc:
            log.warning("burst: could not look for jobs no worker serves: %s", exc)
            return
        for u in found:
            if u.queue in mine:
                log.warning("burst: %s", describe(u))
