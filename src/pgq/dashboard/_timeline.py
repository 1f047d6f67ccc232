"""A job's history, in order: enqueued, each attempt with who ran it and how it ended."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pgq.job import Job, JobState

#: Error kinds and how the timeline names them.
_KIND_TITLES = {
    "exception": "failed",
    "timeout": "timed out",
    "retry": "asked to retry",
    "cancel": "cancelled",
    "discard": "discarded by the task",
    "arguments": "arguments do not fit the task",
    "shutdown": "interrupted by a worker stopping",
    "rescued": "rescued",
    "lost_reply": "handed back: the reply to its claim was lost",
    "result": "result could not be stored",
    "outcome": "outcome could not be written",
    "internal": "failed inside pgq",
    "dependency": "cancelled: a job it depends on failed",
}


#: The reason a worker restarted under its stable name writes when it takes back its
#: previous run's jobs (``RESCUE_PREDECESSOR`` in ``pgq._db.sql``).
_RESTARTED = "worker restarted"


@dataclass(frozen=True, slots=True)
class Event:
    """One line of the timeline."""

    at: datetime | None
    title: str
    #: ``ok``, ``bad``, ``warn`` or ``info``: how the line is coloured.
    tone: str
    attempt: int | None = None
    worker: str | None = None
    producer: str | None = None
    started_at: datetime | None = None
    message: str | None = None
    traceback: str | None = None


def timeline(job: Job[Any]) -> list[Event]:
    """Every event of ``job`` that the database recorded, oldest first."""
    events = [Event(job.created_at, f"enqueued on queue {job.queue}", "info")]
    # A job no worker has claimed yet (a snoozed job is back at attempt 0, but was claimed).
    never_ran = job.attempt == 0 and job.attempted_at is None
    if never_ran and job.scheduled_at and job.created_at and job.scheduled_at > job.created_at:
        events.append(Event(job.scheduled_at, "due", "info"))
    for entry in job.errors:
        events.append(_from_error(entry))
    last = _latest_attempt(job)
    if last is not None:
        events.append(last)
    if job.state is JobState.PENDING and job.depends_on:
        waits = ", ".join(f"#{p}" for p in job.depends_on)
        events.append(Event(job.created_at, f"waits for {waits} to complete", "info"))
    if job.state in (JobState.SCHEDULED, JobState.RETRYABLE) and job.scheduled_at and not never_ran:
        events.append(Event(job.scheduled_at, "runs again", "info", attempt=job.attempt + 1))
    return events


def _from_error(entry: dict[str, Any]) -> Event:
    kind = str(entry.get("kind", "exception"))
    title = _KIND_TITLES.get(kind, kind)
    if kind == "rescued":
        title = _rescued_title(entry.get("reason"))
    return Event(
        at=_when(entry.get("at")),
        title=title,
        tone="warn" if kind in ("rescued", "retry", "shutdown", "cancel", "dependency") else "bad",
        attempt=entry.get("attempt"),
        worker=entry.get("worker_name"),
        producer=entry.get("producer_id"),
        started_at=_when(entry.get("started_at")),
        message=entry.get("message"),
        traceback=entry.get("traceback"),
    )


def _rescued_title(reason: Any) -> str:
    """Who took the attempt back, and why: its worker's next run under the same name
    ("worker restarted"), else the leader (its producer went stale or missing, or the job
    overran its timeout)."""
    if reason == _RESTARTED:
        return "rescued by its worker's next run (the worker restarted)"
    return f"rescued by the leader: {reason}" if reason else "rescued by the leader"


def _latest_attempt(job: Job[Any]) -> Event | None:
    """The attempt the errors do not cover: running now, or the one that finished the job."""
    if job.state is JobState.RUNNING:
        return Event(
            job.attempted_at, "running", "info", attempt=job.attempt, worker=job.attempted_by,
            producer=str(job.producer_id) if job.producer_id else None,
            started_at=job.attempted_at,
        )  # fmt: skip
    if job.state is JobState.COMPLETED:
        return Event(
            job.finalized_at, "completed", "ok", attempt=job.attempt, worker=job.attempted_by,
            started_at=job.attempted_at,
        )  # fmt: skip
    if job.state in (JobState.DISCARDED, JobState.CANCELLED):
        title = "discarded" if job.state is JobState.DISCARDED else "cancelled"
        return Event(job.finalized_at, title, "bad" if title == "discarded" else "warn")
    return None


def _when(text: Any) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None
