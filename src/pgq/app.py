"""The task registry: :class:`App` and :class:`Task`. No I/O happens here."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Concatenate, Generic, Protocol, overload

from typing_extensions import ParamSpec, TypeVar

from pgq._core import argtypes, serde
from pgq._core import lifespan as _lifespan
from pgq._core.backoff import Backoff
from pgq._core.cron import TimeSchedule, make_schedule
from pgq._core.hooks import EVENTS, EventName, Hook, Hooks, Middleware
from pgq._core.names import check_queue_name, check_task_name
from pgq.errors import ConfigError, UnknownTaskError
from pgq.job import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_QUEUE,
    MAX_SECONDS,
    Job,
    JobContext,
    JobState,
)

#: A task's parameters after the context, and its result.
P = ParamSpec("P", default=...)
R = TypeVar("R", default=Any)
_P = ParamSpec("_P")
_R = TypeVar("_R")
_L = TypeVar("_L", bound="Callable[[], contextlib.AbstractAsyncContextManager[Any]]")

#: The range of the jobs' integer columns (priority, max_attempts).
INT4_MIN, INT4_MAX = -(2**31), 2**31 - 1


class Task(Generic[P, R]):
    """A registered task: the function, the options its jobs get by default, and what its
    jobs' arguments must be. Typed over the function's parameters after the context (``P``)
    and its result (``R``): ``task.spec(...)`` is checked by a type checker like a call."""

    __slots__ = (
        "_checks",
        "_exact",
        "_names",
        "_positional",
        "_required",
        "_var_keyword",
        "app",
        "backoff",
        "fn",
        "is_async",
        "limit_key_arg",
        "max_attempts",
        "name",
        "priority",
        "queue",
        "timeout",
    )

    def __init__(
        self,
        fn: Callable[Concatenate[JobContext, P], Awaitable[R]]
        | Callable[Concatenate[JobContext, P], R],
        *,
        name: str,
        queue: str,
        max_attempts: int,
        timeout: float | None,
        priority: int,
        backoff: Backoff,
        limit_key_arg: str | None = None,
    ) -> None:
        if type(max_attempts) is not int or not 1 <= max_attempts <= INT4_MAX:
            raise ConfigError(
                f"task {name!r}: max_attempts must be a whole number from 1 to {INT4_MAX}, "
                f"got {max_attempts!r}"
            )
        if type(priority) is not int or not INT4_MIN <= priority <= INT4_MAX:
            # Every job of the task is written with it: refused here, not at each enqueue.
            raise ConfigError(
                f"task {name!r}: priority must be an integer from {INT4_MIN} to {INT4_MAX}, "
                f"got {priority!r}"
            )
        if timeout is not None and not (
            isinstance(timeout, int | float)
            and not isinstance(timeout, bool)
            and 0 < timeout <= MAX_SECONDS
        ):
            raise ConfigError(
                f"task {name!r}: timeout must be a number of seconds above 0 and at most "
                f"{MAX_SECONDS:g}, or None for no limit; got {timeout!r}"
            )
        if not isinstance(backoff, Backoff):
            raise ConfigError(
                f"task {name!r}: backoff must be a pgq.Backoff, got {backoff!r} (a fixed "
                "delay of 60 s: pgq.Backoff(base_s=60, max_s=60, jitter=0))"
            )
        self.fn: Callable[..., Any] = fn
        self.name = check_task_name(name)
        self.queue = check_queue_name(queue)
        self.max_attempts = max_attempts
        #: Seconds an attempt may run before it is cancelled (None: no limit).
        self.timeout = timeout
        self.priority = priority
        self.backoff = backoff
        #: The argument whose value is a job's limit key unless the enqueue gives one.
        self.limit_key_arg = limit_key_arg
        self.is_async = inspect.iscoroutinefunction(fn)
        #: The App the task is registered on (None for a Task made on its own).
        self.app: App | None = None
        self._read_signature()
        if limit_key_arg is not None and not (limit_key_arg in self._names or self._var_keyword):
            raise ConfigError(
                f"task {name!r}: limit_key_arg={limit_key_arg!r} is not one of its parameters"
            )

    def _read_signature(self) -> None:
        """What the job's arguments must be: they arrive as keyword arguments after the
        context, so a parameter that cannot take a keyword is refused here."""
        params = list(inspect.signature(self.fn).parameters.values())
        if not params or params[0].kind not in (_POSITIONAL_ONLY, _POSITIONAL_OR_KEYWORD):
            raise ConfigError(
                f"task {self.name!r}: its first parameter receives the JobContext; declare "
                "it, e.g. `async def task(ctx: pgq.JobContext, ...)`"
            )
        hints = argtypes.resolved_hints(self.fn)
        first = hints.get(params[0].name, Any)
        if first is not Any and not (
            isinstance(first, type)
            and (issubclass(first, JobContext) or issubclass(JobContext, first))
        ):
            raise ConfigError(
                f"task {self.name!r}: the first parameter receives the JobContext, so "
                f"{params[0].name} cannot be {argtypes.describe(first)}; declare it "
                "`ctx: pgq.JobContext` and the job's arguments after it"
            )
        rest = params[1:]
        odd = [p.name for p in rest if p.kind in (_POSITIONAL_ONLY, _VAR_POSITIONAL)]
        if odd:
            raise ConfigError(
                f"task {self.name!r}: job arguments are passed by keyword, so parameter(s) "
                f"{', '.join(odd)} (positional-only or *args) could never be given"
            )
        named = [p for p in rest if p.kind is not _VAR_KEYWORD]
        self._names = frozenset(p.name for p in named)
        self._positional = tuple(p.name for p in named if p.kind is _POSITIONAL_OR_KEYWORD)
        self._required = frozenset(p.name for p in named if p.default is inspect.Parameter.empty)
        self._var_keyword = len(named) < len(rest)
        # When every parameter is required (and none is **kwargs), valid args have exactly
        # these keys: one comparison decides.
        self._exact = (
            self._names if self._names == self._required and not self._var_keyword else None
        )
        #: (name, check, expected type) of each argument whose annotation JSON can carry.
        self._checks = argtypes.checks_of(self.fn, [p.name for p in named])

    def argument_problem(self, args: Mapping[str, Any]) -> str | None:
        """Why ``args`` cannot be this task's keyword arguments (their names, and their
        values against the annotations JSON can carry), or None when they can."""
        problem = self.names_problem(args)
        if problem is not None or not self._checks:
            return problem
        for name, check, expected in self._checks:
            if name in args and not check(args[name]):
                return (
                    f"task {self.name!r}: argument {name} must be {expected}, got "
                    f"{argtypes.shown(args[name])}"
                )
        return None

    def names_problem(self, args: Mapping[str, Any]) -> str | None:
        """Why ``args`` cannot be this task's keyword arguments by their names alone (what a
        worker checks before it runs a job), or None when they can."""
        if args.__class__ is serde.UndecodableArgs:
            return args.problem
        keys = args.keys()
        if self._exact is not None and keys == self._exact:
            return None
        if not self._var_keyword and not keys <= self._names:
            unknown = ", ".join(sorted(k for k in keys if k not in self._names))
            return (
                f"task {self.name!r} takes no argument {unknown} (its parameters: "
                f"{', '.join(sorted(self._names)) or 'none'})"
            )
        if not self._required <= keys:
            missing = ", ".join(sorted(self._required - keys))
            return f"task {self.name!r} is missing its required argument {missing}"
        return None

    def spec(self, *args: P.args, **kwargs: P.kwargs) -> JobSpec[R]:
        """A job of this task with these arguments, checked against its signature (and by a
        type checker), for :meth:`Client.enqueue` / :meth:`Client.enqueue_many`. Options
        are set with :meth:`JobSpec.with_options`."""
        if len(args) > len(self._positional):
            raise ConfigError(
                f"task {self.name!r} takes at most {len(self._positional)} positional "
                f"argument(s) after the context, got {len(args)}"
            )
        values = dict(zip(self._positional, args, strict=False))
        clash = values.keys() & kwargs.keys()
        if clash:
            raise ConfigError(f"task {self.name!r}: argument {', '.join(clash)} given twice")
        values.update(kwargs)
        problem = self.argument_problem(values)
        if problem is not None:
            raise ConfigError(f"{problem}; nothing was enqueued")
        return JobSpec(self, values)

    def __call__(self, ctx: JobContext, /, *args: P.args, **kwargs: P.kwargs) -> Any:
        """Call the function directly (no queue): handy in tests."""
        return self.fn(ctx, *args, **kwargs)

    def __repr__(self) -> str:
        return f"<Task {self.name!r} queue={self.queue!r}>"


_POSITIONAL_ONLY = inspect.Parameter.POSITIONAL_ONLY
_POSITIONAL_OR_KEYWORD = inspect.Parameter.POSITIONAL_OR_KEYWORD
_VAR_POSITIONAL = inspect.Parameter.VAR_POSITIONAL
_VAR_KEYWORD = inspect.Parameter.VAR_KEYWORD


@dataclass(slots=True)
class JobSpec(Generic[R]):
    """One job to enqueue: a task (or a task's name) and its keyword arguments, with options
    that, left as None, take the task's defaults (when known) or pgq's. ``delay`` is in
    seconds (or a timedelta), ``unique_period`` too (0.001 to 1e9 seconds). ``task.spec(...)``
    makes one whose arguments a type checker checks."""

    task: str | Task[Any, R]
    args: Mapping[str, Any] = field(default_factory=dict)
    queue: str | None = None
    priority: int | None = None
    delay: float | timedelta | None = None
    run_at: datetime | None = None
    max_attempts: int | None = None
    #: At most 32 tags, each of 1 to 128 characters.
    tags: Sequence[str] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)
    #: Jobs sharing a unique key never coexist in ``unique_states`` (at most 1,024 bytes
    #: of UTF-8).
    unique_key: str | None = None
    #: Derive ``unique_key`` from the task, queue and args (within ``unique_period`` seconds).
    unique: bool = False
    unique_period: float | timedelta | None = None
    #: States the key is unique across; default: all but completed, discarded, cancelled.
    #: Must include every one of those (a job moves between them by itself); add final
    #: states to keep the key after the job ends.
    unique_states: Sequence[JobState | str] | None = None
    #: The key the queue's per-key limits count the job under (default: the argument the
    #: task names with ``limit_key_arg``, if any); at most 1,024 bytes of UTF-8.
    limit_key: str | None = None
    #: Jobs (or their ids) this one waits for: it runs once every one has completed.
    depends_on: Sequence[Job[Any] | int] | None = None
    #: What a parent that ends discarded or cancelled means: "cancel" this job (and its own
    #: dependents), or "run" it anyway.
    on_parent_failure: str | None = None

    def with_options(
        self,
        *,
        queue: str | None = None,
        priority: int | None = None,
        delay: float | timedelta | None = None,
        run_at: datetime | None = None,
        max_attempts: int | None = None,
        tags: Sequence[str] | None = None,
        metadata: Mapping[str, Any] | None = None,
        unique_key: str | None = None,
        unique: bool | None = None,
        unique_period: float | timedelta | None = None,
        unique_states: Sequence[JobState | str] | None = None,
        limit_key: str | None = None,
        depends_on: Sequence[Job[Any] | int] | None = None,
        on_parent_failure: str | None = None,
    ) -> JobSpec[R]:
        """A copy with the options given (None: keep this spec's)."""
        given: dict[str, Any] = {
            "queue": queue, "priority": priority, "delay": delay, "run_at": run_at,
            "max_attempts": max_attempts, "tags": tags, "metadata": metadata,
            "unique_key": unique_key, "unique": unique, "unique_period": unique_period,
            "unique_states": unique_states, "limit_key": limit_key, "depends_on": depends_on,
            "on_parent_failure": on_parent_failure,
        }  # fmt: skip
        return dataclasses.replace(self, **{k: v for k, v in given.items() if v is not None})


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


class PeriodicDecorator(Protocol):
    """What ``@app.periodic(...)`` returns: it registers a function as a task (or takes a
    registered one) and keeps the task's types."""

    @overload
    def __call__(self, fn: Task[_P, _R], /) -> Task[_P, _R]: ...

    @overload
    def __call__(
        self, fn: Callable[Concatenate[JobContext, _P], Awaitable[_R]], /
    ) -> Task[_P, _R]: ...

    @overload
    def __call__(self, fn: Callable[Concatenate[JobContext, _P], _R], /) -> Task[_P, _R]: ...


class TaskDecorator(Protocol):
    """What ``@app.task(...)`` with options returns: a decorator that keeps the types."""

    @overload
    def __call__(
        self, fn: Callable[Concatenate[JobContext, _P], Awaitable[_R]], /
    ) -> Task[_P, _R]: ...

    @overload
    def __call__(self, fn: Callable[Concatenate[JobContext, _P], _R], /) -> Task[_P, _R]: ...


class App:
    """A registry of tasks. Create one, decorate functions with :meth:`task`, and hand it to
    a :class:`~pgq.Worker` (and optionally a :class:`~pgq.Client`, which then checks names)."""

    def __init__(self) -> None:
        self._tasks: dict[str, Task] = {}
        self.hooks = Hooks()
        self.schedules: list[Schedule] = []
        self._lifespan: _lifespan.Lifespan | None = None

    def lifespan(self, fn: _L) -> _L:
        """Register the worker's lifespan: an async context manager (e.g. made with
        ``contextlib.asynccontextmanager``) entered once when a worker starts and left when
        it stops, whatever the way (a signal, the end of ``--burst``, leaving ``async
        with``, a start-up that fails after it). What it yields, tasks read with
        ``ctx.state(Type)``::

            @app.lifespan
            @contextlib.asynccontextmanager
            async def resources() -> AsyncIterator[Resources]:
                async with httpx.AsyncClient() as http:
                    yield Resources(http)

        ``pgq worker``, an embedded :class:`~pgq.Worker`, ``testing.drain`` and
        ``testing.run_task`` run it. One per App."""
        if self._lifespan is not None:
            raise ConfigError("this App has a lifespan already; register one, which may nest")
        if not callable(fn):
            raise ConfigError(f"@app.lifespan takes an async context manager, got {fn!r}")
        self._lifespan = fn
        return fn

    def running(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Enter the lifespan (if any) and make its value what ``ctx.state`` returns in the
        jobs run inside; the worker and pgq.testing run jobs inside this."""
        return _lifespan.running(self._lifespan)

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
        ``job_rescued`` (the last fires in the worker that took the job back: the leader,
        a worker restarted under its stable name, or one handing back its own claim's
        lost reply; in a task of that worker's own, after the rescue committed). It
        receives a
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
    ) -> PeriodicDecorator:
        """Run a task on a schedule: a cron expression (``"*/5 * * * *"``, in ``timezone``)
        or ``every`` N seconds. Only the leader enqueues, once per slot, even across leader
        changes. A worker that was down enqueues at most the one most recent missed slot.
        ``run_on_start`` also enqueues a run whenever a worker starts leading.

        Decorates a function (registering it as a task) or an existing :class:`Task`."""
        schedule = make_schedule(cron, every, timezone)
        # Checked now, not by the leader at each slot: a schedule that cannot enqueue must
        # fail where it is declared.
        serde.dumps(dict(args or {}), "args")
        if queue is not None:
            check_queue_name(queue)

        def register(fn: Any) -> Any:
            task: Task[Any, Any] = fn if isinstance(fn, Task) else self.task(fn)
            problem = task.argument_problem(dict(args or {}))
            schedule_name = name or task.name
            if problem is None and any(s.name == schedule_name for s in self.schedules):
                problem = f"periodic schedule {schedule_name!r} exists; pass name="
            if problem is not None:
                if task is not fn:  # registered just now, for this schedule: undo it
                    del self._tasks[task.name]
                raise ConfigError(f"periodic schedule: {problem}")
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
    def task(self, fn: Callable[Concatenate[JobContext, _P], Awaitable[_R]], /) -> Task[_P, _R]: ...

    @overload
    def task(self, fn: Callable[Concatenate[JobContext, _P], _R], /) -> Task[_P, _R]: ...

    @overload
    def task(
        self,
        /,
        *,
        name: str | None = None,
        queue: str = DEFAULT_QUEUE,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        timeout: float | None = None,
        priority: int = 0,
        backoff: Backoff | None = None,
        limit_key_arg: str | None = None,
    ) -> TaskDecorator: ...

    def task(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        queue: str = DEFAULT_QUEUE,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        timeout: float | None = None,
        priority: int = 0,
        backoff: Backoff | None = None,
        limit_key_arg: str | None = None,
    ) -> Any:
        """Register a task. Its first parameter receives a :class:`~pgq.JobContext`; the
        job's args are passed as keyword arguments. ``async def`` tasks run on the event
        loop; plain ``def`` tasks run in a bounded pool of worker threads.

        ``timeout`` is in seconds; ``backoff`` shapes retries after failures.
        ``limit_key_arg`` names the argument whose value is a job's limit key (for the
        queue's per-key limits) when the enqueue gives none.
        """

        def register(f: Callable[..., Any]) -> Task[Any, Any]:
            if isinstance(f, Task):
                raise ConfigError(
                    f"task {f.name!r} is a task already (@app.periodic registers the function "
                    "it decorates): put @app.periodic above @app.task, whose options then apply"
                )
            task: Task[Any, Any] = Task(
                f,
                name=name or f.__name__,
                queue=queue,
                max_attempts=max_attempts,
                timeout=timeout,
                priority=priority,
                backoff=Backoff() if backoff is None else backoff,
                limit_key_arg=limit_key_arg,
            )
            if task.name in self._tasks:
                raise ConfigError(f"task {task.name!r} is registered twice; pass name= to one")
            task.app = self
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
