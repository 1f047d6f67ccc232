"""Jobs as the worker and the client see them, the context a task receives, and the
exceptions a task raises to choose its outcome."""

from __future__ import annotations

import enum
import logging
import uuid
from collections.abc import Iterable, Mapping, MutableMapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Generic, Protocol

from typing_extensions import TypeVar

from pgq.errors import ConfigError

#: The result type of a job's task.
R = TypeVar("R", default=Any)

_S = TypeVar("_S")

#: The value the App's lifespan yielded, for the jobs a worker (or pgq.testing) runs inside
#: it; each worker's tasks inherit it from the task that entered the lifespan.
LIFESPAN_STATE: ContextVar[object] = ContextVar("pgq_lifespan_state")
_NO_STATE = object()

#: The queue of a task that names none.
DEFAULT_QUEUE = "default"
#: How many attempts a task's jobs get unless the task or the job says otherwise.
DEFAULT_MAX_ATTEMPTS = 20


class JobState(enum.StrEnum):
    """Where a job is in its life. ``completed``, ``discarded`` and ``cancelled`` are final;
    ``pending`` waits for the jobs it depends on.

    The order of the members is the order of the database enum ``pgq_job_state`` and gives
    each state its bit in a unique-states mask (bit *i* for the *i*-th state): new states are
    only ever appended, so stored masks keep their meaning.
    """

    SCHEDULED = "scheduled"
    AVAILABLE = "available"
    RUNNING = "running"
    RETRYABLE = "retryable"
    COMPLETED = "completed"
    DISCARDED = "discarded"
    CANCELLED = "cancelled"
    #: Waiting for the jobs it depends on (``depends_on``) to complete.
    PENDING = "pending"

    @property
    def is_final(self) -> bool:
        """True for the states a job never leaves by itself."""
        return self in FINAL_STATES

    @property
    def bit(self) -> int:
        """This state's bit in a unique-states mask."""
        return _BITS[self]


#: Each state by its value: ``STATES["running"]`` is ``JobState("running")``, at a
#: dictionary's cost rather than an enum call's (read once per job from the database).
STATES = {state.value: state for state in JobState}
#: The states a job never leaves by itself.
FINAL_STATES = frozenset({JobState.COMPLETED, JobState.DISCARDED, JobState.CANCELLED})
_BITS = {state: 1 << i for i, state in enumerate(JobState)}


def unique_mask(states: Iterable[JobState | str]) -> int:
    """The bit mask of ``states``, as the unique index reads it (``pgq_unique_active``).

    ``states`` must include every non-final state: see the error raised otherwise."""
    if isinstance(states, str | JobState):
        raise ConfigError(
            f"unique_states takes a list of states, not {states!r} alone (e.g. "
            "['available', 'completed', ...])"
        )
    mask = 0
    for state in states:
        try:
            mask |= JobState(state).bit
        except ValueError:
            raise ConfigError(
                f"unknown job state {state!r} in unique_states; states are "
                + ", ".join(s.value for s in JobState)
            ) from None
    missing = [s.value for s in JobState if not s.is_final and not mask & s.bit]
    if missing:
        raise ConfigError(
            "unique_states must include every state a job passes through before it finishes ("
            + ", ".join(s.value for s in JobState if not s.is_final)
            + "); missing: "
            + ", ".join(missing)
            + ". A job moves between these states by itself (claimed, retried, snoozed, "
            "handed back, released by its parents), and a move into a listed state would "
            "collide with a duplicate enqueued while the key was free. List completed, "
            "discarded or cancelled as well to keep the key after the job ends"
        )
    return mask


@dataclass(slots=True)
class Job(Generic[R]):
    """One job row. Fields the caller did not load are left at their defaults. Typed over
    its task's result where the task is known (``Job[R]``: ``result`` is an ``R`` once
    completed)."""

    id: int
    queue: str
    task: str
    args: dict[str, Any]
    state: JobState
    priority: int = 0
    attempt: int = 0
    #: None until claimed when the enqueuer left it to the task's default.
    max_attempts: int | None = None
    scheduled_at: datetime | None = None
    attempted_at: datetime | None = None
    finalized_at: datetime | None = None
    created_at: datetime | None = None
    producer_id: uuid.UUID | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    result: R | None = None
    unique_key: str | None = None
    #: True when enqueue found the unique key taken and returned the job holding it.
    duplicate: bool = False
    #: The fencing token of the attempt running now (None unless running): drawn when the
    #: job is claimed, it stays the same until the attempt's outcome is written.
    attempt_token: uuid.UUID | None = None
    #: The name of the worker that runs (or last ran) the job.
    attempted_by: str | None = None
    #: The key the queue's per-key limits count this job under (docs/flow-control.md).
    limit_key: str | None = None
    #: The ids of the jobs this one waits for, in the order given (None: no dependencies).
    depends_on: list[int] | None = None


