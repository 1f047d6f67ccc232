"""One attempt of a job, whole: its :class:`Outcome` (with the fencing token and the error
entries it writes), the run (the task call, its timeout, cancellation, thread offload, the
App's middleware and events: :func:`runner`), and the attempts that failed for want of a
resource (:class:`ResourceFailures`)."""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import math
import re
import traceback
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from time import monotonic
from typing import Any, Literal

import anyio

from pgq._core import serde
from pgq._core.hooks import CancelVerdict, Hooks, JobEvent, Middleware
from pgq.app import Task
from pgq.job import STATES, Cancel, Discard, Job, JobContext, JobState, Retry, Settling, Snooze

# --------------------------------------------------------------------------- the outcome
# The end of one attempt, as the attempt decides it and the outcomes' writer writes it.

#: Longest message and traceback kept in an error entry, in characters: a failure must never
#: make its own outcome too big to store.
MAX_MESSAGE = 10_000
MAX_TRACEBACK = 50_000

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


@dataclass(slots=True)
class Outcome:
    """One attempt's outcome. ``(job_id, token)`` is its fencing token: the write changes
    the job only while that attempt is still the one running. ``attempt_delta`` is -1 when
    the attempt must not count (a snooze, a shutdown). ``queue`` names the producer that ran
    it, for its counters."""

    job_id: int
    token: uuid.UUID | None
    attempt: int
    queue: str
    state: str
    delay_s: float | None = None
    error: str | None = None
    result: str | None = None
    attempt_delta: int = 0
    #: Why the attempt failed when the machine ran short (``MemoryError``, ``OSError
    #: ENOMEM``...): its producer counts it.
    resource: str | None = None

    @classmethod
    def of(
        cls,
        job: Job,
        state: str,
        *,
        delay_s: float | None = None,
        error: str | None = None,
        result: str | None = None,
        attempt_delta: int = 0,
    ) -> Outcome:
        """The outcome ``state`` for ``job``'s current attempt."""
        return cls(
            job.id,
            job.attempt_token,
            job.attempt,
            job.queue,
            state,
            delay_s,
            error,
            result,
            attempt_delta,
        )


def error_entry(
    attempt: int,
    kind: str,
    message: str,
    traceback: str | None = None,
    *,
    rescue: str | None = None,
) -> str:
    """One entry of a job's ``errors``, as JSON text (with ``rescue``, the token of the
    write that took the job back). Whatever the message holds (a NUL, a lone surrogate,
    megabytes of text), the entry can be stored."""
    entry = {
        "attempt": attempt,
        "kind": kind,
        "message": storable_text(message, MAX_MESSAGE),
        "traceback": None if traceback is None else storable_text(traceback, MAX_TRACEBACK),
    }
    if rescue is not None:
        entry["rescue"] = rescue
    return serde.dumps(entry, "error")


