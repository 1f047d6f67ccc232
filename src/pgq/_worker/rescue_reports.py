"""The ``job_rescued`` events of one worker, delivered to its hooks by a task of their own.

Three parts of a worker take running jobs back from a producer: the leader's rescuer, a
worker restarted under its stable name (its previous run's jobs), and the check of strays
(the jobs of its own claims whose reply was lost). Each writes the rescue first, then hands
the event here and goes on: a hook that is slow, or never returns, delays only the events
after it, never a rescue round, a check or the worker's stop. A stopping worker waits at
most ``FLUSH_S`` for the events left; then it says how many were not delivered, and stops
(a hook still awaiting sees ``CancelledError``).
"""

from __future__ import annotations

import logging
from collections import deque

import anyio

from pgq._hooks import Hooks, JobEvent
from pgq.job import Job, JobState

log = logging.getLogger("pgq.worker")

#: How long a stopping worker waits for its ``job_rescued`` hooks, in seconds.
FLUSH_S = 5.0


class RescueReports:
    """The events of jobs taken back, queued in the order they were taken, and the task
    that delivers them (:meth:`run`)."""

    def __init__(self, hooks: Hooks | None) -> None:
        self._hooks = hooks if hooks is not None and hooks.wants("job_rescued") else None
        self._queue: deque[JobEvent] = deque()
        self._news = anyio.Event()
        self._returned = anyio.Event()
        self._in_hooks = 0
        #: Events delivered since the worker started.
        self.delivered = 0

    def add(
        self, *, job_id: int, queue: str, task: str, state: JobState, attempt: int, reason: str
    ) -> None:
        """Queue the event of a job taken back from its attempt ``attempt`` (it is now in
        ``state``); nothing when no hook listens. The event's job carries no arguments: a
        rescue never reads them."""
        if self._hooks is None:
            return
        job = Job(id=job_id, queue=queue, task=task, args={}, state=state, attempt=attempt)
        self._queue.append(JobEvent("job_rescued", job, state, reason=reason))
        self._news.set()

    @property
    def waiting(self) -> int:
        """Events not yet delivered: queued, or in a hook now."""
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
                self.delivered += 1

    async def flush(self, timeout_s: float = FLUSH_S) -> None:
        """Wait, for at most ``timeout_s``, until :meth:`run` has delivered every event
        (a worker that stops); say how many it had not."""
        with anyio.move_on_after(timeout_s):
            while self.waiting:
                # Replaced before the wait, with nothing awaited in between: a hook that
                # returns meanwhile sets this very event.
                self._returned = anyio.Event()
                await self._returned.wait()
        if self.waiting:
            log.warning(
                "%d job_rescued events were not delivered: a job_rescued hook did not return "
                "within %g s of the worker's stop",
                self.waiting,
                timeout_s,
            )
