"""What a worker adds to an App's hooks so operators can see it work: the job log, the
Prometheus metrics (when the extra is installed) and OpenTelemetry tracing (when asked)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pgq._core import metrics as _metrics
from pgq._core.hooks import EVENTS, EventName, Hook, Hooks, Middleware
from pgq._core.joblog import JobLog
from pgq.settings import WorkerSettings

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = logging.getLogger("pgq.worker")


@dataclass
class Observers:
    """The worker's hooks (the App's, with pgq's own joined), and the parts behind them."""

    hooks: Hooks
    joblog: JobLog
    metrics: _metrics.WorkerMetrics | None
    #: The App's own hooks, and pgq's own ``job_rescued`` handlers (synchronous, quick):
    #: rescues reach them apart (``pgq._worker.rescue_reports``).
    app_hooks: Hooks
    own_rescued: list[Hook]


def observers(
    app_hooks: Hooks,
    worker_name: str,
    settings: WorkerSettings,
    stats: Callable[[], dict[str, Any]],
    registry: CollectorRegistry | None,
) -> Observers:
    """Build the job log, metrics and tracing a worker's settings ask for."""
    joblog = JobLog(worker_name, log_jobs=settings.log_jobs)
    metrics = None
    if settings.metrics and _metrics.available():
        metrics = _metrics.WorkerMetrics(stats, registry)
    elif registry is not None:
        _metrics.require()
    middleware: list[Middleware] = []
    if settings.tracing:
        from pgq._core.tracing import attempt_middleware

        middleware.append(attempt_middleware(worker_name))
    handlers: dict[EventName, list[Hook]] = {name: [] for name in EVENTS}
    for part in (metrics.hooks() if metrics else {}, joblog.hooks()):
        for name, hooks in part.items():
            handlers[name] += hooks
    joined = app_hooks.joined(handlers, middleware, joblog.failure_hooks())
    return Observers(joined, joblog, metrics, app_hooks, handlers["job_rescued"])
