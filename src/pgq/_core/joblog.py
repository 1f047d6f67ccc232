"""The job log: what an operator needs to see of jobs, at the level it deserves, never a
flood. A failed attempt that will retry is a WARNING, a discarded job an ERROR, a success is
logged only when asked (``log_jobs``). Each task may log at most ``burst`` lines a window;
the rest are counted and summed up in one line when the window ends."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import anyio

from pgq._core.hooks import EventName, Hook, JobEvent
from pgq.job import Job, JobState
from pgq.logs import printable

log = logging.getLogger("pgq.jobs")

#: Error kinds a task asked for itself (not failures).
_ASKED = frozenset({"retry", "cancel"})


@dataclass
class _Window:
    lines: int = 0
    suppressed: Counter[str] = field(default_factory=Counter)


class JobLog:
    """Logs job outcomes for one worker, rate-limited per task."""

    def __init__(
        self,
        worker_name: str,
        *,
        log_jobs: bool = False,
        burst: int = 10,
        window_s: float = 60.0,
    ) -> None:
        self._worker = worker_name
        self._log_jobs = log_jobs
        self._burst = burst
        self.window_s = window_s
        self._windows: dict[str, _Window] = {}
        #: Lines left out since the worker started (tests and stats).
        self.suppressed = 0

    def hooks(self) -> dict[EventName, list[Hook]]:
        """The event hooks that write the log: every finished job, when every job is logged."""
        return {"job_finished": [self._finished]} if self._log_jobs else {}

    def failure_hooks(self) -> list[Hook]:
        """... else a hook for the outcomes other than completed (completed jobs skip it)."""
        return [] if self._log_jobs else [self._finished]

    def fields(self, job: Job, **more: Any) -> dict[str, Any]:
        """The structured fields of a job's line (``--log-format json`` prints them)."""
        return {
            "job_id": job.id, "task": job.task, "queue": job.queue, "attempt": job.attempt,
            "producer": str(job.producer_id) if job.producer_id else None,
            "worker": self._worker, **more,
        }  # fmt: skip

    def _finished(self, event: JobEvent) -> None:
        level, text = self._line(event)
        if level is None or not log.isEnabledFor(level):
            return
        job = event.job
        if level >= logging.WARNING and not self._allow(job.task, event.state):
            return
        outcome = event.state.value if event.state else None
        log.log(level, text, extra={"pgq": self.fields(job, outcome=outcome)})

    def _line(self, event: JobEvent) -> tuple[int | None, str]:
        job, state, error = event.job, event.state, event.error or {}
        # A task's exception text, in one line that cannot forge another or drive a terminal.
        kind, message = error.get("kind"), printable(str(error.get("message") or ""))
        of = f" of {job.max_attempts}" if job.max_attempts else ""
        head = f"job {job.id} ({job.task}, queue {job.queue}) attempt {job.attempt}{of}"
        took = f" in {event.duration_s:.3f}s" if event.duration_s is not None else ""
        if state is JobState.COMPLETED:
            return (logging.INFO if self._log_jobs else None), f"{head} completed{took}"
        if state is JobState.DISCARDED:
            return logging.ERROR, f"{head} discarded: {message}"
        if state is JobState.RETRYABLE and error and kind not in _ASKED:
            return logging.WARNING, f"{head} failed, will retry: {message}"
        if state is JobState.CANCELLED:
            return logging.INFO, f"{head} cancelled: {message}"
        if state is JobState.AVAILABLE and error:
            # Handed back (a shutdown): the database counts the attempt off again, and
            # `pgq jobs show` says the same words.
            counted = f"{job.attempt - 1}{of} counted"
            return (
                logging.INFO if self._log_jobs else None
            ), f"{head} not counted ({counted}), the job available again: {message}"
        return (logging.INFO if self._log_jobs else None), f"{head} -> {state}: {message}"

    def _allow(self, task: str, state: JobState | None) -> bool:
        window = self._windows.setdefault(task, _Window())
        if window.lines < self._burst:
            window.lines += 1
            return True
        window.suppressed[state.value if state else "unknown"] += 1
        self.suppressed += 1
        return False

    def flush(self) -> None:
        """End the window: one summary line per task that had lines left out."""
        windows, self._windows = self._windows, {}
        for task, window in sorted(windows.items()):
            if window.suppressed:
                total = sum(window.suppressed.values())
                detail = ", ".join(f"{n} {s}" for s, n in sorted(window.suppressed.items()))
                states = " or ".join(sorted(window.suppressed))
                log.warning(
                    "task %s: %d more failed attempts in the last %.0fs were not logged one "
                    "by one (%s); see pgq jobs list --task %s --state %s, or the dashboard",
                    task, total, self.window_s, detail, task, states,
                    extra={"pgq": {"task": task, "suppressed": total, "worker": self._worker}},
                )  # fmt: skip

    async def run(self) -> None:
        """Flush every window until cancelled (then once more)."""
        try:
            while True:
                await anyio.sleep(self.window_s)
                self.flush()
        finally:
            self.flush()
