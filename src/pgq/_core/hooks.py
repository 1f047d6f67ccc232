"""Middleware around job execution and events for integrations (Sentry, metrics)."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from pgq.job import Job, JobContext, JobState

#: What a ``CancelledError`` that lands in an attempt is (``Execution.judge_cancel``).
CancelVerdict = Literal["spent", "raise", "stray"]

log = logging.getLogger("pgq.hooks")

EventName = Literal["job_started", "job_finished", "job_retried", "job_rescued"]
EVENTS: tuple[EventName, ...] = ("job_started", "job_finished", "job_retried", "job_rescued")

#: ``async def mw(ctx, call_next)``: run code around a job; ``await call_next()`` runs the
#: rest of the chain (and the task) and returns its result.
Middleware = Callable[[JobContext, Callable[[], Awaitable[Any]]], Awaitable[Any]]


@dataclass(slots=True, frozen=True)
class JobEvent:
    """What a hook receives. ``state`` is the outcome (None for ``job_started``), ``error``
    the error entry recorded for the attempt (if any), ``duration_s`` how long the attempt
    ran, ``reason`` why a job was rescued."""

    name: EventName
    job: Job
    state: JobState | None = None
    error: dict[str, Any] | None = None
    duration_s: float | None = None
    reason: str | None = None


Hook = Callable[[JobEvent], Awaitable[None] | None]


class Hooks:
    """The middleware chain and event hooks of an App."""

    def __init__(self) -> None:
        self.middleware: list[Middleware] = []
        self.handlers: dict[EventName, list[Hook]] = {name: [] for name in EVENTS}
        #: ``job_finished`` hooks for outcomes other than ``completed`` only (pgq's job log,
        #: when it does not log every job): a job that completes builds no event for them.
        self.failure_handlers: list[Hook] = []

    def joined(
        self,
        handlers: dict[EventName, list[Hook]] | None = None,
        middleware: list[Middleware] | None = None,
        failure_handlers: list[Hook] | None = None,
    ) -> Hooks:
        """These hooks with pgq's own added (a worker's metrics, job log, tracing): the
        added handlers run first, the added middleware outermost."""
        joined = Hooks()
        joined.middleware = [*(middleware or []), *self.middleware]
        for name in EVENTS:
            joined.handlers[name] = [*(handlers or {}).get(name, []), *self.handlers[name]]
        joined.failure_handlers = [*(failure_handlers or []), *self.failure_handlers]
        return joined

    def __bool__(self) -> bool:
        return bool(self.middleware or self.failure_handlers) or any(self.handlers.values())

    @property
    def every_job(self) -> bool:
        """Whether something runs for every job: middleware, or a hook on its start or on
        every outcome (else only failed outcomes, retries and rescues have listeners)."""
        handlers = self.handlers
        return bool(self.middleware or handlers["job_started"] or handlers["job_finished"])

    def wants(self, name: EventName) -> bool:
        """Whether any hook listens to ``name`` (so the caller may skip building the event)."""
        return bool(self.handlers[name])

    async def emit(self, event: JobEvent, judge: Callable[[], CancelVerdict] | None = None) -> None:
        """Call every hook for ``event``; a failing hook is logged and never affects the job.

        A cancellation that lands in an async hook is judged by ``judge`` (the attempt's,
        see ``pgq._worker.attempt.Execution.judge_cancel``): the attempt's own stop ends that hook
        only; a teardown ends the emit; any other ``CancelledError`` (the hook awaited
        something someone else cancelled, or cancelled itself) is a failing hook. Without
        ``judge`` (events outside an attempt), a ``CancelledError`` ends the emit when the
        task is being cancelled, else it is a failing hook."""
        hooks = self.handlers[event.name]
        if event.name == "job_finished" and event.state is not JobState.COMPLETED:
            hooks = [*self.failure_handlers, *hooks]
        for hook in hooks:
            try:
                result = hook(event)
                if result is not None and inspect.isawaitable(result):  # None: most hooks
                    await result
            except asyncio.CancelledError:
                if judge is not None:
                    verdict = judge()
                else:
                    current = asyncio.current_task()
                    verdict = "raise" if current is None or current.cancelling() else "stray"
                if verdict == "raise":
                    raise
                if verdict == "stray":
                    log.exception("%s hook %r failed for job %d", event.name, hook, event.job.id)
            except Exception:
                log.exception("%s hook %r failed for job %d", event.name, hook, event.job.id)
