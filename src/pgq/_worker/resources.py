"""Attempts that failed for want of a resource (memory, file descriptors, disk): counted by
task, and warned about once a window per task. A worker whose every attempt fails so stays
alive for its liveness probe (a restart would not give the machine more memory, and other
tasks may run fine); these counts are how an operator sees it."""

from __future__ import annotations

import errno
import logging
from collections import Counter
from time import monotonic

log = logging.getLogger("pgq.worker")

#: The errnos that say the machine, not the task's input, is short of something.
RESOURCE_ERRNOS = frozenset({errno.ENOMEM, errno.EMFILE, errno.ENFILE, errno.ENOSPC})


def resource_reason(exc: BaseException) -> str | None:
    """``MemoryError`` or ``OSError ENOMEM`` (``EMFILE``, ``ENFILE``, ``ENOSPC``) when
    ``exc``, or an exception it was raised from, is one; else None."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 8:
        if isinstance(current, MemoryError):
            return type(current).__name__
        if isinstance(current, OSError) and current.errno in RESOURCE_ERRNOS:
            return f"{type(current).__name__} {errno.errorcode[current.errno]}"
        current = current.__cause__ or current.__context__
        seen += 1
    return None


class ResourceFailures:
    """One producer's count of such attempts, by task, and its rate-limited warning."""

    def __init__(self, queue: str, *, window_s: float = 60.0) -> None:
        self._queue = queue
        self.window_s = window_s
        #: Attempts that failed for want of a resource, by task, since the worker started.
        self.by_task: Counter[str] = Counter()
        self._warned_at: dict[str, float] = {}
        self._since_warning: Counter[str] = Counter()

    @property
    def total(self) -> int:
        """Every such attempt of this producer's."""
        return self.by_task.total()

    def record(self, task: str, job_id: int, reason: str) -> None:
        """Count one; warn unless this task was warned about within the window."""
        self.by_task[task] += 1
        self._since_warning[task] += 1
        now = monotonic()
        last = self._warned_at.get(task)
        if last is not None and now - last < self.window_s:
            return
        self._warned_at[task] = now
        n, self._since_warning[task] = self._since_warning[task], 0
        log.warning(
            "task %s (queue %s): %d attempt(s) failed for want of a resource (%s, job %d "
            "last) since the last warning; %d since the worker started. The worker stays up "
            "and healthy: give it more memory, file descriptors or disk, or make the task "
            "need less",
            task, self._queue, n, reason, job_id, self.by_task[task],
            extra={"pgq": {"task": task, "queue": self._queue, "resource": reason}},
        )  # fmt: skip
