"""Support for your own test suite: a database per test, running jobs to the end without
waiting for their schedules, asserting what was enqueued, and calling a task directly.

With pgq installed, pytest loads a plugin (``pgq._pytest_plugin``) whose fixtures build on
this module: ``pgq_database`` (the server, for the session), ``pgq_dsn`` (a migrated
database of the test's own) and ``pgq_client`` (a :class:`~pgq.Client` open on it). See
docs/testing.md.
"""

from __future__ import annotations

import itertools
import os
import re
import secrets
import socket
import tempfile
import warnings
from collections.abc import Callable, Iterable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import asyncpg
from typing_extensions import ParamSpec, TypeVar

from pgq import migrate
from pgq._core import serde
from pgq._core.dsn import resolve_dsn
from pgq._db import databases as admin
from pgq._db import jobs, maintenance
from pgq._db.connections import create_pool
from pgq._worker.worker import Worker
from pgq.app import App, Task
from pgq.client import Client
from pgq.errors import ConfigError, PgqError
from pgq.job import Job, JobContext, JobState

__all__ = (
    "DrainResult",
    "TestDatabase",
    "assert_enqueued",
    "drain",
    "enqueued",
    "run_task",
)

P = ParamSpec("P")
R = TypeVar("R")

# --------------------------------------------------------------------------- databases


class TestDatabase:
    """A PostgreSQL server for tests, and migrated databases on it, one per test.

    The server is ``PGQ_TEST_DSN`` when set; else a server at ``127.0.0.1:5432`` (user
    ``PGUSER`` or ``postgres``) when one answers and ``PGQ_TEST_EMBEDDED`` is not ``1``; else
    an embedded server (``pip install 'pgq-async[embedded]'``) whose data stays in
    ``PGQ_TEST_EMBEDDED_DIR`` (default: a folder in the system's temporary directory).
    Databases are copies of a template migrated once, so each costs a few milliseconds.

    Their names are ``<prefix>_<token>_...``: ``prefix`` (default ``pgq``, else
    ``PGQ_TEST_DB_PREFIX``) and a random token of this object's own, so suites sharing a
    server (CI containers whose process ids repeat) never meet; only databases this object
    created are ever dropped. ``setup`` runs once on the template after pgq's migrations,
    with its DSN: the application's own migrations.
    """

    __test__ = False  # not a test class, whatever pytest's naming rules say

    def __init__(
        self,
        server_dsn: str,
        embedded: Any = None,
        *,
        prefix: str | None = None,
        setup: Callable[[str], None] | None = None,
    ) -> None:
        self.server_dsn = server_dsn
        self._embedded = embedded
        self._template: str | None = None
        self._setup = setup
        prefix = prefix or os.environ.get("PGQ_TEST_DB_PREFIX") or "pgq"
        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,29}", prefix):
            raise ConfigError(
                f"test database prefix {prefix!r}: use up to 30 lower-case letters, digits "
                "and underscores, not starting with a digit"
            )
        #: What every database of this object's is named after: ``<prefix>_<random token>``.
        self.name_base = f"{prefix}_{secrets.token_hex(6)}"
        self._created: set[str] = set()
        self._counter = itertools.count()

    @staticmethod
    def choice() -> str:
        """Which server :meth:`start` would use, and why, in a sentence (for pytest's header)."""
        explicit = os.environ.get("PGQ_TEST_DSN")
        if explicit:
            return f"the server of PGQ_TEST_DSN ({_redacted(explicit)})"
        if os.environ.get("PGQ_TEST_EMBEDDED") != "1" and _port_open("127.0.0.1", 5432):
            user = os.environ.get("PGUSER", "postgres")
            return (
                f"the server answering at 127.0.0.1:5432, as user {user} (PGQ_TEST_DSN unset; "
                "set it, or PGQ_TEST_EMBEDDED=1, to choose another)"
            )
        return "an embedded server (PGQ_TEST_DSN unset, nothing at 127.0.0.1:5432)"

    @classmethod
    def start(
        cls, *, prefix: str | None = None, setup: Callable[[str], None] | None = None
    ) -> TestDatabase:
        """Find (or start) the server; blocking."""
        explicit = os.environ.get("PGQ_TEST_DSN")
        if explicit:
            return cls(explicit, prefix=prefix, setup=setup)
        if os.environ.get("PGQ_TEST_EMBEDDED") != "1" and _port_open("127.0.0.1", 5432):
            user = os.environ.get("PGUSER", "postgres")
            return cls(f"postgresql://{user}@127.0.0.1:5432/postgres", prefix=prefix, setup=setup)
        try:
            with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
                warnings.simplefilter("ignore")
                import pgserver
        except ImportError:
            raise ConfigError(
                "no PostgreSQL for the tests: set PGQ_TEST_DSN, start a server on "
                "127.0.0.1:5432, or install pgq-async[embedded] for an embedded one"
            ) from None
        data = Path(
            os.environ.get("PGQ_TEST_EMBEDDED_DIR")
            or Path(tempfile.gettempdir()) / f"pgq-test-server-{os.getuid()}"
        )
        data.mkdir(parents=True, exist_ok=True)
        server = pgserver.get_server(data, cleanup_mode="stop")  # type: ignore[attr-defined]
        return cls(server.get_uri(), server, prefix=prefix, setup=setup)

    def dsn_of(self, database: str) -> str:
        """The server's DSN, pointing at ``database``."""
        return urlunsplit(urlsplit(self.server_dsn)._replace(path="/" + database))

    def template(self) -> str:
        """The name of a database migrated to head (and by ``setup``), made on first use."""
        if self._template is None:
            name = f"{self.name_base}_template"
            anyio.run(self._create, name, None)
            migrate.upgrade(self.dsn_of(name))
            if self._setup is not None:
                self._setup(self.dsn_of(name))
            self._template = name
        return self._template

    def create(self, *, migrated: bool = True) -> str:
        """A new database of its own (migrated, unless told otherwise); returns its DSN."""
        name = f"{self.name_base}_{next(self._counter)}"
        anyio.run(self._create, name, self.template() if migrated else None)
        return self.dsn_of(name)

    def drop(self, dsn: str) -> None:
        """Drop a database made by :meth:`create` (any other name is refused)."""
        name = urlsplit(dsn).path.lstrip("/")
        if name not in self._created:
            raise ConfigError(f"database {name!r} was not created by this TestDatabase")
        anyio.run(self._drop, name)

    def close(self) -> None:
        """Drop what is left of the databases made here, the template last, and stop an
        embedded server."""
        template, self._template = self._template, None
        for name in sorted(self._created - {template}):
            anyio.run(self._drop, name)
        if template is not None:
            anyio.run(self._drop, template)
        if self._embedded is not None:
            self._embedded.cleanup()

    async def _create(self, name: str, template: str | None) -> None:
        # CREATE fails on a name taken: never drop one first, it may be another suite's.
        conn = await asyncpg.connect(self.server_dsn)
        try:
            await admin.create_database(conn, name, template)
            self._created.add(name)
        finally:
            await conn.close()

    async def _drop(self, name: str) -> None:
        conn = await asyncpg.connect(self.server_dsn)
        try:
            await admin.drop_database(conn, name)
            self._created.discard(name)
        finally:
            await conn.close()


