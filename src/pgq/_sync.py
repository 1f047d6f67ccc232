"""The :class:`SyncClient`: enqueue from synchronous code (Django, Flask, scripts, Celery
migrations), in the caller's transaction when asked."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar, overload

from pgq._boundary import database_errors, public_sync
from pgq._dsn import mask_dsn, scrub
from pgq._enqueue import _where, prepare
from pgq._store import enqueue
from pgq._store.codec import NewJob
from pgq._store.connections import Target
from pgq._store.enqueue import Plan
from pgq.app import App, JobSpec, Task
from pgq.errors import ConfigError, DatabaseUnavailable, SerializationError
from pgq.job import Job, R

if TYPE_CHECKING:
    import psycopg
    from sqlalchemy.engine import Connection as SAConnection
    from sqlalchemy.orm import Session

    SyncConnection = psycopg.Connection[Any] | SAConnection | Session

__all__ = ("SyncClient",)

T = TypeVar("T")


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
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        app: App | None = None,
        check_schema: bool = True,
        pooler: str | None = None,
    ) -> None:
        self._target = Target.resolve(dsn, pooler)
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

    def _libpq_options(self) -> dict[str, Any]:
        """libpq's keywords for the connection: pgq's 10 s to connect unless the DSN gives
        its own connect_timeout (a keyword here would override it)."""
        options: dict[str, Any] = self._target.libpq_options("pgq sync client")
        if "connect_timeout=" not in (self._dsn or ""):
            options["connect_timeout"] = 10
        return options

    def _connect(self) -> psycopg.Connection[Any]:
        import psycopg

        from pgq._store import sync

        if self._conn is not None and not self._conn.closed:
            return self._conn
        try:
            conn = psycopg.connect(
                self._dsn or "",
                autocommit=True,
                **self._libpq_options(),
            )
            if self._target.pooled:
                conn.prepare_threshold = None  # a prepared statement outlives the transaction
        except sync.CONNECTION_ERRORS as exc:
            raise DatabaseUnavailable(
                f"cannot connect to PostgreSQL at {mask_dsn(self._dsn)}: "
                f"{scrub(str(exc).strip(), self._dsn)}; check that the server is running and "
                "the DSN (--dsn, PGQ_DSN or DATABASE_URL) is right"
            ) from exc
        if self._check_schema:
            try:
                sync.check_schema(conn)
            except BaseException:
                conn.close()
                raise
        self._conn = conn
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

        from pgq._store import sync

        try:
            if connection is not None:
                caller = sync.caller_connection_sync(connection)
                return enqueue.run_sync(sync.PsycopgDriver(caller), plan)
            with self._lock:
                return enqueue.run_sync(sync.PsycopgDriver(self._connect()), plan)
        except psycopg.errors.ProgramLimitExceeded as exc:
            largest = max(range(len(rows)), key=lambda i: len(rows[i].args_json))
            raise SerializationError(
                f"{_where(largest)}args of task {rows[largest].task!r} are more than "
                f"PostgreSQL can store ({str(exc).splitlines()[0][:200]}); nothing was enqueued",
                "args",
            ) from exc
