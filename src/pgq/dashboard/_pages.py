"""The dashboard's pages (every GET): each reads through the store, then renders."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from pgq._core import metrics as _metrics
from pgq._core import serde
from pgq._db import inspect, maintenance
from pgq._db import jobs as store_jobs
from pgq._db import producers as store_producers
from pgq._db import queues as store_queues
from pgq._db.connections import Pool
from pgq.dashboard._chart import SERIES, throughput_svg
from pgq.dashboard._forms import Filters
from pgq.dashboard._host import Host
from pgq.dashboard._preview import TIMELINE_EVENTS
from pgq.dashboard._timeline import Event, timeline
from pgq.job import FINAL_STATES, MAX_JOB_ID, Job, JobState

#: The actions a bulk request may name, and how the pages word them.
BULK_ACTIONS = {"retry": "Retry", "cancel": "Cancel", "delete": "Delete"}
#: What a notice after an action says, by the action's code (never text from the request).
NOTICES = {
    "retry": "Retried {n} job(s): they are available now.",
    "retry_none": "Not retried: another job has taken its unique key since it finished, or "
    "the job changed meanwhile (it is waiting, running or gone).",
    "cancel": "Cancelled {n} job(s) (a running one stops when its worker hears of it).",
    "delete": "Deleted {n} job(s).",
    "pause": "Paused queue {q}: its workers finish what they run and claim nothing new.",
    "resume": "Resumed queue {q}.",
}
#: A job's values that download whole (its page shows their start).
JOB_VALUES = ("args", "result", "metadata", "errors", "tags")
#: Notices that report an action not done: shown as a warning, not a success.
WARNING_NOTICES = frozenset({"retry_none"})
STATES = list(JobState)


@dataclass(slots=True)
class QueueRow:
    """One queue on the overview."""

    name: str
    counts: dict[JobState, int]
    paused_at: datetime | None
    oldest_available_s: float | None
    producers: int
    finished_hour: inspect.Minute | None


class Pages:
    """The GET handlers of a dashboard."""

    def __init__(self, dashboard: Host) -> None:
        self._d = dashboard

    async def _common(self, request: Request, pool: Pool) -> dict[str, Any]:
        notice = None
        done, n = request.query_params.get("done"), request.query_params.get("n", "")
        if done in NOTICES:
            queue = request.query_params.get("q", "")
            count = int(n) if n.isascii() and n.isdigit() and len(n) < 20 else 0
            notice = NOTICES[done].format(n=count, q=queue)
        return {
            "now": await maintenance.database_now(pool),
            "leader": await store_producers.current_leader(pool),
            "notice": notice,
            "notice_warns": done in WARNING_NOTICES,
            "path": request.url.path,
        }

    async def overview(self, request: Request) -> Response:
        """Each queue's counts by state, paused flag, oldest available job and throughput."""
        pool = await self._d.pool()
        counts = await inspect.state_counts(pool, timeout_s=self._d.count_timeout_s)
        oldest = await inspect.oldest_available(pool)
        paused = await inspect.paused_queues(pool)
        # A former id's row (a re-registered producer's) is no producer of its own.
        producers = [p for p in await store_producers.list_producers(pool) if not p.former]
        hour = await inspect.throughput(pool, minutes=60)
        by_queue = await inspect.throughput_by_queue(pool, minutes=60)
        rows = _queue_rows(counts, paused, oldest, producers, by_queue)
        statuses = [p.status(None, self._d.stale_after_s) for p in producers]
        return self._d.render(request, "overview.html", {
            **await self._common(request, pool), "title": "Overview", "rows": rows,
            "counts": counts, "states": STATES, "final": FINAL_STATES,
            "chart": throughput_svg(hour), "series": SERIES, "hour": hour,
            "health": {s: statuses.count(s) for s in ("healthy", "fenced", "stale")},
        })  # fmt: skip

    async def jobs(self, request: Request) -> Response:
        """Jobs matching the filter, newest first, a page at a time."""
        pool = await self._d.pool()
        filters = Filters.from_params(request.query_params)
        before = _int_param(request, "before")
        filt = filters.job_filter()
        page = None
        if filt is not None:
            page = await inspect.page(
                pool, filt, before=before, limit=self._d.page_size, window=self._d.scan_window
            )
        return self._d.render(request, "jobs.html", {
            **await self._common(request, pool), "title": "Jobs", "filters": filters,
            "page": page, "before": before, "states": STATES,
            "queues": sorted(await inspect.paused_queues(pool) | await inspect.oldest_available(pool)),
            "bulk_actions": BULK_ACTIONS,
        }, 200 if filt is not None else 400)  # fmt: skip

    async def job(self, request: Request) -> Response:
        """One job: its fields, args, result, metadata and timeline (each bounded: a long
        value shows its start and size, and downloads whole from :meth:`job_value`)."""
        pool = await self._d.pool()
        job = await self._job(pool, request)
        events, earlier = _bounded(timeline(job))
        return self._d.render(request, "job.html", {
            **await self._common(request, pool), "title": f"Job {job.id}", "job": job,
            "events": events, "earlier": earlier, "final": job.state in FINAL_STATES,
            # The live refresh swaps the head and timeline only: the values need no encoding.
            "values": "hx-request" not in request.headers,
            "can_retry": job.state in FINAL_STATES
            or job.state in (JobState.RETRYABLE, JobState.SCHEDULED),
            "can_cancel": job.state not in FINAL_STATES,
            "can_delete": job.state is not JobState.RUNNING,
        })  # fmt: skip

    async def job_value(self, request: Request) -> Response:
        """One of a job's values whole, as a JSON download: ``args``, ``result``,
        ``metadata``, ``errors`` or ``tags``."""
        part = str(request.path_params["part"])
        if part not in JOB_VALUES:
            raise HTTPException(404, f"No {part!r} of a job: use {', '.join(JOB_VALUES)}.")
        job = await self._job(await self._d.pool(), request)
        value = getattr(job, part)
        problem = serde.unreadable(value)
        if problem is not None:
            raise HTTPException(422, f"The job's {part} cannot be shown: {problem}")
        body = json.dumps(value, indent=2, ensure_ascii=False, default=str, sort_keys=True)
        return Response(body.encode("utf-8", "surrogatepass"), media_type="application/json",
                        headers={"content-disposition": (
                            f'attachment; filename="job-{job.id}-{part}.json"')})  # fmt: skip

    async def _job(self, pool: Pool, request: Request) -> Job[Any]:
        job_id = int(request.path_params["job_id"])
        job = await store_jobs.get(pool, job_id) if 1 <= job_id <= MAX_JOB_ID else None
        if job is None:
            raise HTTPException(404, f"No job {job_id}: it never existed, or was deleted.")
        return job

    async def bulk_confirm(self, request: Request) -> Response:
        """How many jobs a bulk action would touch, and a button to go ahead."""
        pool = await self._d.pool()
        action = request.query_params.get("action", "")
        if action not in BULK_ACTIONS:
            raise HTTPException(400, f"Unknown action {action!r}: use retry, cancel or delete.")
        filters = Filters.from_params(request.query_params)
        filt = filters.job_filter()
        if filt is None:
            raise HTTPException(400, "; ".join(filters.errors))
        up_to = await inspect.highest_id(pool)
        count = await inspect.count_matching(pool, filt, up_to=up_to)
        return self._d.render(request, "confirm.html", {
            **await self._common(request, pool), "title": f"{BULK_ACTIONS[action]} jobs",
            "action": action, "verb": BULK_ACTIONS[action], "filters": filters,
            "count": count, "up_to": up_to,
        })  # fmt: skip

    async def producers(self, request: Request) -> Response:
        """Every producer: heartbeat age, status, running jobs, counters; the leader."""
        pool = await self._d.pool()
        producers = await store_producers.list_producers(pool)
        running = await inspect.running_by_producer(pool)
        in_db = {r.producer_id: r.count for r in running}
        rows = [(p, p.status(None, self._d.stale_after_s), in_db.get(p.id, 0)) for p in producers]
        return self._d.render(request, "producers.html", {
            **await self._common(request, pool), "title": "Producers", "rows": rows,
            "orphans": [r for r in running if r.orphaned],
        })  # fmt: skip

    async def metrics(self, request: Request) -> Response:
        """The queue gauges for Prometheus: jobs by queue and state, oldest available job."""
        return await _metrics_response(await self._d.pool(), self._d.count_timeout_s)

    async def queues(self, request: Request) -> Response:
        """Queues with their paused flag, backlog and producers; periodic schedules."""
        pool = await self._d.pool()
        counts = inspect.StateCounts(await inspect.active_counts(pool))
        paused = await inspect.paused_queues(pool)
        oldest = await inspect.oldest_available(pool)
        producers = await store_producers.list_producers(pool)
        rows = _queue_rows(counts, paused, oldest, producers, {})
        return self._d.render(request, "queues.html", {
            **await self._common(request, pool), "title": "Queues", "rows": rows,
            "limits": await inspect.queue_limits(pool),
            "schedules": await maintenance.list_periodic(pool),
            "unrunnable": await store_queues.unrunnable(
                pool, self._d.stale_after_s, self._d.stale_after_s
            ),
        })  # fmt: skip