def _redacted(dsn: str) -> str:
    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@")))


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


# --------------------------------------------------------------------------- running jobs


@dataclass
class DrainResult:
    """What :func:`drain` ran, each job as it ended."""

    jobs: list[Job] = field(default_factory=list)

    def by_state(self, state: JobState | str) -> list[Job]:
        """The jobs that ended in ``state``."""
        return [j for j in self.jobs if j.state is JobState(state)]

    @property
    def completed(self) -> list[Job]:
        """The jobs that completed."""
        return self.by_state(JobState.COMPLETED)

    @property
    def discarded(self) -> list[Job]:
        """The jobs that failed for good."""
        return self.by_state(JobState.DISCARDED)


#: Settings for a drain: quick, and nothing judged stale within a test's lifetime.
_DRAIN_SETTINGS: dict[str, Any] = {
    "poll_interval": 0.05,
    "schedule_interval": 0.05,
    "heartbeat_interval": 1.0,
    "heartbeat_timeout": 1.0,
    "max_heartbeat_failures": 3,
    "stale_after": 60.0,
    "reap_after": 120.0,
    "shutdown_timeout": 5.0,
}


async def drain(
    app: App,
    dsn: str,
    *,
    queues: Iterable[str] | None = None,
    time_travel: bool = True,
    max_rounds: int = 100,
    timeout: float = 60.0,  # noqa: ASYNC109 - a bound on the whole drain, in seconds
) -> DrainResult:
    """Run the App's jobs until none is left and return every job that ran, as it ended.

    Available jobs run; with ``time_travel`` (the default), scheduled and retryable jobs are
    made due at once instead of waited for, round after round, so delayed jobs and retries
    with backoff run to their end in no time. Raises :class:`~pgq.PgqError` when jobs are
    still waiting after ``max_rounds`` rounds (a job that snoozes forever), TimeoutError
    after ``timeout`` seconds."""
    worker = Worker(
        app, dsn, queues=list(queues) if queues is not None else None, **_DRAIN_SETTINGS
    )
    pool = await create_pool(resolve_dsn(dsn), min_size=1, max_size=2)
    try:
        started = await maintenance.database_now(pool)
        rounds: dict[str, int] = {}

        async def make_due(producer: Any) -> int:
            rounds[producer.queue] = rounds.get(producer.queue, 0) + 1
            if rounds[producer.queue] > max_rounds:
                return 0  # the worker stops; the drain then says why
            return await maintenance.make_due_now(pool, producer.queue, producer.plan.tasks)

        with anyio.fail_after(timeout):
            if time_travel:
                await worker._run_traveling(make_due)
            else:
                await worker.run(burst=True)
        if any(n > max_rounds for n in rounds.values()):
            raise PgqError(
                f"drain: jobs still waiting after {max_rounds} rounds of making them due "
                "(a job that snoozes or retries without end?)"
            )
        return DrainResult(await jobs.attempted_since(pool, started))
    finally:
        await pool.close()


