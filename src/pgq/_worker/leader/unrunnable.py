"""Jobs nobody can run: available jobs of a task that no live worker of their queue serves
(enqueued by name without the App, a task renamed by a deploy). pgq never claims a task it
has not registered, so they would wait in silence: the leader reports them, once per change,
and leaves them be (deploy the task, or cancel them)."""

from __future__ import annotations

import logging

from pgq._db import queues
from pgq._db.connections import Pool
from pgq._db.queues import Unrunnable

log = logging.getLogger("pgq.unrunnable")


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
                log.warning("%s", describe(u))
        now = {(u.queue, u.task) for u in found}
        for queue, task in sorted(before - now):
            log.info("jobs of task %r on queue %r are no longer waiting unserved", task, queue)
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
