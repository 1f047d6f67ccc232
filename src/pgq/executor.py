"""Runs one job: the task call, its timeout, cancellation, thread offload, and the outcome."""

from __future__ import annotations

import asyncio
import functools
import logging
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from pgq import serde
from pgq.app import Task
from pgq.hooks import Hooks, JobEvent
from pgq.job import Cancel, Job, JobContext, JobState, Retry, Snooze
from pgq.outcome import Outcome, error_entry

log = logging.getLogger("pgq.executor")

#: Why a job's cancel scope was cancelled by the worker.
SHUTDOWN = "shutdown"
CANCEL = "cancel"


class Execution:
    """One running attempt: its context, and the asyncio task that runs it (cancelling the
    task is how the worker stops the attempt)."""

    __slots__ = ("ctx", "reason", "task")

    def __init__(self, job: Job) -> None:
        self.ctx = JobContext(job)
        self.reason: str | None = None
        self.task: asyncio.Task[None] | None = None

    def cancel(self, reason: str) -> None:
        """Stop the attempt: async tasks are cancelled, threads see ``cancel_requested``."""
        if self.reason is not None:
            return
        self.reason = reason
        self.ctx._request_cancel()
        if self.task is not None:
            self.task.cancel()


def _failure(job: Job, task: Task, error: str, delay_s: float | None = None) -> Outcome:
    """A failed attempt: retryable after ``delay_s`` (default: the task's backoff), or
    discarded when it was the last."""
    if job.attempt >= (job.max_attempts or task.max_attempts):
        return Outcome.of(job, "discarded", error=error)
    if delay_s is None:
        delay_s = task.backoff.delay(job.attempt)
    return Outcome.of(job, "retryable", delay_s=delay_s, error=error)


def internal_failure(job: Job, task: Task, exc: BaseException) -> Outcome:
    """The outcome of an attempt that pgq itself failed to see through (a bug, or an
    exception raised where none was expected): a failed attempt, never a lost one."""
    log.error("job %d (%s) attempt %d: internal error", job.id, job.task, job.attempt, exc_info=exc)
    message = f"internal error running the job: {type(exc).__name__}: {exc}"
    tb = "".join(traceback.format_exception(exc))
    return _failure(job, task, error_entry(job.attempt, "internal", message, tb))


def execute(
    task: Task,
    execution: Execution,
    limiter: anyio.CapacityLimiter,
    hooks: Hooks | None = None,
) -> Awaitable[Outcome]:
    """Run ``execution``'s job and return its outcome; never raises for a task's failure.
    With ``hooks``, runs the App's middleware around the task and emits its events."""
    if not hooks:
        return _run(task, execution, limiter, None)  # no coroutine in between
    return _run_with_events(task, execution, limiter, hooks)


async def _run_with_events(
    task: Task,
    execution: Execution,
    limiter: anyio.CapacityLimiter,
    hooks: Hooks,
) -> Outcome:
    job = execution.ctx.job
    await hooks.emit(JobEvent("job_started", job))
    started = anyio.current_time()
    outcome = await _run(task, execution, limiter, hooks)
    state = JobState(outcome.state)
    error = serde.loads(outcome.error) if outcome.error else None
    duration = anyio.current_time() - started
    await hooks.emit(JobEvent("job_finished", job, state, error, duration))
    if state is JobState.RETRYABLE:
        await hooks.emit(JobEvent("job_retried", job, state, error, duration))
    return outcome


async def _run(
    task: Task,
    execution: Execution,
    limiter: anyio.CapacityLimiter,
    hooks: Hooks | None,
) -> Outcome:
    ctx = execution.ctx
    job = ctx.job

    call: Callable[[], Awaitable[Any]]
    middleware_chain = hooks.middleware if hooks is not None else []
    if task.is_async and not middleware_chain:
        # The common case, once per job: call the task itself, no wrapper in between.
        call = functools.partial(task.fn, ctx, **job.args)
    else:

        async def call_task() -> Any:
            if task.is_async:
                return await task.fn(ctx, **job.args)
            run = functools.partial(task.fn, ctx, **job.args)
            return await anyio.to_thread.run_sync(run, limiter=limiter, abandon_on_cancel=True)

        call = call_task
        for middleware in reversed(middleware_chain):
            call = functools.partial(middleware, ctx, call)

    result: Any = None
    try:
        try:
            if task.timeout is None:
                result = await call()
            else:
                deadline = asyncio.timeout(task.timeout)
                try:
                    async with deadline:
                        result = await call()
                except TimeoutError:
                    if not deadline.expired():
                        raise  # the task's own TimeoutError: an ordinary failure
                    ctx._request_cancel()
                    message = f"timed out after {task.timeout:g}s"
                    log.warning("job %d (%s) attempt %d %s", job.id, job.task, job.attempt, message)
                    return _failure(job, task, error_entry(job.attempt, "timeout", message))
        except asyncio.CancelledError:
            if execution.reason is None:
                raise  # not ours to stop (the worker itself is being torn down)
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()
        if execution.reason == CANCEL:
            # Requested by client.cancel(): an async task was cancelled; a thread saw
            # ctx.cancel_requested (or finished regardless). Either way it ends cancelled.
            return Outcome.of(
                job, "cancelled", error=error_entry(job.attempt, "cancel", "cancelled by request")
            )
        if execution.reason is not None:
            return interrupted(job, execution.reason)
    except Retry as exc:
        return _failure(job, task, error_entry(job.attempt, "retry", exc.reason), exc.delay_s)
    except Snooze as exc:
        return Outcome.of(
            job,
            "retryable" if exc.delay_s else "available",
            delay_s=exc.delay_s,
            attempt_delta=-1,
        )
    except Cancel as exc:
        return Outcome.of(job, "cancelled", error=error_entry(job.attempt, "cancel", exc.reason))
    except Exception as exc:
        message = f"{type(exc).__name__}: {exc}"
        log.debug("job %d (%s) attempt %d failed: %s", job.id, job.task, job.attempt, message)
        return _failure(
            job, task, error_entry(job.attempt, "exception", message, traceback.format_exc())
        )
    if result is None:
        return Outcome.of(job, "completed")
    try:
        return Outcome.of(job, "completed", result=serde.dumps(result, "result"))
    except Exception as exc:  # SerializationError, and whatever a strange object raises
        # The work is done; running it again to get a storable result could repeat side
        # effects. Complete it without a result and keep the reason.
        message = f"the result could not be stored: {exc}"
        log.warning("job %d (%s) attempt %d: %s", job.id, job.task, job.attempt, message)
        return Outcome.of(job, "completed", error=error_entry(job.attempt, "result", message))


def interrupted(job: Job, reason: str) -> Outcome:
    """A job the worker stopped (shutdown): retryable at once; the attempt does not count,
    since the job did not fail."""
    return Outcome.of(
        job,
        "retryable",
        delay_s=0.0,
        error=error_entry(job.attempt, reason, f"interrupted by worker {reason}"),
        attempt_delta=-1,
    )