# --------------------------------------------------------------------------- asserting


async def enqueued(
    client: Client,
    task: str | Task[Any, Any] | None = None,
    args: Mapping[str, Any] | None = None,
    *,
    queue: str | None = None,
    states: Iterable[JobState | str] = (JobState.SCHEDULED, JobState.AVAILABLE, JobState.RETRYABLE),
    limit: int = 1000,
) -> list[Job]:
    """The jobs waiting to run (by default) of ``task``, whose arguments contain ``args``,
    in ``queue``: what a test asserts was enqueued, without running anything."""
    name = task.name if isinstance(task, Task) else task
    found = await client.list_jobs(
        state=list(states), queue=queue, task=name, args=args, limit=limit
    )
    return sorted(found, key=lambda j: j.id)


async def assert_enqueued(
    client: Client,
    task: str | Task[Any, Any],
    args: Mapping[str, Any] | None = None,
    *,
    queue: str | None = None,
    count: int | None = None,
) -> list[Job]:
    """Assert that jobs of ``task`` (with arguments containing ``args``, in ``queue``) wait
    to run: at least one, or exactly ``count``. Returns them. The failure message lists
    what is waiting instead."""
    found = await enqueued(client, task, args, queue=queue)
    if (count is None and found) or (count is not None and len(found) == count):
        return found
    waiting = await enqueued(client)
    seen = "\n".join(
        f"  job {j.id}: {j.task}({serde.dumps(j.args)}) in queue {j.queue}" for j in waiting
    )
    name = task.name if isinstance(task, Task) else task
    wanted = f"{'exactly ' + str(count) if count is not None else 'a'} job of {name!r}"
    where = (f" with args containing {dict(args)}" if args else "") + (
        f" in queue {queue!r}" if queue else ""
    )
    raise AssertionError(
        f"expected {wanted}{where}, found {len(found)}; waiting to run:\n{seen or '  nothing'}"
    )


# --------------------------------------------------------------------------- calling tasks


async def run_task(
    task: Task[P, R],
    *args: P.args,
    **kwargs: P.kwargs,
) -> R:
    """Call ``task``'s function as a worker would, with a real :class:`~pgq.JobContext`
    (attempt 1, no database), inside its App's lifespan: plain ``def`` tasks in a thread. Returns its result; whatever
    it raises (``pgq.Retry`` included) propagates."""
    spec = task.spec(*args, **kwargs)
    job: Job[R] = Job(0, task.queue, task.name, dict(spec.args), JobState.RUNNING, attempt=1)
    async with task.app.running() if task.app is not None else nullcontext():
        ctx = JobContext(job)
        if task.is_async:
            result: R = await task.fn(ctx, **job.args)
            return result
        return await anyio.to_thread.run_sync(lambda: task.fn(ctx, **job.args))