#: The largest job id (ids are bigints).
MAX_JOB_ID = 2**63 - 1

#: The longest timeout or delay a task may set, in seconds (about 31 years): the deadlines
#: and retry times the database computes from them must stay within its dates.
MAX_SECONDS = 1e9


def _seconds(delay: float | timedelta | None) -> float | None:
    if delay is None:
        return None
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
    if not 0 <= seconds <= MAX_SECONDS:  # NaN fails too
        raise ValueError(f"a delay must be from 0 to {MAX_SECONDS:g} seconds, got {delay!r}")
    return seconds


class Retry(Exception):
    """Raise from a task to retry it after ``delay`` seconds (default: the task's backoff).

    The attempt counts: a job out of attempts is discarded.
    """

    def __init__(self, delay: float | timedelta | None = None, reason: str = "retry requested"):
        super().__init__(reason)
        self.delay_s = _seconds(delay)
        self.reason = reason


class Snooze(Exception):
    """Raise from a task to run it again after ``delay`` seconds without using an attempt."""

    def __init__(self, delay: float | timedelta, reason: str = "snoozed"):
        super().__init__(reason)
        seconds = _seconds(delay)
        assert seconds is not None
        self.delay_s = seconds
        self.reason = reason


class Discard(Exception):
    """Raise from a task to fail its job for good: ``discarded`` at once, whatever attempts
    are left (for failures a retry cannot fix: bad input, a missing record). The reason
    goes into the job's errors."""

    def __init__(self, reason: str = "discarded by the task"):
        super().__init__(reason)
        self.reason = reason


class Cancel(Exception):
    """Raise from a task to end its job as ``cancelled``: it will not run again."""

    def __init__(self, reason: str = "cancelled by the task"):
        super().__init__(reason)
        self.reason = reason


class JobLogger(logging.LoggerAdapter[logging.Logger]):
    """A logger that adds the job's id, task and attempt to each record."""

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        extra = self.extra or {}
        kwargs.setdefault("extra", {}).update(extra)
        return f"[job {extra['job_id']} {extra['task']}#{extra['attempt']}] {msg}", kwargs


_task_logger = logging.getLogger("pgq.task")


class Settling(Protocol):
    """What settles an attempt inside a task's own transaction (the worker's part)."""

    async def settle(self, ctx: JobContext, connection: Any, kind: str, **details: Any) -> None:
        """Write the outcome ``kind`` in ``connection``'s transaction."""
        ...

    def settle_sync(self, ctx: JobContext, connection: Any, kind: str, **details: Any) -> None:
        """The same from a plain ``def`` task, on a synchronous connection."""
        ...

    async def parents(self, job: Job) -> list[Job]:
        """The jobs ``job`` depends on, in its ``depends_on`` order."""
        ...


