"""The :class:`Client`: enqueue jobs (alone, in bulk, or inside the caller's transaction),
act on them (cancel, retry, pause and resume queues), wait for them and read them back."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar, overload

import anyio

from pgq._core import serde
from pgq._core.names import check_queue_name
from pgq._core.specs import NewJob, _where, prepare
from pgq._core.tracing import require as require_tracing
from pgq._core.tracing import send_span, sent
from pgq._db import claims as store_claims
from pgq._db import enqueue
from pgq._db import jobs as store_jobs
from pgq._db import queues as store_queues
from pgq._db.boundary import CLOSED, database_errors, public
from pgq._db.claims import QueueLimits
from pgq._db.connections import Connection, Db, Pool, Target, create_pool
from pgq._db.drivers import AsyncpgDriver, caller_db, caller_driver, too_large_errors
from pgq._db.enqueue import Plan, run
from pgq._db.listen import CLOSED_DURING_WAIT, DoneWaiters
from pgq._db.queues import QueueInfo, QueueStats
from pgq._db.revision import check_schema
from pgq.app import App, JobSpec, Task
from pgq.errors import ClientClosed, ConfigError, SerializationError
from pgq.job import MAX_JOB_ID, Job, JobState, R
from pgq.settings import WorkerSettings

if TYPE_CHECKING:
    import psycopg
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

    AnyConnection = Connection | psycopg.AsyncConnection[Any] | AsyncConnection | AsyncSession

__all__ = ("Client", "QueueInfo", "QueueLimits", "QueueStats")

T = TypeVar("T")

#: How often wait() reads a job when it cannot LISTEN (behind a transaction pooler).
WAIT_POLL_S = 0.2
#: How often wait() reads a job while it LISTENs, in case a notification was lost.
WAIT_RECHECK_S = 10.0


class Client:
    """Enqueues jobs, acts on them and reads them. Use as ``async with pgq.Client(dsn) as
    client``, or pass ``pool=`` an asyncpg pool you own (the client then never closes it).

    Given ``app=``, the client checks task names and uses each task's queue, priority and
    max_attempts as defaults; without it, any valid task name is accepted. Every method that
    writes takes ``connection=``: an asyncpg connection, or a SQLAlchemy ``AsyncConnection``
    / ``AsyncSession``, whose transaction the write then joins; the enqueues take psycopg's
    ``AsyncConnection`` too (and SQLAlchemy's on ``postgresql+psycopg``).

    With ``tracing=True`` (default: ``PGQ_TRACING``; needs the ``otel`` extra) each enqueue
    is an OpenTelemetry span whose context the jobs carry, so their attempts continue it.

    Behind PgBouncer in transaction mode pass ``pooler="transaction"`` (or set
    ``PGQ_POOLER``): no session state, no kept prepared statements; :meth:`wait` then polls,
    or listens through ``listen_dsn`` (``PGQ_LISTEN_DSN``), a DSN that reaches Postgres
    directly. A ``pool=`` you give must then have ``statement_cache_size=0``.

    What the database or asyncpg raises under a method comes out as
    :class:`~pgq.DatabaseError` or a subclass (``DatabaseUnavailable``,
    ``TransactionConflict``), asyncpg's exception on ``__cause__``; before ``open()`` (on a
    pool of its own) and after ``close()`` every method raises :class:`~pgq.ClientClosed`.
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        pool: Pool | None = None,
        app: App | None = None,
        check_schema: bool = True,
        tracing: bool | None = None,
        pooler: str | None = None,
        listen_dsn: str | None = None,
    ) -> None:
        self._target = Target.resolve(dsn, pooler, listen_dsn, connects=pool is None)
        self._dsn = self._target.dsn
        self._tracing = WorkerSettings.from_env("tracing") if tracing is None else tracing
        if self._tracing:
            require_tracing()
        self._pool = pool
        self._owns_pool = pool is None
        self._app = app
        self._check_schema = check_schema
        self._waiters: DoneWaiters | None = None
        self._closed = False

    async def open(self) -> None:
        """Open the pool (unless one was given) and check the schema revision."""
        self._closed = False
        if self._pool is None:
            with database_errors(self._dsn):
                self._pool = await create_pool(
                    self._dsn, min_size=1, max_size=10, **self._target.options("pgq client")
                )
        if self._check_schema:
            try:
                with database_errors(self._dsn):
                    await check_schema(self._pool)
            except BaseException:
                await self.close()
                raise

    async def close(self) -> None:
        """Close the pool if this client opened it (and the LISTEN connection of wait())."""
        self._closed = True
        waiters, self._waiters = self._waiters, None  # an open() meanwhile starts afresh
        try:
            if waiters is not None:
                await waiters.close()
        finally:
            if self._pool is not None and self._owns_pool:
                await self._pool.close()
                self._pool = None

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    @property
    def pool(self) -> Pool:
        """The asyncpg pool in use (:class:`~pgq.ClientClosed` when there is none)."""
        if self._pool is None:
            if self._closed:
                raise ClientClosed(CLOSED)
            raise ClientClosed("the client is not open: use `async with pgq.Client(...)`")
        return self._pool

    async def _db(self, connection: AnyConnection | None, what: str) -> Db:
        return self.pool if connection is None else await caller_db(connection, what)

    # ------------------------------------------------------------------ enqueue

    @overload
    async def enqueue(
        self,
        task: JobSpec[R],
        /,
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
        connection: AnyConnection | None = None,
    ) -> Job[R]: ...

    @overload
    async def enqueue(
        self,
        task: Task[Any, R] | str,
        args: Mapping[str, Any] | None = None,
        /,
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
        connection: AnyConnection | None = None,
    ) -> Job[R]: ...

    @public
    async def enqueue(
        self,
        task: JobSpec[Any] | Task[Any, Any] | str,
        args: Mapping[str, Any] | None = None,
        /,
        *,
        connection: AnyConnection | None = None,
        **options: Any,
    ) -> Job[Any]:
        """Enqueue one job and return it: ``enqueue(task.spec(...), delay=...)`` (arguments
        checked by a type checker), or ``enqueue(task_or_name, {"arg": ...}, ...)``.
        ``delay`` (seconds) or ``run_at`` schedules it; options given here override the
        spec's.

        Wherever the task is known (a Task, a spec, or a name this client's App registers)
        the arguments are checked against its signature before anything is written.

        With ``connection=`` the job is written in that connection's transaction: it exists,
        and wakes workers, only if the caller commits.

        With ``unique_key`` (or ``unique=True``, which derives the key from task, queue and
        args, per ``unique_period`` seconds when given), a job whose key is already held by
        a job in ``unique_states`` is not enqueued: the existing job is returned with
        ``duplicate=True``.

        ``limit_key`` is the key the queue's per-key limits count the job under.
        ``depends_on`` (jobs or ids) makes the job wait, ``pending``, until every one of
        them has completed; if one ends discarded or cancelled, the job is cancelled (or,
        with ``on_parent_failure="run"``, runs anyway). See docs/flow-control.md.
        """
        if isinstance(task, JobSpec):
            if args is not None:
                raise ConfigError("pass a spec's arguments to task.spec(...), not to enqueue")
            spec = task
        else:
            spec = JobSpec(task, args or {})
        (job,) = await self.enqueue_many([spec.with_options(**options)], connection=connection)
        return job

    @public
    async def enqueue_many(
        self, specs: Iterable[JobSpec[Any]], *, connection: AnyConnection | None = None
    ) -> list[Job[Any]]:
        """Enqueue many jobs in one transaction; returns them in the order given.

        Every spec is checked and serialized before anything is written: one bad spec
        raises (naming its place, ``job N:``) and none are enqueued. A spec whose unique key
        is taken comes back as the job holding the key, with ``duplicate=True``. The batch
        is written whole or not at all; a call cancelled while its commit is under way may
        have written it (as for any commit whose reply never came). Any other error says
        whether the batch was written: one that says it was must not be retried.
        """
        rows = [prepare(i, spec, self._app) for i, spec in enumerate(specs)]
        if not rows:
            return []
        plan = enqueue.write(rows, own_connection=connection is None)
        if self._tracing:
            with send_span(rows) as span:
                jobs = await self._run(plan, connection, rows)
                sent(span, [j.id for j in jobs])
                return jobs
        return await self._run(plan, connection, rows)

    async def _run(self, plan: Plan[T], connection: AnyConnection | None, rows: list[NewJob]) -> T:
        """Run an enqueue's ``plan`` of ``rows`` in the caller's transaction, or on a
        connection of the pool."""
        try:
            if connection is not None:
                return await run(await caller_driver(connection), plan)
            async with self.pool.acquire() as own:
                return await run(AsyncpgDriver(own), plan)
        except too_large_errors() as exc:
            raise _too_large(rows, exc) from exc

    @public
    async def enqueue_chain(
        self, specs: Iterable[JobSpec[Any]], *, connection: AnyConnection | None = None
    ) -> list[Job[Any]]:
        """Enqueue jobs that run one after another: each waits for the one before it to
        complete (and is cancelled if it fails for good, unless its spec says
        ``on_parent_failure="run"``). All are written in one transaction; returns them in
        order. A task reads its predecessor's result from ``ctx.parents``."""
        rows = [prepare(i, spec, self._app) for i, spec in enumerate(specs)]
        return await self._run(enqueue.insert_chain(rows), connection, rows)

    @public
    async def enqueue_group(
        self,
        members: Iterable[JobSpec[Any]],
        callback: JobSpec[Any],
        *,
        connection: AnyConnection | None = None,
    ) -> tuple[list[Job[Any]], Job[Any]]:
        """Enqueue ``members``, which run side by side, and ``callback``, which runs once all
        of them have completed (with ``on_parent_failure="run"`` on its spec: once all have
        finished, however they ended). The callback reads the members, results included,
        from ``ctx.parents`` in the order given. Written in one transaction."""
        rows = [prepare(i, spec, self._app) for i, spec in enumerate(members)]
        last = prepare(len(rows), callback, self._app)
        return await self._run(enqueue.insert_group(rows, last), connection, [*rows, last])

    # ------------------------------------------------------------------ actions

    @public
    async def cancel(self, job_id: int, *, connection: AnyConnection | None = None) -> Job | None:
        """Cancel a job. Not yet running: it becomes ``cancelled`` at once. Running: its
        worker is told (NOTIFY, or its next poll) and cancels it (an async task is
        cancelled; a thread sees ``ctx.cancel_requested``); it ends ``cancelled`` unless it
        finished first. Returns the job as it is now (None if there is no such job)."""
        await self.cancel_many([_job_id(job_id)], connection=connection)
        return await self.get_job(job_id, connection=connection)

    @public
    async def cancel_many(
        self, job_ids: Iterable[int], *, connection: AnyConnection | None = None
    ) -> dict[int, JobState]:
        """Cancel several jobs; returns the state each acted-on job is in now (running jobs
        stay ``running`` until their worker stops them). Final jobs are left out."""
        return await store_jobs.cancel(await self._db(connection, "cancel_many"), _job_ids(job_ids))

    @public
    async def retry(
        self, job_ids: Iterable[int], *, connection: AnyConnection | None = None
    ) -> list[int]:
        """Make finished, retryable or scheduled jobs available now (allowing one more
        attempt to jobs that used theirs); returns the ids that were changed. A job whose
        unique key another job took after it finished is left out (two jobs would hold the
        key); the others are retried."""
        return await store_jobs.retry(await self._db(connection, "retry"), _job_ids(job_ids))

    @public
    async def pause_queue(self, name: str, *, connection: AnyConnection | None = None) -> None:
        """Stop every worker claiming from queue ``name`` (``"*"``: every queue). Persisted;
        jobs can still be enqueued; running jobs finish."""
        await store_queues.pause(await self._db(connection, "pause_queue"), _queue_or_star(name))

    @public
    async def resume_queue(self, name: str, *, connection: AnyConnection | None = None) -> None:
        """Undo :meth:`pause_queue` and wake the queue's workers."""
        await store_queues.resume(await self._db(connection, "resume_queue"), _queue_or_star(name))

    @public
    async def set_queue_limits(
        self,
        name: str,
        *,
        concurrency: int | None = None,
        rate: tuple[int, float] | None = None,
        key_concurrency: int | None = None,
        key_rate: tuple[int, float] | None = None,
        connection: AnyConnection | None = None,
    ) -> None:
        """Limit queue ``name`` across every worker, live: at most ``concurrency`` of its jobs
        running at once, at most ``rate[0]`` started in any ``rate[1]`` seconds (a sliding
        window); ``key_concurrency`` and ``key_rate`` are the same limits for each limit key
        of its jobs (``limit_key=`` at enqueue, or the task's ``limit_key_arg``). None
        clears that limit; all None clear the queue's limits. Enforced by the claim, under a
        lock on the queue's row (see docs/flow-control.md)."""
        if name == "*":
            raise ConfigError("limits apply to one queue at a time, not '*'")
        check_queue_name(name)
        if concurrency is not None:
            _check_count("concurrency", concurrency)
        if key_concurrency is not None:
            _check_count("key_concurrency", key_concurrency)
        count, period = _check_rate("rate", rate)
        key_count, key_period = _check_rate("key_rate", key_rate)
        limits = QueueLimits(concurrency, count, period, key_concurrency, key_count, key_period)
        await store_queues.set_limits(await self._db(connection, "set_queue_limits"), name, limits)

    @public
    async def queue_limits(self, name: str) -> QueueLimits:
        """The limits stored for queue ``name`` (all None: unlimited)."""
        return await store_claims.queue_limits(self.pool, check_queue_name(name))

    # ------------------------------------------------------------------ waiting

    @overload
    async def wait(self, job: Job[R], *, timeout: float | None = None) -> Job[R]: ...  # noqa: ASYNC109

    @overload
    async def wait(self, job: int, *, timeout: float | None = None) -> Job[Any]: ...  # noqa: ASYNC109

    @public
    async def wait(self, job: Job[Any] | int, *, timeout: float | None = None) -> Job[Any]:  # noqa: ASYNC109
        """Wait until the job (a Job, or its id) is final (completed, discarded, cancelled)
        and return it, with its ``result`` (typed as its task's, given a typed Job) or its
        ``errors``. Driven by LISTEN (behind a transaction pooler without ``listen_dsn``:
        a read every 0.2 s). Raises TimeoutError after ``timeout`` seconds, LookupError for
        an unknown job, :class:`~pgq.ClientClosed` when the client is closed (or closes
        meanwhile: a wait on a caller's pool takes a LISTEN connection only while open)."""
        job_id = _job_id(job if isinstance(job, int) else job.id)
        if not self._target.can_listen:
            return await self._poll_until_final(job_id, timeout)
        if self._waiters is None:
            listen = self._target.listen_target() if self._target.pooled else None
            self._waiters = DoneWaiters(self.pool, listen)
        waiters = self._waiters
        event = await waiters.event_for(job_id)
        try:
            with anyio.fail_after(timeout), self._closed_during():
                while True:
                    now = await self.get_job(job_id)
                    if now is None:
                        raise LookupError(f"no job {job_id}")
                    if now.state.is_final:
                        return now
                    # Bounded: a LISTEN connection that dies silently (a partition) sets
                    # nothing; reading the job again every so often still ends the wait.
                    with anyio.move_on_after(WAIT_RECHECK_S):
                        await event.wait()
                    waiters.forget(job_id, event)
                    event = await waiters.event_for(job_id)
        finally:
            waiters.forget(job_id, event)

    @contextlib.contextmanager
    def _closed_during(self) -> Iterator[None]:
        """Inside a wait: what it meets once its client was closed (a pool closing, or
        gone) is raised as the ClientClosed that says so."""
        try:
            yield
        except Exception as exc:
            if not self._closed or isinstance(exc, LookupError | ClientClosed):
                raise
            raise ClientClosed(CLOSED_DURING_WAIT) from exc

    async def _poll_until_final(self, job_id: int, timeout: float | None) -> Job[Any]:  # noqa: ASYNC109
        with anyio.fail_after(timeout), self._closed_during():
            while True:
                if self._closed:
                    raise ClientClosed(CLOSED_DURING_WAIT)
                now = await self.get_job(job_id)
                if now is None:
                    raise LookupError(f"no job {job_id}")
                if now.state.is_final:
                    return now
                await anyio.sleep(WAIT_POLL_S)

    # ------------------------------------------------------------------ reads

    @public
    async def get_job(self, job_id: int, *, connection: AnyConnection | None = None) -> Job | None:
        """The job with ``job_id``, or None."""
        return await store_jobs.get(await self._db(connection, "get_job"), _job_id(job_id))

    @public
    async def list_jobs(
        self,
        *,
        state: JobState | str | Sequence[JobState | str] | None = None,
        queue: str | None = None,
        task: str | None = None,
        args: Mapping[str, Any] | None = None,
        limit: int = 50,
    ) -> list[Job]:
        """The newest jobs matching the filters: a state (or several), a queue, a task, and
        ``args`` that a job's arguments must contain (``{"user_id": 7}``)."""
        if state is None:
            states = None
        elif isinstance(state, str):
            states = [JobState(state)]
        else:
            states = [JobState(s) for s in state]
        return await store_jobs.list_jobs(
            self.pool,
            states=states,
            queue=queue,
            task=task,
            args_contain=None if args is None else serde.dumps(dict(args), "args"),
            limit=limit,
        )

    @public
    async def count_by_state(self, queue: str | None = None) -> dict[JobState, int]:
        """How many jobs are in each state (all queues, or one)."""
        return await store_jobs.count_by_state(self.pool, queue)

    @public
    async def list_queues(self) -> list[QueueInfo]:
        """Every queue known from jobs, producers or pause settings."""
        return await store_queues.list_queues(self.pool)

    @public
    async def stats(self, *, stale_after: float | None = None) -> list[QueueStats]:
        """Per queue: counts by state, oldest available job's age, last minute's throughput,
        and the jobs no live worker of the queue serves (``unrunnable``, by task: due for
        longer than ``stale_after`` seconds, default ``PGQ_STALE_AFTER`` or 30). Every queue
        with jobs, and every one a live worker serves or that has limits or a pause."""
        stale = WorkerSettings.from_env("stale_after") if stale_after is None else stale_after
        async with self.pool.acquire() as conn:
            return await store_queues.stats(conn, float(stale))


