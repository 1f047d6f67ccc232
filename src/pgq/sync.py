"""The :class:`SyncClient`: enqueue from synchronous code (Django, Flask, scripts, Celery
migrations), in the caller's transaction when asked; read, wait for, cancel and retry jobs."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar, overload

from pgq._core.dsn import mask_dsn, scrub
from pgq._core.specs import NewJob, _where, prepare
from pgq._db import enqueue
from pgq._db.boundary import CLOSED, database_errors, public_sync
from pgq._db.connections import Target
from pgq._db.enqueue import Plan
from pgq._db.listen import CLOSED_DURING_WAIT
from pgq.app import App, JobSpec, Task
from pgq.client import WAIT_POLL_S, WAIT_RECHECK_S, _job_id, _job_ids
from pgq.errors import ClientClosed, ConfigError, DatabaseUnavailable, SerializationError
from pgq.job import Job, JobState, R

if TYPE_CHECKING:
    import psycopg
    from sqlalchemy.engine import Connection as SAConnection
    from sqlalchemy.orm import Session

    from pgq._db.psycopg_drivers import DoneListener

    SyncConnection = psycopg.Connection[Any] | SAConnection | Session

__all__ = ("SyncClient",)

T = TypeVar("T")

#: How often a wait() that listens looks whether its client was closed meanwhile.
WAIT_CLOSED_CHECK_S = 1.0


class SyncClient:
    """Enqueues jobs from synchronous code, on psycopg (3): ``pip install
    'pgq-async[sync]'``. ``with pgq.SyncClient(dsn) as client: client.enqueue(...)``.

    Its own connection serves one call at a time (calls from several threads wait their
    turn); pass ``connection=`` a psycopg connection, or a SQLAlchemy ``Connection`` /
    ``Session`` on the ``postgresql+psycopg`` driver, and the job is written in that
    transaction: it exists, and wakes workers, only if the caller commits. Given ``app=``,
    task names and arguments are checked and each task's defaults applied, as
    :class:`~pgq.Client` does. Behind PgBouncer in transaction mode pass
    ``pooler="transaction"`` (or set ``PGQ_POOLER``): psycopg then prepares no statement.
    psycopg's errors come out as :class:`~pgq.DatabaseError` and its subclasses, as the
    async client's do; after ``close()`` its calls raise :class:`~pgq.ClientClosed` until
    it is opened again.

    Besides the enqueues, :meth:`get_job`, :meth:`wait`, :meth:`cancel`,
    :meth:`cancel_many` and :meth:`retry` do what :class:`~pgq.Client`'s do; ``wait``
    LISTENs on a connection of its own (``listen_dsn``, ``PGQ_LISTEN_DSN``, past a pooler).
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        app: App | None = None,
        check_schema: bool = True,
        pooler: str | None = None,
        listen_dsn: str | None = None,
    ) -> None:
        self._target = Target.resolve(dsn, pooler, listen_dsn)
        self._dsn = self._target.dsn
        self._app = app
        self._check_schema = check_schema
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()
        self._closed = False

    def open(self) -> None:
        """Connect (and check the schema revision)."""
        with self._lock, database_errors(self._dsn):
            self._closed = False
            self._connect()

    def close(self) -> None:
        """Close this client's own connection; its calls then raise
        :class:`~pgq.ClientClosed` until it is opened again."""
        with self._lock:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> Self:
        self.open()
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _libpq_options(self, dsn: str | None) -> dict[str, Any]:
        """libpq's keywords for a connection to ``dsn``: pgq's 10 s to connect unless the DSN
        gives its own connect_timeout (a keyword here would override it)."""
        options: dict[str, Any] = self._target.libpq_options("pgq sync client")
        if "connect_timeout=" not in (dsn or ""):
            options["connect_timeout"] = 10
        return options

    def _connect(self) -> psycopg.Connection[Any]:
        from pgq._db import psycopg_drivers

        if self._conn is not None and not self._conn.closed:
            return self._conn
        if self._closed:  # a call that began before close(), and waited for the lock
            raise ClientClosed(CLOSED)
        conn = self._new_connection(self._target)
        if self._check_schema:
            try:
                psycopg_drivers.check_schema(conn)
            except BaseException:
                conn.close()
                raise
        self._conn = conn
        return conn

    def _new_connection(self, target: Target) -> psycopg.Connection[Any]:
        """A new autocommit connection to ``target``, or DatabaseUnavailable saying why not."""
        import psycopg

        from pgq._db import psycopg_drivers

        try:
            conn = psycopg.connect(
                target.dsn or "", autocommit=True, **self._libpq_options(target.dsn)
            )
        except psycopg_drivers.CONNECTION_ERRORS as exc:
            raise DatabaseUnavailable(
                f"cannot connect to PostgreSQL at {mask_dsn(target.dsn)}: "
                f"{scrub(str(exc).strip(), target.dsn)}; check that the server is running "
                "and the DSN (--dsn, PGQ_DSN or DATABASE_URL) is right"
            ) from exc
        if self._target.pooled:
            conn.prepare_threshold = None  # a prepared statement outlives the transaction
        return conn

    @overload
    def enqueue(
        self, task: JobSpec[R], /, *, connection: SyncConnection | None = None, **options: Any
    ) -> Job[R]: ...

    @overload
    def enqueue(
        self,
        task: Task[Any, R] | str,
        args: Mapping[str, Any] | None = None,
        /,
        *,
        connection: SyncConnection | None = None,
        **options: Any,
    ) -> Job[R]: ...

    @public_sync
    def enqueue(
        self,
        task: JobSpec[Any] | Task[Any, Any] | str,
        args: Mapping[str, Any] | None = None,
        /,
        *,
        connection: SyncConnection | None = None,
        **options: Any,
    ) -> Job[Any]:
        """Enqueue one job and return it; the same arguments and options as
        :meth:`pgq.Client.enqueue`."""
        if isinstance(task, JobSpec):
            if args is not None:
                raise ConfigError("pass a spec's arguments to task.spec(...), not to enqueue")
            spec = task
        else:
            spec = JobSpec(task, args or {})
        (job,) = self.enqueue_many([spec.with_options(**options)], connection=connection)
        return job

    @public_sync
    def enqueue_chain(
        self, specs: Iterable[JobSpec[Any]], *, connection: SyncConnection | None = None
    ) -> list[Job[Any]]:
        """Jobs that run one after another, as :meth:`pgq.Client.enqueue_chain`."""
        rows = [prepare(i, spec, self._app) for i, spec in enumerate(specs)]
        return self._run(enqueue.insert_chain(rows), connection, rows)

    @public_sync
    def enqueue_group(
        self,
        members: Iterable[JobSpec[Any]],
        callback: JobSpec[Any],
        *,
        connection: SyncConnection | None = None,
    ) -> tuple[list[Job[Any]], Job[Any]]:
        """Members side by side and a callback after them, as
        :meth:`pgq.Client.enqueue_group`."""
        rows = [prepare(i, spec, self._app) for i, spec in enumerate(members)]
        last = prepare(len(rows), callback, self._app)
        return self._run(enqueue.insert_group(rows, last), connection, [*rows, last])

    @public_sync
    def enqueue_many(
        self, specs: Iterable[JobSpec[Any]], *, connection: SyncConnection | None = None
    ) -> list[Job[Any]]:
        """Enqueue many jobs in one round trip (COPY for a batch on this client's own
        connection); returns them in the order given. Every spec is checked before anything
        is written."""
        rows = [prepare(i, spec, self._app) for i, spec in enumerate(specs)]
        if not rows:
            return []
        return self._run(enqueue.write(rows, own_connection=connection is None), connection, rows)

    def _run(self, plan: Plan[T], connection: SyncConnection | None, rows: list[NewJob]) -> T:
        """Run ``plan`` on the caller's connection, or (one call at a time) on this client's
        own."""
        import psycopg

        from pgq._db import psycopg_drivers

        try:
            if connection is not None:
                caller = psycopg_drivers.caller_connection_sync(connection)
                return enqueue.run_sync(psycopg_drivers.PsycopgDriver(caller), plan)
            with self._lock:
                return enqueue.run_sync(psycopg_drivers.PsycopgDriver(self._connect()), plan)
        except psycopg.errors.ProgramLimitExceeded as exc:
            largest = max(range(len(rows)), key=lambda i: len(rows[i].args_json))
            raise SerializationError(
                f"{_where(largest)}args of task {rows[largest].task!r} are more than "
                f"PostgreSQL can store ({str(exc).splitlines()[0][:200]}); nothing was enqueued",
                "args",
            ) from exc

    def _on(self, connection: SyncConnection | None, call: Callable[[Any], T]) -> T:
        """``call`` on the caller's connection, in its transaction, or (one call at a time)
        on this client's own."""
        from pgq._db import psycopg_drivers

        if connection is not None:
            return call(psycopg_drivers.caller_connection_sync(connection))
        with self._lock:
            return call(self._connect())

    # ------------------------------------------------------------------ reads and actions

    @public_sync
    def get_job(self, job_id: int, *, connection: SyncConnection | None = None) -> Job | None:
        """The job with ``job_id``, or None."""
        from pgq._db import psycopg_drivers

        checked = _job_id(job_id)
        return self._on(connection, lambda conn: psycopg_drivers.get_job(conn, checked))

    @public_sync
    def cancel(self, job_id: int, *, connection: SyncConnection | None = None) -> Job | None:
        """Cancel a job, as :meth:`pgq.Client.cancel`: not yet running, it is ``cancelled``
        at once; running, its worker is told and cancels it. Returns the job as it is now
        (None if there is no such job)."""
        self.cancel_many([_job_id(job_id)], connection=connection)
        return self.get_job(job_id, connection=connection)

    @public_sync
    def cancel_many(
        self, job_ids: Iterable[int], *, connection: SyncConnection | None = None
    ) -> dict[int, JobState]:
        """Cancel several jobs; the state each acted-on job is in now, as
        :meth:`pgq.Client.cancel_many` (final jobs are left out)."""
        from pgq._db import psycopg_drivers

        ids = _job_ids(job_ids)
        return self._on(connection, lambda conn: psycopg_drivers.cancel(conn, ids))

    @public_sync
    def retry(
        self, job_ids: Iterable[int], *, connection: SyncConnection | None = None
    ) -> list[int]:
        """Make finished, retryable or scheduled jobs available now; the ids changed, as
        :meth:`pgq.Client.retry` (a job whose unique key another job took meanwhile is
        left out)."""
        from pgq._db import psycopg_drivers

        ids = _job_ids(job_ids)
        return self._on(connection, lambda conn: psycopg_drivers.retry(conn, ids))

    # ------------------------------------------------------------------ waiting

    @overload
    def wait(self, job: Job[R], *, timeout: float | None = None) -> Job[R]: ...

    @overload
    def wait(self, job: int, *, timeout: float | None = None) -> Job[Any]: ...

    @public_sync
    def wait(self, job: Job[Any] | int, *, timeout: float | None = None) -> Job[Any]:
        """Wait until the job (a Job, or its id) is final and return it, as
        :meth:`pgq.Client.wait`. Listens: a connection of the wait's own LISTENs, and the
        job is read when its id is announced (and every 10 s, should a notification be
        lost). Behind a transaction pooler without ``listen_dsn`` it reads the job every
        0.2 s. Raises TimeoutError after ``timeout`` seconds, LookupError for an unknown
        job, :class:`~pgq.ClientClosed` once the client is closed (within a second)."""
        job_id = _job_id(job if isinstance(job, int) else job.id)
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or math.isnan(timeout)
        ):
            raise ConfigError(f"timeout must be a number of seconds or None, not {timeout!r:.40}")
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        if not self._target.can_listen:
            return self._poll_until_final(job_id, deadline, timeout)
        from pgq._db import psycopg_drivers

        listener = self._listener()
        try:
            while True:
                now = self._final(job_id)
                if now is not None:
                    return now
                recheck = min(deadline, time.monotonic() + WAIT_RECHECK_S)
                while (left := min(recheck, deadline) - time.monotonic()) > 0:
                    try:
                        if listener.announced(job_id, min(left, WAIT_CLOSED_CHECK_S)):
                            break
                    except psycopg_drivers.CONNECTION_ERRORS:
                        # Lost (a restart, a failover): listen again, and read the job again
                        # for what was announced meanwhile.
                        listener.conn.close()
                        listener = self._listener()
                        break
                    self._still_open()
                if time.monotonic() >= deadline:
                    now = self._final(job_id)
                    if now is not None:
                        return now
                    raise TimeoutError(f"job {job_id} is not final after {timeout:g} s")
        finally:
            listener.conn.close()

    def _listener(self) -> DoneListener:
        """A new connection of a wait's own, listening (past the pooler with listen_dsn)."""
        from pgq._db import psycopg_drivers

        conn = self._new_connection(self._target.listen_target())
        try:
            return psycopg_drivers.DoneListener(conn)
        except BaseException:
            conn.close()
            raise

    def _poll_until_final(self, job_id: int, deadline: float, timeout: float | None) -> Job:
        while True:
            now = self._final(job_id)
            if now is not None:
                return now
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"job {job_id} is not final after {timeout:g} s")
            time.sleep(min(left, WAIT_POLL_S))

    def _final(self, job_id: int) -> Job | None:
        """The job once it is final; None while it is not. LookupError if there is none."""
        from pgq._db import psycopg_drivers

        self._still_open()
        try:
            now = self._on(None, lambda conn: psycopg_drivers.get_job(conn, job_id))
        except ClientClosed:  # closed as the read waited its turn
            raise ClientClosed(CLOSED_DURING_WAIT) from None
        if now is None:
            raise LookupError(f"no job {job_id}")
        return now if now.state.is_final else None

    def _still_open(self) -> None:
        if self._closed:
            raise ClientClosed(CLOSED_DURING_WAIT)
