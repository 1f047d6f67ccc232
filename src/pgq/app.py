"""The task registry: :class:`App` and :class:`Task`. No I/O happens here."""

from __future__ import annotations

import inspect
import random
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, overload

from pgq import _serde
from pgq._cron import TimeSchedule, make_schedule
from pgq._hooks import EVENTS, EventName, Hook, Hooks, Middleware
from pgq.errors import ConfigError, UnknownTaskError
from pgq.job import DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE, JobContext

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
_TASK_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:\-]*")


def check_queue_name(name: object) -> str:
    """Return ``name`` if it is a valid queue name, else raise :class:`ConfigError`."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or len(name) > 128:
        raise ConfigError(
            f"invalid queue name {name!r}: use 1 to 128 letters, digits, '_', '.' or '-', "
            "not starting with '.' or '-'"
        )
    return name


def check_task_name(name: object) -> str:
    """Return ``name`` if it is a valid task name, else raise :class:`ConfigError`."""
    if not isinstance(name, str) or not _TASK_NAME.fullmatch(name) or len(name) > 255:
        raise ConfigError(
            f"invalid task name {name!r}: use 1 to 255 letters, digits, '_', '.', ':' or '-'"
        )
    return name


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with jitter: ``base_s * 2**(attempt-1)``, capped at ``max_s``,
    then spread by ``±jitter`` (a fraction) so failed jobs do not retry in lockstep."""

    base_s: float = 1.0
    max_s: float = 3600.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        if self.base_s < 0 or self.max_s < self.base_s or not 0 <= self.jitter < 1:
            raise ConfigError(
                f"invalid backoff {self!r}: need 0 <= base_s <= max_s and 0 <= jitter < 1"
            )

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before the attempt after ``attempt`` (which failed)."""
        raw = min(self.max_s, self.base_s * 2.0 ** min(max(attempt - 1, 0), 60))
        spread = (rng or random).uniform(-self.jitter, self.jitter)
        return max(0.0, raw * (1.0 + spread))


class Task:
    """A registered task: the function and the options its jobs get by default."""

    __slots__ = (
        "backoff",
        "fn",
        "is_async",
        "max_attempts",
        "name",
        "priority",
        "queue",
        "timeout",
    )

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str,
        queue: str,
        max_attempts: int,
        timeout: float | None,
        priority: int,
        backoff: Backoff,
    ) -> None:
        if max_attempts < 1:
            raise ConfigError(f"task {name!r}: max_attempts must be at least 1")
        if timeout is not None and timeout <= 0:
            raise ConfigError(f"task {name!r}: timeout must be a positive number of seconds")
        self.fn = fn
        self.name = check_task_name(name)
        self.queue = check_queue_name(queue)
        self.max_attempts = max_attempts
        #: Seconds an attempt may run before it is cancelled (None: no limit).
        self.timeout = timeout
        self.priority = priority
        self.backoff = backoff
        self.is_async = inspect.iscoroutinefunction(fn)

    def __call__(self, ctx: JobContext, /, *args: Any, **kwargs: Any) -> Any:
        """Call the function directly (no queue): handy in tests."""
        return self.fn(ctx, *args, **kwargs)

    def __repr__(self) -> str:
        return f"<Task {self.name!r} queue={self.queue!r}>"


@dataclass(frozen=True)
class Schedule:
    """A periodic job: which task, when, with what (None: the task's own option)."""

    name: str
    task: Task
    when: TimeSchedule
    args: dict[str, Any]
    run_on_start: bool
    queue: str | None
    priority: int | None
    max_attempts: int | None


class App:
    """A registry of tasks. Create one, decorate functions with :meth:`task`, and hand it to
    a :class:`~pgq.Worker` (and optionally a :class:`~pgq.Client`, which then checks names)."""

    def __init__(self) -> None:
        self._tasks: dict[str, Task] = {}
        self.hooks = Hooks()
        self.schedules: list[Schedule] = []

    def middleware(self, fn: Middleware) -> Middleware:
        """Register middleware around every job of this App, outermost first::

            @app.middleware
            async def timed(ctx, call_next):
                start = time.monotonic()
                try:
                    return await call_next()
                finally:
                    metrics.observe(ctx.job.task, time.monotonic() - start)

        An exception that escapes middleware counts as the attempt's failure (the job is
        retried, never lost)."""
        self.hooks.middleware.append(fn)
        return fn

    def on(self, event: EventName) -> Callable[[Hook], Hook]:
        """Register a hook for ``job_started``, ``job_finished``, ``job_retried`` or
        ``job_rescued`` (the last fires in the leader). It receives a
        :class:`~pgq.JobEvent`; it may be sync or async; if it fails, the failure is logged
        and the job goes on."""
        if event not in EVENTS:
            raise ConfigError(f"unknown event {event!r}: use one of {', '.join(EVENTS)}")

        def register(fn: Hook) -> Hook:
            self.hooks.handlers[event].append(fn)
            return fn

        return register

    def periodic(
        self,
        cron: str | None = None,
        *,
        every: float | None = None,
        timezone: str = "UTC",
        args: Mapping[str, Any] | None = None,
        name: str | None = None,
        run_on_start: bool = False,
        queue: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
    ) -> Callable[[Callable[..., Any] | Task], Task]:
        """Run a task on a schedule: a cron expression (``"*/5 * * * *"``, in ``timezone``)
        or ``every`` N seconds. Only the leader enqueues, once per slot, even across leader
        changes. A worker that was down enqueues at most the one most recent missed slot.
        ``run_on_start`` also enqueues a run whenever a worker starts leading.

        Decorates a function (registering it as a task) or an existing :class:`Task`."""
        schedule = make_schedule(cron, every, timezone)
        # Checked now, not by the leader at each slot: a schedule that cannot enqueue must
        # fail where it is declared.
        _serde.dumps(dict(args or {}), "args")
        if queue is not None:
            check_queue_name(queue)

        def register(fn: Callable[..., Any] | Task) -> Task:
            task = fn if isinstance(fn, Task) else self.task(fn)
            schedule_name = name or task.name
            if any(s.name == schedule_name for s in self.schedules):
                raise ConfigError(f"periodic schedule {schedule_name!r} exists; pass name=")
            self.schedules.append(
                Schedule(
                    schedule_name,
                    task,
                    schedule,
                    dict(args or {}),
                    run_on_start,
                    queue,
                    priority,
                    max_attempts,
                )
            )
            return task

        return register

    @overload
    def task(self, fn: Callable[..., Any], /) -> Task: ...

    @overload
    def task(
        self,
        *,
        name: str | None = None,
        queue: str = DEFAULT_QUEUE,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        timeout: float | None = None,
        priority: int = 0,
        backoff: Backoff | None = None,
    ) -> Callable[[Callable[..., Any]], Task]: ...

    def task(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        queue: str = DEFAULT_QUEUE,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        timeout: float | None = None,
        priority: int = 0,
        backoff: Backoff | None = None,
    ) -> Task | Callable[[Callable[..., Any]], Task]:
        """Register a task. Its first parameter receives a :class:`~pgq.JobContext`; the
        job's args are passed as keyword arguments. ``async def`` tasks run on the event
        loop; plain ``def`` tasks run in a bounded pool of worker threads.

        ``timeout`` is in seconds; ``backoff`` shapes retries after failures.
        """

        def register(f: Callable[..., Any]) -> Task:
            task: Task = Task(
                f,
                name=name or f.__name__,
                queue=queue,
                max_attempts=max_attempts,
                timeout=timeout,
                priority=priority,
                backoff=backoff or Backoff(),
            )
            if task.name in self._tasks:
                raise ConfigError(f"task {task.name!r} is registered twice; pass name= to one")
            self._tasks[task.name] = task
            return task

        return register(fn) if fn is not None else register

    @property
    def tasks(self) -> Mapping[str, Task]:
        """Registered tasks by name."""
        return self._tasks

    def get(self, name: str) -> Task:
        """The task called ``name``, or :class:`UnknownTaskError` listing the known ones."""
        try:
            return self._tasks[name]
        except KeyError:
            known = ", ".join(sorted(self._tasks)) or "none"
            raise UnknownTaskError(
                f"unknown task {name!r}: this App registers {known}; "
                "check the name or register it with @app.task"
            ) from None

    def queues(self) -> list[str]:
        """The queues the registered tasks use, in registration order."""
        return list(dict.fromkeys(t.queue for t in self._tasks.values()))

    def __iter__(self) -> Iterator[Task]:
        return iter(self._tasks.values())
