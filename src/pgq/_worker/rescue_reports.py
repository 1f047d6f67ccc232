"""The ``job_rescued`` events of one worker, delivered to its hooks by a task of their own.

Three parts of a worker take running jobs back from a producer: the leader's rescuer, a
worker restarted under its stable name (its previous run's jobs), and the check of strays
(the jobs of its own claims whose reply was lost). Each writes the rescue first, then hands
the event here and goes on. pgq's own handlers (the rescue metric) see it at once; the
App's hooks get it from :meth:`RescueReports.run`, one event after another: a hook that is
slow, or never returns, delays only the App's events after it, never a rescue round, a
check, the metric or the worker's stop. A stopping worker waits at most ``FLUSH_S`` for the
events left (not at all after ``stop(now=True)``); then it says how many were not
delivered, and stops (a hook still awaiting sees ``CancelledError``).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence

import anyio

from pgq._core.hooks import Hook, Hooks, JobEvent
from pgq.job import Job, JobState

log = logging.getLogger("pgq.worker")

#: How long a stopping worker waits for its ``job_rescued`` hooks, in seconds.
FLUSH_S = 5.0


class RescueReports:
    """The events of jobs taken back: handed at once to ``inline`` (pgq's own handlers,
    which are synchronous and quick), and queued, in the order the jobs were taken, for
    ``hooks`` (the App's), which :meth:`run` delivers."""

    def __init__(self, hooks: Hooks | None, inline: Sequence[Hook] = ()) -> None:
        self._hooks = hooks if hooks is not None and hooks.wants("job_rescued") else None
        self._inline = list(inline)
        self._queue: deque[JobEvent] = deque()
        self._news = anyio.Event()
        # Set, then replaced, by run() each time a hook returns: every flush waiting at
        # that moment wakes and looks again.
        self._returned = anyio.Event()
        self._in_hooks = 0
        self._flushing: anyio.CancelScope | None = None
        self._cut = False
        #: Events the App's hooks have had since the worker started.
        self.delivered = 0

    def add(
        self, *, job_id: int, queue: str, task: str, state: JobState, attempt: int, reason: str
    ) -> None:
        """Report a job taken back from its attempt ``attempt`` (it is now in ``state``);
        nothing when nothing listens. The event's job carries no arguments: a rescue
        never reads them."""
        if self._hooks is None and not self._inline:
            return
        job = Job(id=job_id, queue=queue, task=task, args={}, state=state, attempt=attempt)
        event = JobEvent("job_rescued", job, state, reason=reason)
        for handler in self._inline:
            try:
                handler(event)
            except Exception:
                log.exception("job_rescued handler %r failed for job %d", handler, job_id)
        if self._hooks is not None:
            self._queue.append(event)
            self._news.set()

    @property
    def waiting(self) -> int:
        """Events the App's hooks have not had yet: queued, or in a hook now."""
        return len(self._queue) + self._in_hooks

    async def run(self) -> None:
        """Deliver events as they come, in order, until cancelled (the only deliverer)."""
        while True:
            await self._news.wait()
            self._news = anyio.Event()
            while self._queue and self._hooks is not None:
                event = self._queue.popleft()
                self._in_hooks += 1
                try:
                    await self._hooks.emit(event)
                finally:
                    self._in_hooks -= 1
                    self._returned.set()
                    self._returned = anyio.Event()
                self.delivered += 1

    async def flush(self, timeout_s: float | None = None) -> None:
        """Wait, for at most ``timeout_s`` (default ``FLUSH_S``) and until :meth:`cut`,
        while :meth:`run` delivers every event left (a worker that stops); say how many
        it had not."""
        if timeout_s is None:
            timeout_s = FLUSH_S
        with anyio.move_on_after(0 if self._cut else timeout_s) as scope:
            self._flushing = scope
            while self.waiting:
                await self._returned.wait()
        self._flushing = None
        if self.waiting:
            log.warning(
                "%d job_rescued events were not delivered: a job_rescued hook had not "
                "returned when the worker stopped (it waits %g s for them at most, not at "
                "all when told to stop at once)",
                self.waiting,
                timeout_s,
            )

    def cut(self) -> None:
        """Wait no more for the hooks: the worker was told to stop at once."""
        self._cut = True
        if self._flushing is not None:
            self._flushing.cancel()