class JobContext:
    """What a task receives first: its job, a logger bound to it, cancellation state, and the
    means to settle its attempt inside its own transaction (:meth:`complete` and siblings)."""

    __slots__ = ("_cancel", "_log", "_own_outcomes", "_parents", "_settler", "_state", "job")

    def __init__(self, job: Job, settler: Settling | None = None) -> None:
        self.job = job
        # Read here, in the worker's task: a plain def task reads it later from a thread.
        self._state = LIFESPAN_STATE.get(_NO_STATE)
        # None until set: most jobs have no parents, and a running job holds the fewest
        # objects (each one more for the garbage collector to walk while it runs).
        self._parents: list[Job] | None = None
        # A plain flag: a task's thread reads it, the event loop sets it (atomic under the GIL).
        self._cancel = False
        self._log: JobLogger | None = None
        self._settler = settler
        #: (token, state) of each outcome this attempt wrote in its own transactions (None:
        #: none yet).
        self._own_outcomes: list[tuple[uuid.UUID, str]] | None = None

    @property
    def id(self) -> int:
        """The job's id."""
        return self.job.id

    @property
    def attempt(self) -> int:
        """This attempt's number, from 1."""
        return self.job.attempt

    @property
    def token(self) -> uuid.UUID | None:
        """This attempt's fencing token. A side effect written in the same database with
        ``WHERE EXISTS (SELECT 1 FROM pgq_jobs WHERE id = <ctx.id> AND attempt_token =
        <ctx.token> AND state = (SELECT 'running'::pgq_job_state))`` is written only while
        this attempt's outcome would still be accepted (see docs/liveness.md, which says why
        the sub-select)."""
        return self.job.attempt_token

    @property
    def args(self) -> Mapping[str, Any]:
        """The job's arguments, as enqueued."""
        return self.job.args

    @property
    def metadata(self) -> Mapping[str, Any]:
        """The job's metadata, as enqueued."""
        return self.job.metadata

    @property
    def parents(self) -> list[Job]:
        """The jobs this one depended on (``depends_on``), in the order given, as they were
        when this attempt started: a group's callback reads its members' results here
        (``[p.result for p in ctx.parents]``). Empty for a job without dependencies. A
        parent deleted since (by retention) is missing from the list."""
        if self._parents is None:
            self._parents = []
        return self._parents

    @property
    def log(self) -> JobLogger:
        """A logger whose records carry ``job_id``, ``task``, ``queue`` and ``attempt``
        (fields of ``pgq.logs.JsonFormatter``'s lines)."""
        if self._log is None:
            job = self.job
            self._log = JobLogger(
                _task_logger,
                {"job_id": job.id, "task": job.task, "queue": job.queue, "attempt": job.attempt},
            )
        return self._log

    def state(self, kind: type[_S]) -> _S:
        """What the App's lifespan (``@app.lifespan``) yielded, checked to be a ``kind``:
        the worker's engine, HTTP client or model, opened once per worker.
        ``ctx.state(Resources).http`` is typed as ``Resources`` says."""
        value = self._state
        if value is _NO_STATE:
            raise ConfigError(
                "ctx.state(): no lifespan is running; register one with @app.lifespan "
                "(it runs around pgq worker, an embedded Worker, testing.drain and "
                "testing.run_task)"
            )
        if not isinstance(value, kind):
            raise TypeError(
                f"ctx.state({kind.__name__}): the lifespan yielded a "
                f"{type(value).__name__}, not a {kind.__name__}"
            )
        return value

    @property
    def cancel_requested(self) -> bool:
        """True once the worker wants this job to stop (timeout, shutdown, cancel).

        Async tasks are cancelled outright; tasks running in a thread should check this
        between steps and return early.
        """
        return self._cancel

    def _request_cancel(self) -> None:
        self._cancel = True

    # ------------------------------------------------------------------ settling in a transaction

    async def complete(self, *, connection: Any, result: Any = None) -> None:
        """Complete this attempt inside ``connection``'s open transaction (an asyncpg
        connection, a psycopg AsyncConnection, or a SQLAlchemy AsyncConnection /
        AsyncSession on either driver), fenced on its token:
        your writes and the job's completion commit together, or not at all. Raises
        :class:`~pgq.AttemptSuperseded` when the attempt is no longer the job's (rescued,
        cancelled): let it roll your transaction back. Once it commits, nothing the attempt
        does afterwards changes the job; if you roll back, the attempt goes on."""
        await self._settling().settle(self, connection, "complete", result=result)

    async def retry(
        self,
        *,
        connection: Any,
        delay: float | timedelta | None = None,
        reason: str = "retry requested",
    ) -> None:
        """Like raising :class:`Retry`, written in ``connection``'s transaction (see
        :meth:`complete`)."""
        await self._settling().settle(self, connection, "retry", delay=delay, reason=reason)

    async def snooze(self, *, connection: Any, delay: float | timedelta) -> None:
        """Like raising :class:`Snooze`, written in ``connection``'s transaction."""
        await self._settling().settle(self, connection, "snooze", delay=delay)

    async def cancel(self, *, connection: Any, reason: str = "cancelled by the task") -> None:
        """Like raising :class:`Cancel`, written in ``connection``'s transaction."""
        await self._settling().settle(self, connection, "cancel", reason=reason)

    def complete_sync(self, *, connection: Any, result: Any = None) -> None:
        """:meth:`complete` for a plain ``def`` task: ``connection`` is a psycopg (3)
        connection, or a SQLAlchemy Connection / Session on the psycopg driver."""
        self._settling().settle_sync(self, connection, "complete", result=result)

    def retry_sync(
        self,
        *,
        connection: Any,
        delay: float | timedelta | None = None,
        reason: str = "retry requested",
    ) -> None:
        """:meth:`retry` for a plain ``def`` task (see :meth:`complete_sync`)."""
        self._settling().settle_sync(self, connection, "retry", delay=delay, reason=reason)

    def snooze_sync(self, *, connection: Any, delay: float | timedelta) -> None:
        """:meth:`snooze` for a plain ``def`` task (see :meth:`complete_sync`)."""
        self._settling().settle_sync(self, connection, "snooze", delay=delay)

    def cancel_sync(self, *, connection: Any, reason: str = "cancelled by the task") -> None:
        """:meth:`cancel` for a plain ``def`` task (see :meth:`complete_sync`)."""
        self._settling().settle_sync(self, connection, "cancel", reason=reason)

    def _settling(self) -> Settling:
        if self._settler is None:
            raise ConfigError(
                "this JobContext does not run under a pgq worker: an attempt can be settled in "
                "a transaction only there (pgq.testing.drain runs one)"
            )
        return self._settler


__all__ = (
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_QUEUE",
    "FINAL_STATES",
    "Cancel",
    "Discard",
    "Job",
    "JobContext",
    "JobState",
    "Retry",
    "Snooze",
    "unique_mask",
)