#: The longest rate period a queue may have (a year, in seconds).
MAX_RATE_PERIOD_S = 365 * 24 * 3600


def _check_rate(option: str, rate: object) -> tuple[int | None, float | None]:
    if rate is None:
        return None, None
    if not isinstance(rate, tuple | list) or len(rate) != 2:
        raise ConfigError(f"{option} must be (count, seconds), e.g. (100, 60), not {rate!r}")
    count, period = rate
    _check_count(f"a {option}'s count", count)
    if (
        isinstance(period, bool)
        or not isinstance(period, int | float)
        or not 0 < period <= MAX_RATE_PERIOD_S
    ):
        raise ConfigError(
            f"a {option}'s period must be a number of seconds above 0 and at most "
            f"{MAX_RATE_PERIOD_S:,} (a year), not {period!r}"
        )
    return count, float(period)


def _check_count(what: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**31 - 1:
        raise ConfigError(f"{what} must be a whole number from 1 to {2**31 - 1:,}, not {value!r}")


def _job_id(job_id: object) -> int:
    """``job_id``, checked: a job id the jobs table can hold (else the driver's error)."""
    if isinstance(job_id, bool) or not isinstance(job_id, int) or not 1 <= job_id <= MAX_JOB_ID:
        raise ConfigError(
            f"a job id is a whole number from 1 to {MAX_JOB_ID} (no job has another), not "
            f"{job_id!r:.40}"
        )
    return int(job_id)


def _job_ids(job_ids: Iterable[int]) -> list[int]:
    if isinstance(job_ids, int | str | bytes):
        raise ConfigError(f"pass a list of job ids, not {job_ids!r:.40}")
    return [_job_id(i) for i in job_ids]


def _queue_or_star(name: str) -> str:
    return name if name == "*" else check_queue_name(name)


def _too_large(rows: list[NewJob], exc: Exception) -> SerializationError:
    # jsonb limits that a JSON text under serde.MAX_JSON_BYTES can still exceed (a huge
    # array of small numbers takes more room in jsonb than as text).
    largest = max(range(len(rows)), key=lambda i: len(rows[i].args_json))
    return SerializationError(
        f"{_where(largest)}args of task {rows[largest].task!r} are "
        f"{len(rows[largest].args_json.encode()):,} bytes of JSON, more than PostgreSQL can "
        f"store ({str(exc).splitlines()[0][:200]}); nothing was enqueued: store large data "
        "elsewhere and pass a reference",
        "args",
    )