def storable_text(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters (saying so), with what jsonb cannot hold (NUL,
    lone surrogates) replaced by U+FFFD."""
    if len(text) > limit:
        text = f"{text[: limit // 2]}\n... [{len(text) - limit} characters cut] ...\n{text[-limit // 2 :]}"
    if not text.isascii():
        text = _UNSTORABLE.sub("\ufffd", text)
    elif "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    return text


# --------------------------------------------------------------------------- the attempt

log = logging.getLogger("pgq.executor")

#: Seconds before a job retries when pgq failed to see its attempt through and its task's
#: backoff failed too (a ``Backoff`` subclass whose ``delay`` raises).
INTERNAL_RETRY_S = 60.0

#: Why a job's cancel scope was cancelled by the worker.
SHUTDOWN = "shutdown"
CANCEL = "cancel"
#: Why a job claimed ahead was handed back before it began: its producer fenced itself,
#: or its attempt was rescued while it waited for a slot.
FENCED = "fenced"
RESCUED = "rescued"
#: ... or no slot freed within the wait the producer expected (jobs are longer than it
#: learnt): another worker may take it.
WAITED = "waited"

_NOT_STARTED = {
    SHUTDOWN: "handed back before it started: its worker is stopping",
    FENCED: "handed back before it started: its worker stopped claiming (its heartbeats "
    "failed, or it was held up past its fencing bound)",
    RESCUED: "handed back before it started: the attempt was rescued meanwhile",
    WAITED: "handed back before it started: no slot of its worker freed in time",
}


class _Fenced(BaseException):
    """The producer fenced itself (or fell silent past its fencing bound) after the job
    took its slot and before the task's body began. A BaseException: no middleware's
    ``except Exception`` turns it into the task's failure."""


def _always() -> bool:
    """The fence of an attempt no producer holds (tests, ``pgq.testing``): never closed."""
    return True


class Execution:
    """One running attempt: its context, and the asyncio task that runs it (cancelling the
    task is how the worker stops the attempt)."""

    __slots__ = (
        "cancel_sent", "cancel_spent", "ctx", "fence", "reason", "started", "task",
        "torn_down", "waited_s",
    )  # fmt: skip

    def __init__(
        self,
        job: Job,
        settler: Settling | None = None,
        fence: Callable[[], bool] = _always,
    ) -> None:
        self.ctx = JobContext(job, settler)
        #: Whether the producer may start a job now (not fenced, not silent past its
        #: fencing bound), asked again after each wait between the slot and the task's
        #: body (a thread, job_started hooks, parents, middleware).
        self.fence = fence
        self.reason: str | None = None
        self.task: asyncio.Task[None] | None = None
        #: Whether the task has taken its first step. A task cancelled before it would
        #: never run its body (nor its ``finally``): the job would stay running with no
        #: outcome. Until then a cancel only sets ``reason``, which the task reads first.
        self.started = False
        #: Seconds the job waited, claimed, for a slot: its timeout counts from the claim,
        #: as the database's deadline (and so the rescuer of hung jobs) does.
        self.waited_s = 0.0
        #: Whether :meth:`cancel` cancelled the task, and whether that cancellation was
        #: caught and spent (see :meth:`judge_cancel`).
        self.cancel_sent = False
        self.cancel_spent = False
        #: Set when the worker tears the task down (:meth:`tear_down`): from then on no
        #: cancellation is the attempt's to absorb.
        self.torn_down = False

    def check_fence(self) -> None:
        """Raise :class:`_Fenced` when the producer may not start a job now: the attempt
        is handed back, its body never begun (a peer may have rescued it meanwhile)."""
        if not self.fence():
            raise _Fenced

    def cancel(self, reason: str) -> None:
        """Stop the attempt: async tasks are cancelled, threads see ``cancel_requested``."""
        if self.reason is not None:
            return
        self.reason = reason
        self.ctx._request_cancel()
        if self.task is not None and self.started:
            self.cancel_sent = True
            self.task.cancel()

    def tear_down(self) -> None:
        """Cancel the task for good: the worker is being torn down around it."""
        self.torn_down = True
        if self.task is not None:
            self.task.cancel()

    def judge_cancel(self) -> CancelVerdict:
        """In an ``except asyncio.CancelledError`` around something the attempt awaits, what
        the cancellation is: ``"spent"`` when it is the worker's one cancel of this attempt
        (a stop, a cancel request), caught for the first time: it stopped what was awaited,
        and the attempt goes on to its outcome; ``"raise"`` when the worker is tearing the
        task down; ``"stray"`` for any other (the task cancelled itself, or awaited
        something that someone else cancelled): an error like any other, never a reason to
        end the job's task with no outcome."""
        if self.cancel_sent and not self.cancel_spent and not self.torn_down:
            self.cancel_spent = True
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()
            return "spent"
        return "raise" if self.torn_down else "stray"


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
    entry = error_entry(job.attempt, "internal", message, tb)
    try:
        return _failure(job, task, entry)
    except Exception:  # the task's backoff failed too: the attempt still ends, and counts
        log.exception("job %d (%s): its task's backoff failed", job.id, job.task)
        if job.attempt >= (job.max_attempts or task.max_attempts):
            return Outcome.of(job, "discarded", error=entry)
        return Outcome.of(job, "retryable", delay_s=INTERNAL_RETRY_S, error=entry)


#: Runs one attempt: ``(task, execution, limiter)`` to its outcome.
Runner = Callable[[Task, Execution, anyio.CapacityLimiter], Awaitable[Outcome]]


#: Which attempts emit their events: "failures" (``job_finished`` and ``job_retried`` for an
#: attempt that did not complete: only failure hooks listen), "every" (``job_started``, and
#: ``job_finished`` for every attempt), or None (no hook listens).
Report = Literal["failures", "every"] | None


def runner(hooks: Hooks | None) -> Runner:
    """How a producer with ``hooks`` runs each attempt (chosen once, not per job): the
    runner never raises for a task's failure; with hooks, it runs the App's middleware
    around the task and emits its events. Always :func:`_run` itself: no coroutine in
    between."""
    if not hooks:
        return functools.partial(_run, hooks=None, report=None)
    return functools.partial(_run, hooks=hooks, report="every" if hooks.every_job else "failures")


async def _finished(
    hooks: Hooks, execution: Execution, outcome: Outcome, started: float | None
) -> None:
    """Emit ``job_finished`` (and ``job_retried``) for ``outcome`` to the hooks that want it.
    A cancel of the attempt that lands in a hook ends that hook; the others run, and the
    outcome stands."""
    state = STATES[outcome.state]
    retried = state is JobState.RETRYABLE and hooks.wants("job_retried")
    failed = state is not JobState.COMPLETED and bool(hooks.failure_handlers)
    if hooks.wants("job_finished") or failed or retried:
        job = execution.ctx.job
        error = serde.loads(outcome.error) if outcome.error else None
        duration = None if started is None else monotonic() - started
        judge = execution.judge_cancel
        await hooks.emit(JobEvent("job_finished", job, state, error, duration), judge)
        if retried:
            await hooks.emit(JobEvent("job_retried", job, state, error, duration), judge)


async def _run(
    task: Task,
    execution: Execution,
    limiter: anyio.CapacityLimiter,
    hooks: Hooks | None,
    report: Report = None,
) -> Outcome:
    """Run one attempt to its outcome, emitting the events ``report`` names to ``hooks``."""
    ctx = execution.ctx
    job = ctx.job
    outcome: Outcome | None = None
    if report == "every" and hooks is not None:
        if hooks.wants("job_started"):
            await hooks.emit(JobEvent("job_started", job), execution.judge_cancel)
            if execution.reason is None and not execution.fence():
                execution.reason = FENCED
        if execution.reason is not None:
            # Stopped while its job_started hooks ran: the task never began. Its end is
            # still reported, as every attempt's is (hooks pair job_started with
            # job_finished), with no duration, since it did not run.
            outcome = stopped_before_start(job, execution.reason)
            await _finished(hooks, execution, outcome, None)
            return outcome
    started = monotonic()
    problem = task.names_problem(job.args)  # values were checked at enqueue
    if problem is not None:
        # Enqueued by name with arguments the task does not take (a stale producer of
        # jobs): no retry can fix that.
        log.debug("job %d: %s; discarding it", job.id, problem)  # the job log says so
        outcome = Outcome.of(job, "discarded", error=error_entry(job.attempt, "arguments", problem))
    else:
        middleware = hooks.middleware if hooks is not None else []
        result: Any = None
        try:
            try:
                if job.depends_on and ctx._settler is not None:
                    # Inside: a cancel or a shutdown during this read ends the attempt as any.
                    ctx._parents = await ctx._settler.parents(job)
                    execution.check_fence()
                if task.timeout is None and task.is_async and not middleware:
                    # The common case: the task itself, nothing in between.
                    result = await task.fn(ctx, **job.args)
                elif task.timeout is None:
                    result = await _make_call(task, execution, limiter, middleware)()
                else:
                    left = max(task.timeout - execution.waited_s, 0.0)
                    call = _make_call(task, execution, limiter, middleware)
                    result = await _within_timeout(left, task.timeout, ctx, call)
            except asyncio.CancelledError as exc:
                verdict = execution.judge_cancel()
                if verdict == "raise":
                    raise  # the worker itself is being torn down
                if verdict == "stray":
                    outcome = _raised(job, task, exc)  # a failure of the task's own
            if outcome is None and execution.reason is not None:
                outcome = _stopped(job, execution.reason)
        except Exception as exc:
            outcome = _raised(job, task, exc)
        except _Fenced:
            outcome = stopped_before_start(job, FENCED)
        if outcome is None:
            outcome = _completed(job, result)
            if report != "every":
                return outcome  # only failure hooks listen, if any: a completed job emits nothing
    if report is not None and hooks is not None:
        await _finished(hooks, execution, outcome, started)
    return outcome


def _make_call(
    task: Task, execution: Execution, limiter: anyio.CapacityLimiter, middleware: list[Middleware]
) -> Callable[[], Awaitable[Any]]:
    """The task call, in threads for plain ``def`` tasks, inside the App's middleware. The
    producer's fence is asked again right before the body: middleware, or the wait for a
    thread, may have taken any time."""
    ctx = execution.ctx
    job = ctx.job
    if task.is_async and not middleware:
        return functools.partial(task.fn, ctx, **job.args)

    async def call_task() -> Any:
        if task.is_async:
            execution.check_fence()
            return await task.fn(ctx, **job.args)
        run = functools.partial(task.fn, ctx, **job.args)
        async with limiter:  # taken here, so that the fence is asked once a thread is ours
            execution.check_fence()
            unlimited = anyio.CapacityLimiter(math.inf)  # the tokens are `limiter`'s
            return await anyio.to_thread.run_sync(run, limiter=unlimited, abandon_on_cancel=True)

    call: Callable[[], Awaitable[Any]] = call_task
    for mw in reversed(middleware):
        call = functools.partial(mw, ctx, call)
    return call


class _TimedOut(Exception):
    """The attempt overran its task's timeout."""


async def _within_timeout(
    left_s: float, limit_s: float, ctx: JobContext, call: Callable[[], Awaitable[Any]]
) -> Any:
    deadline = asyncio.timeout(left_s)
    try:
        async with deadline:
            return await call()
    except TimeoutError:
        if not deadline.expired():
            raise  # the task's own TimeoutError: an ordinary failure
        ctx._request_cancel()
        raise _TimedOut(f"timed out after {limit_s:g}s") from None


def _raised(job: Job, task: Task, exc: BaseException) -> Outcome:
    """The outcome of an attempt that raised ``exc``."""
    if isinstance(exc, Retry):
        return _failure(job, task, error_entry(job.attempt, "retry", exc.reason), exc.delay_s)
    if isinstance(exc, Snooze):
        state = "retryable" if exc.delay_s else "available"
        return Outcome.of(job, state, delay_s=exc.delay_s, attempt_delta=-1)
    if isinstance(exc, Cancel):
        return Outcome.of(job, "cancelled", error=error_entry(job.attempt, "cancel", exc.reason))
    if isinstance(exc, Discard):
        return Outcome.of(job, "discarded", error=error_entry(job.attempt, "discard", exc.reason))
    if isinstance(exc, _TimedOut):
        log.debug("job %d (%s) attempt %d %s", job.id, job.task, job.attempt, exc)
        return _failure(job, task, error_entry(job.attempt, "timeout", str(exc)))
    message = f"{type(exc).__name__}: {exc}"
    log.debug("job %d (%s) attempt %d failed: %s", job.id, job.task, job.attempt, message)
    tb = "".join(traceback.format_exception(exc))
    outcome = _failure(job, task, error_entry(job.attempt, "exception", message, tb))
    outcome.resource = resource_reason(exc)
    return outcome


def _completed(job: Job, result: Any) -> Outcome:
    if result is None:  # Outcome.of, inlined: once per job
        return Outcome(job.id, job.attempt_token, job.attempt, job.queue, "completed")
    try:
        return Outcome.of(job, "completed", result=serde.dumps(result, "result"))
    except Exception as exc:  # SerializationError, and whatever a strange object raises
        # The work is done; running it again to get a storable result could repeat side
        # effects. Complete it without a result and keep the reason.
        message = f"the result could not be stored: {exc}"
        log.warning("job %d (%s) attempt %d: %s", job.id, job.task, job.attempt, message)
        return Outcome.of(job, "completed", error=error_entry(job.attempt, "result", message))


def _stopped(job: Job, reason: str) -> Outcome:
    """The outcome of an attempt the worker stopped for ``reason`` once it had begun."""
    if reason == CANCEL:
        # Requested by client.cancel(): an async task was cancelled; a thread saw
        # ctx.cancel_requested (or finished regardless). Either way it ends cancelled.
        return Outcome.of(
            job, "cancelled", error=error_entry(job.attempt, "cancel", "cancelled by request")
        )
    return interrupted(job, reason)


def stopped_before_start(job: Job, reason: str) -> Outcome:
    """The outcome of a claimed job stopped before it began: cancelled on request, else
    handed back: available again at once, in its place in the queue (its ``scheduled_at``
    kept), the attempt not counted, with an entry in ``errors`` saying why."""
    if reason == CANCEL:
        return Outcome.of(
            job, "cancelled", error=error_entry(job.attempt, "cancel", "cancelled by request")
        )
    return Outcome.of(
        job,
        "available",
        error=error_entry(job.attempt, "shutdown", _NOT_STARTED.get(reason, reason)),
        attempt_delta=-1,
    )


def interrupted(job: Job, reason: str) -> Outcome:
    """A job the worker stopped (shutdown): handed back available, in its place in the queue,
    so any worker runs it again without waiting for a promotion; the attempt does not count,
    since the job did not fail."""
    return Outcome.of(
        job,
        "available",
        error=error_entry(job.attempt, reason, f"interrupted by worker {reason}"),
        attempt_delta=-1,
    )


# --------------------------------------------------------------------------- resources
# Attempts that failed for want of a resource (memory, file descriptors, disk): counted by
# task, and warned about once a window per task. A worker whose every attempt fails so stays
# alive for its liveness probe (a restart would not give the machine more memory, and other
# tasks may run fine); these counts are how an operator sees it.

resource_log = logging.getLogger("pgq.worker")

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
        resource_log.warning(
            "task %s (queue %s): %d attempt(s) failed for want of a resource (%s, job %d "
            "last) since the last warning; %d since the worker started. The worker stays up "
            "and healthy: give it more memory, file descriptors or disk, or make the task "
            "need less",
            task, self._queue, n, reason, job_id, self.by_task[task],
            extra={"pgq": {"task": task, "queue": self._queue, "resource": reason}},
        )  # fmt: skip