async def _metrics_response(pool: Pool, count_timeout_s: float) -> Response:
    if not _metrics.available():
        return PlainTextResponse(
            "no metrics: install the metrics extra (pip install 'pgq-async[metrics]')\n", 404
        )
    families = _metrics.queue_families(
        *await inspect.queue_gauges(pool, count_timeout_s=count_timeout_s)
    )
    return Response(_metrics.render_families(families), media_type=_metrics.CONTENT_TYPE)


def _queue_rows(
    counts: inspect.StateCounts,
    paused: dict[str, datetime | None],
    oldest: dict[str, float],
    producers: list[store_producers.ProducerInfo],
    finished: dict[str, inspect.Minute],
) -> list[QueueRow]:
    """A row for every queue that any of the sources names."""
    names = set(counts.by_queue) | set(paused) | {p.queue for p in producers} | set(finished)
    return [
        QueueRow(
            name,
            counts.by_queue.get(name) or dict.fromkeys(JobState, 0),
            paused.get(name),
            oldest.get(name),
            sum(1 for p in producers if p.queue == name and not p.former),
            finished.get(name),
        )
        for name in sorted(names)
    ]


def _bounded(events: list[Event]) -> tuple[list[Event], int]:
    """The enqueue and the latest events, and how many were left out between them."""
    if len(events) <= TIMELINE_EVENTS:
        return events, 0
    return [events[0], *events[-(TIMELINE_EVENTS - 1) :]], len(events) - TIMELINE_EVENTS


def _int_param(request: Request, name: str) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_JOB_ID:
        raise HTTPException(
            400, f"{name} must be a whole number from 0 to {MAX_JOB_ID}, not {raw[:40]!r}"
        )
    return value
