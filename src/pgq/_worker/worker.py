"""The :class:`Worker`: builds a worker's parts, runs them, stops them; each part owns its
concern (see ``pgq._worker``). Below the Worker, in the order it uses them: its one run
(:class:`RunOnce`), how it is put together (its pools, :func:`build` of its parts), what it
adds to the App's hooks (:func:`observers`), its snapshot for ``stats()``, and the loops it
stops before the rest (:class:`Stoppable`)."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar, Unpack

import anyio
import anyio.abc

from pgq._core import metrics as _metrics
from pgq._core.gc import untuned_note
from pgq._core.hooks import EVENTS, EventName, Hook, Hooks, Middleware
from pgq._core.joblog import JobLog
from pgq._core.names import check_queue_name
from pgq._db import inspect
from pgq._db import producers as store_producers
from pgq._db.connections import (
    CLAIM_SESSION_SETTINGS,
    DATABASE_ERRORS,
    WORKER_SESSION_SETTINGS,
    Pool,
    Target,
    connect_budget_s,
    create_pool,
)
from pgq._db.producers import ProducerRow
from pgq._db.revision import check_schema
from pgq._worker import health as health_server
from pgq._worker.attempt import SHUTDOWN, Outcome
from pgq._worker.control import Control
from pgq._worker.leader.elector import Elector
from pgq._worker.leader.periodic import Periodic
from pgq._worker.leader.rescuer import Rescuer
from pgq._worker.leader.retention import Retention
from pgq._worker.leader.services import (
    LeaderService,
    LeaderServices,
    Promoter,
    Reaper,
    Statistics,
    Throughput,
    UnrunnableReport,
)
from pgq._worker.liveness import Heartbeater, health_verdict
from pgq._worker.outcomes import LOCK_WAITERS, WRITERS, Completer
from pgq._worker.producer import Producer
from pgq._worker.recovery import CHECK_ERRORS, RescueReports, Strays, Successor
from pgq.app import App
from pgq.errors import ConfigError
from pgq.settings import MAX_SETTING, WorkerOverrides, WorkerSettings

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry


log = logging.getLogger("pgq.worker")

#: How long a stopping worker asks what became of rescues whose commit's reply was lost,
#: and how often.
UNSURE_S = 5.0
UNSURE_AGAIN_S = 0.2
#: How long a stopping worker's sweep for strays may take.
SWEEP_S = 5.0


def default_worker_name() -> str:
    """``host:pid``; override with ``name=`` (e.g. the Kubernetes pod name)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def resolve_queues(
    app: App, queues: Mapping[str, int] | Sequence[str] | None, concurrency: int
) -> dict[str, int]:
    """Queue name -> concurrency, checked: by default every queue the App's tasks use. A
    worker runs every task of the App on each queue it works, so a queue no task is declared
    on is served (jobs enqueued there with ``queue=``), with a warning."""
    declared = app.queues()
    if not declared:
        raise ConfigError("the App registers no task: decorate functions with @app.task")
    if isinstance(queues, str):
        queues = [queues]
    if queues is None:
        resolved = dict.fromkeys(declared, concurrency)
    elif isinstance(queues, Mapping):
        resolved = dict(queues)
    else:
        resolved = dict.fromkeys(queues, concurrency)
    if not resolved:
        raise ConfigError("a worker needs at least one queue")
    for queue, n in resolved.items():
        check_queue_name(queue)
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SETTING:
            raise ConfigError(
                f"queue {queue!r}: concurrency must be a whole number from 1 to "
                f"{MAX_SETTING:g}, got {n!r}"
            )
    for queue in resolved:
        if queue not in declared:
            log.warning(
                "queue %r: no task of this App is declared on it (its tasks' queues: %s); "
                "the worker runs the App's tasks enqueued on it with queue=%r, and waits on "
                "an empty queue if that name is a typo",
                queue, ", ".join(declared), queue,
            )  # fmt: skip
    return resolved


class Worker:
    """Runs the jobs of an :class:`~pgq.App`.

    ``queues`` maps queue names to their concurrency, or lists names (each gets
    ``concurrency``); by default every queue the App's tasks use. ``settings`` is a
    :class:`~pgq.WorkerSettings`; every other keyword is one of its fields and overrides it
    (typed as the field is: :class:`pgq.settings.WorkerOverrides`), and a setting given
    neither way falls back to its ``PGQ_*`` variable, then its default.

    ``health_port`` serves ``GET /healthz`` on ``health_host`` (loopback by default) for
    liveness probes; ``name`` defaults to ``PGQ_WORKER_NAME``, else ``host:pid``. A name
    given either way is taken as stable: a worker restarted under it takes over its previous
    run's running jobs once that run's heartbeat is past its fencing bound, instead of
    waiting for the leader's ``stale_after`` (see docs/liveness.md).

    Embedded: ``async with pgq.Worker(app, dsn) as worker:`` runs it in the background
    until the block ends (then stops gracefully). Standalone: ``await worker.run()``.
    A Worker runs once: a second or concurrent run raises :class:`~pgq.ConfigError`.
    """

    def __init__(
        self,
        app: App,
        dsn: str | None = None,
        *,
        settings: WorkerSettings | None = None,
        queues: Mapping[str, int] | Sequence[str] | None = None,
        name: str | None = None,
        health_port: int | None = None,
        health_host: str = "127.0.0.1",
        metrics_registry: CollectorRegistry | None = None,
        pooler: str | None = None,
        listen_dsn: str | None = None,
        **overrides: Unpack[WorkerOverrides],
    ) -> None:
        self.app = app
        self.settings = WorkerSettings.resolve(overrides, base=settings)
        given_name = name or os.environ.get("PGQ_WORKER_NAME")
        self.name = given_name or default_worker_name()
        self._stable_name = bool(given_name)
        self.id = uuid.uuid4()
        self._target = Target.resolve(dsn, pooler, listen_dsn)
        self._dsn = self._target.dsn
        self._queues = resolve_queues(app, queues, self.settings.concurrency)
        self._health_port = health_port
        self._health_host = health_host
        self._stop_requested = anyio.Event()
        self._stop_now = False
        self._run = RunOnce(self.name)
        self._tg: anyio.abc.TaskGroup | None = None
        self._parts: Parts | None = None
        self._make_due: Callable[[Producer], Awaitable[int]] | None = None
        self._by_queue: dict[str, Producer] = {}
        self._rescuing: list[Stoppable] = []
        self._asking_unsure: anyio.CancelScope | None = None
        self._started_at = 0.0
        #: Set once the worker runs (its producers registered, claiming).
        self.started = anyio.Event()
        #: The port /healthz is served on once started (useful with ``health_port=0``).
        self.health_port: int | None = None
        self._observers = observers(
            app.hooks, self.name, self.settings, self.stats, metrics_registry
        )
        #: The Prometheus metrics (None without the metrics extra, or with metrics off).
        self.metrics = self._observers.metrics
        self._pool: Pool | None = None

    # ------------------------------------------------------------------ lifecycle

    def stop(self, *, now: bool = False) -> None:
        """Ask the worker to stop: claim nothing more, let running jobs finish within
        ``shutdown_timeout`` (``now=True``: cancel them at once); the rest are made
        ``available`` again, their attempt not counted."""
        if now:
            self._stop_now = True
            for producer in self._parts.producers if self._parts else ():
                producer.cancel_running(SHUTDOWN)
            if self._parts:
                self._parts.reports.cut()
            if self._asking_unsure is not None:
                self._asking_unsure.cancel()
        self._run.stop()  # a start still connecting ends at once
        self._stop_requested.set()

    async def run(self, *, burst: bool = False) -> None:
        """Run until :meth:`stop` (or, with ``burst=True``, until no runnable job is left).
        A stop that comes while it still connects ends it at once."""
        pools = await self._open()
        if pools is not None:
            await self._main(burst, pools)

    async def _run_traveling(self, make_due: Callable[[Producer], Awaitable[int]]) -> None:
        """Burst mode that makes scheduled jobs due instead of stopping (pgq.testing)."""
        self._make_due = make_due
        pools = await self._open()
        if pools is not None:
            await self._main(True, pools)

    @property
    def queues(self) -> dict[str, int]:
        """The queues this worker runs, with their concurrency."""
        return dict(self._queues)

    async def __aenter__(self) -> Self:
        pool = await self._open()
        if pool is None:  # stopped while it connected: the block runs without it
            return self
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        try:
            await self._tg.start(self._main, False, pool)
        except BaseException as exc:
            try:
                await self._tg.__aexit__(type(exc), exc, exc.__traceback__)
            except BaseExceptionGroup as group:
                # A failure while starting is one error: raise it as itself.
                if len(group.exceptions) == 1:
                    raise group.exceptions[0] from None
                raise
            raise
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        self.stop()
        if self._tg is None:  # stopped before it started
            return None
        return await self._tg.__aexit__(et, e, tb)

    async def _open(self) -> Pools | None:
        """The worker's pools; None when :meth:`stop` came first (before or while they
        opened)."""
        pools = await self._run.open(
            functools.partial(open_pools, self._target, self.name, len(self._queues))
        )
        if pools is None:
            log.info("worker %s stopped before it started", self.name)
        return pools

    def _identity(self) -> Identity:
        return Identity(
            self.app, self.settings, self.id, self.name, self._stable_name, self._target,
            self._queues, self._observers,
        )  # fmt: skip

    async def _main(
        self,
        burst: bool,
        pools: Pools,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        pool = self._pool = pools.main
        try:
            async with self.app.running():  # the App's lifespan, around every job it runs
                parts = self._parts = build(self._identity(), pools, self._counted)
                self._by_queue = {p.queue: p for p in parts.producers}
                await self._serve(pool, parts, burst, task_status)
        finally:
            self._pool = None
            self._run.ended()
            await pools.close()

    async def _serve(
        self, pool: Pool, parts: Parts, burst: bool, task_status: anyio.abc.TaskStatus[None]
    ) -> None:
        self._started_at = anyio.current_time()
        rows = [ProducerRow(p.id, p.queue, p.concurrency) for p in parts.producers]
        await store_producers.register(pool, self.id, self.name, rows, self._identity().bounds())
        try:
            async with anyio.create_task_group() as tg:
                await self._start_services(tg, parts)
                async with anyio.create_task_group() as producers_tg:
                    for producer in parts.producers:
                        await producers_tg.start(producer.run)
                    log.info(
                        "worker %s started: %s%s, on %s",
                        self.name,
                        ", ".join(f"{q}[{n}]" for q, n in self._queues.items()),
                        " (leader)" if parts.elector.is_leader else "",
                        _event_loop_name(),
                    )
                    note = untuned_note(sum(self._queues.values()))
                    if note is not None:
                        log.info("worker %s: %s", self.name, note)
                    self.started.set()
                    task_status.started()
                    if burst:
                        tg.start_soon(
                            parts.control.watch_burst,
                            parts.completer,
                            self.stop,
                            self._due_maker(parts.producers),
                        )
                    await self._stop_requested.wait()
                    await self._drain(parts.producers)
                await self._flush(parts.completer)
                for loop in self._rescuing:  # see _ask_unsure
                    await loop.stop()
                if not parts.completer.pending:  # else the database may be down: no wait
                    await self._sweep(parts.strays)
                await self._ask_unsure(parts)
                await parts.reports.flush()  # at most REPORTS_FLUSH_S, whatever a hook does
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                await parts.elector.resign()
                try:
                    await store_producers.delete(
                        pool, [i for p in parts.producers for i in p.ids()]
                    )
                except DATABASE_ERRORS as exc:
                    log.warning("could not delete this worker's producer rows: %s", exc)
            log.info("worker %s stopped", self.name)

    def _due_maker(self, producers: list[Producer]) -> Callable[[], Awaitable[int]] | None:
        make_due = self._make_due
        if make_due is None:
            return None

        async def all_producers() -> int:
            return sum([await make_due(p) for p in producers])

        return all_producers

    async def _start_services(self, tg: anyio.abc.TaskGroup, parts: Parts) -> None:
        if not self.settings.poll_only and self._target.can_listen:
            await tg.start(parts.control.notifier(self._target.listen_target(), self.name).run)
        tg.start_soon(parts.completer.run)
        tg.start_soon(parts.heartbeater.run)
        await parts.elector.attempt()
        tg.start_soon(functools.partial(parts.elector.run, attempted=True))
        # Stopped before the rest, at the stop: see _ask_unsure.
        self._rescuing = [Stoppable(parts.leader.run), Stoppable(parts.strays.run)]
        if parts.successor is not None:
            self._rescuing.append(Stoppable(parts.successor.run))
        for loop in self._rescuing:
            tg.start_soon(loop.run)
        tg.start_soon(parts.control.poll_cancels)
        tg.start_soon(parts.reports.run)
        tg.start_soon(self._observers.joblog.run)
        if self._health_port is not None:
            self.health_port = await tg.start(
                functools.partial(
                    health_server.serve,
                    self.health,
                    host=self._health_host,
                    port=self._health_port,
                    metrics=self.render_metrics if self.metrics else None,
                )
            )

    async def _drain(self, producers: list[Producer]) -> None:
        for producer in producers:
            producer.stop_fetching()
        if not self._stop_now:
            with anyio.move_on_after(self.settings.shutdown_timeout):
                for producer in producers:
                    await producer.wait_empty()
        running = sum(len(p.running) for p in producers)
        if running:
            log.warning(
                "cancelling %d jobs still running at shutdown; they are handed back available, "
                "those attempts not counted",
                running,
            )
            for producer in producers:
                producer.cancel_running(SHUTDOWN)

    @staticmethod
    async def _flush(completer: Completer) -> None:
        # Every job has ended; make the outcomes durable before letting go.
        with anyio.move_on_after(10) as flush:
            await completer.wait_idle()
        if flush.cancelled_caught:
            log.error(
                "%d outcomes could not be written; the rescuer will retry those jobs",
                completer.pending,
            )

    @staticmethod
    async def _sweep(strays: Strays) -> None:
        # The producers have ended: what still runs under their ids unknown to this worker
        # came from a claim whose reply was lost. Handed back now, not left to a rescue.
        unsure = strays.unsure
        try:
            with anyio.fail_after(SWEEP_S):
                await strays.sweep()
        except CHECK_ERRORS as exc:
            reason = str(exc) or type(exc).__name__
            if strays.unsure > unsure:  # its commit was sent: _ask_unsure asks what became of it
                log.warning(
                    "handing back jobs of claims whose reply was lost, the commit's outcome "
                    "is unknown (%s); asking before stopping",
                    reason,
                )
                return
            log.warning(
                "could not hand back jobs of claims whose reply was lost (%s); the leader "
                "will rescue them",
                reason,
            )

    async def _ask_unsure(self, parts: Parts) -> None:
        # A rescue, takeover or hand-back whose commit's reply was lost is reported if it
        # landed, before the last rescue reports go out: after the stop, nothing would ask.
        # The leader's duties, the successor's watch and the checks for strays have ended
        # (before the stop's sweep), so a round or check cut short has recorded what it left
        # unknown; a commit still in progress is asked about again until UNSURE_S has passed.
        parties = [
            (party, what)
            for party, what in (
                (parts.rescuer, "rescued by the leader"),
                (parts.successor, "taken over from the previous run"),
                (parts.strays, "handed back from claims whose reply was lost"),
            )
            if party is not None and party.unsure
        ]
        errors: dict[str, str] = {}
        if parties and not self._stop_now and not parts.completer.pending:
            with anyio.move_on_after(UNSURE_S) as self._asking_unsure:
                while any(party.unsure for party, _ in parties):
                    for party, what in parties:
                        try:
                            await party.ask_unsure()
                        except DATABASE_ERRORS as exc:
                            errors[what] = str(exc) or type(exc).__name__
                    await anyio.sleep(UNSURE_AGAIN_S)
        for party, what in parties:
            if party.unsure:
                log.warning(
                    "%d job(s) %s by a commit whose reply was lost could not be settled "
                    "(%s): those that landed are not reported",
                    party.unsure,
                    what,
                    self._why_unsure(parts, errors.get(what)),
                )

    def _why_unsure(self, parts: Parts, error: str | None) -> str:
        """Why the stop could not tell what became of a rescue whose commit's reply was lost."""
        if self._stop_now:
            return "stopping at once"
        if parts.completer.pending:
            return "the database did not take the last outcomes"
        return error or f"still in progress, or no answer, after {UNSURE_S:g} s"

    def _counted(self, written: list[Outcome], rejected: list[Outcome]) -> None:
        by_queue = self._by_queue
        if len(by_queue) == 1:  # one producer: every outcome is its own
            (producer,) = by_queue.values()
            producer.counted(written, accepted=True)
            producer.counted(rejected, accepted=False)
            return
        for outcomes, accepted in ((written, True), (rejected, False)):
            mine: dict[str, list[Outcome]] = {}
            for o in outcomes:
                mine.setdefault(o.queue, []).append(o)
            for queue, theirs in mine.items():
                if queue in by_queue:
                    by_queue[queue].counted(theirs, accepted)

    # ------------------------------------------------------------------ stats

    def stats(self) -> dict[str, Any]:
        """A snapshot for operators: per producer its queue, health (``healthy``,
        ``consecutive_failures``, ``last_heartbeat_ok_at`` as a Unix time, None before the
        first) and counters (``running``, claimed jobs waiting for a slot included, as the
        database counts them; ``executing``, those in a slot now; ``claimed``, ``completed``, ``failed``, ``rejected_outcomes``, ``fetches``), and
        ``claim_ahead``, how many jobs it claims ahead of free slots now; the worker's leader flag and terms, the rescues,
        reaps, retention deletes and periodic jobs it did, each leader service's ``runs``/``failures``/``last_error``, heartbeats and
        re-registrations, jobs of claims whose reply was lost handed back
        (``strays_handed_back``), ``job_rescued`` events not yet delivered to their hooks
        (``rescue_events_waiting``), cancels obeyed, LISTEN reconnections, and the outcomes not yet
        durable (``outcomes_pending``), of those refused in every form (``outcomes_held``),
        written in a fallback form (``outcomes_salvaged``), and waiting for their rows, locked
        by another transaction (``outcomes_waiting_on_locks``); ``resource_failures``,
        attempts that failed for want of memory, file descriptors or disk (per producer: by
        task); and, on the leader, the jobs no live worker of their queue serves
        (``unrunnable``: queue, task, count and ``oldest_s``, as its last look found them)."""
        return worker_stats(self.id, self.name, self._parts, self._observers.joblog.suppressed)

    async def render_metrics(self) -> bytes:
        """This worker's metrics in the Prometheus text format, with the queue gauges when
        ``queue_metrics`` is set (read from the database now)."""
        if self.metrics is None:
            _metrics.require()
            raise ConfigError("metrics are off for this worker (metrics=False)")
        body = self.metrics.render()
        if self.settings.queue_metrics and self._pool is not None:
            gauges = await inspect.queue_gauges(self._pool)
            body += _metrics.render_families(_metrics.queue_families(*gauges))
        return body

    def health(self) -> tuple[bool, dict[str, Any]]:
        """Whether this worker is alive for a liveness probe, and why (``/healthz``)."""
        p = self._parts
        healths = [(pr.queue, pr.health) for pr in p.producers] if p else []
        ok, verdict = health_verdict(
            healths, self.settings, anyio.current_time() - self._started_at
        )
        stats = self.stats()
        body = {
            "worker_name": self.name,
            "leader": stats["leader"],
            "producers": stats["producers"],
        }
        return ok, {**body, **verdict}


def _event_loop_name() -> str:
    """ "uvloop" or "asyncio": the event loop this worker runs on."""
    loop = asyncio.get_running_loop()
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


# --------------------------------------------------------------------------- one run
# A Worker's one run: a second or concurrent run is refused before it connects, and a stop
# that comes while the run still connects ends it at once (nothing runs yet to wait for).

T = TypeVar("T")


class RunOnce:
    """The run of one worker (``name``, for the error): :meth:`open` begins it,
    :meth:`ended` ends it, :meth:`stop` cancels an opening under way (or to come)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._state: str | None = None  # "running", then "ran"
        self._opening: anyio.CancelScope | None = None
        self._stopped = False

    async def open(self, opener: Callable[[], Awaitable[T]]) -> T | None:
        """What ``opener`` opens; None when :meth:`stop` came first (before or during). A
        failed opening leaves the worker as it was: it may run later."""
        # Checked and set before the first await: of two concurrent runs, one opens.
        if self._state is not None:
            raise ConfigError(
                f"worker {self._name}: this Worker "
                f"{'is running' if self._state == 'running' else 'has run'} already; "
                "a Worker runs once: make a new pgq.Worker to run again"
            )
        self._state = "running"
        opened = None
        try:
            with anyio.CancelScope() as self._opening:
                if self._stopped:
                    self._opening.cancel()
                opened = await opener()
        except BaseException:
            self._state = None  # nothing ran: a start that could not connect may retry
            raise
        finally:
            self._opening = None
        if opened is None:
            self._state = "ran"
        return opened

    def stop(self) -> None:
        """A stop: an opening under way is cancelled, one to come never begins."""
        self._stopped = True
        if self._opening is not None:
            self._opening.cancel()

    def ended(self) -> None:
        """The run is over: any other is refused."""
        self._state = "ran"


# --------------------------------------------------------------------------- assembly
# How a worker is put together: its connections (open_pools) and its parts, each built once
# from the worker's settings and wired to the others (build).


@dataclass(frozen=True, slots=True)
class Pools:
    """The worker's connections: ``main`` plans every statement for its parameters
    (outcomes, liveness, the leader's services); ``claims`` keeps Postgres's cached plans,
    for the claims (docs/architecture.md). The same pool behind a transaction pooler."""

    main: Pool
    claims: Pool

    async def close(self) -> None:
        """Close both (each cut off after 5 s)."""
        for pool in (self.main,) if self.claims is self.main else (self.claims, self.main):
            with anyio.CancelScope(shield=True), anyio.move_on_after(5) as scope:
                await pool.close()
            if scope.cancelled_caught:
                pool.terminate()


async def open_pools(target: Target, worker_name: str, queues: int) -> Pools:
    """Open the worker's pools for ``queues`` producers, once the schema is checked."""
    application_name = f"pgq worker {worker_name}"
    pool = await create_pool(
        target.dsn,
        min_size=1,
        # A claim per queue (behind a transaction pooler, where this pool serves them), the
        # batches of outcomes being written, a leader service or two, and the outcomes that
        # wait alone for rows locked elsewhere.
        max_size=queues + 2 + WRITERS + LOCK_WAITERS,
        **target.options(application_name, WORKER_SESSION_SETTINGS),
    )
    try:
        await check_schema(pool)
        if target.pooled:  # no session settings there: one pool serves both
            return Pools(pool, pool)
        claims = await create_pool(
            target.dsn,
            min_size=1,
            max_size=queues,  # one claim in flight per producer
            **target.options(application_name, CLAIM_SESSION_SETTINGS),
        )
    except BaseException:
        # Shielded: a stop while the worker opens cancels it (Worker.stop).
        with anyio.CancelScope(shield=True), anyio.move_on_after(5) as scope:
            await pool.close()
        if scope.cancelled_caught:
            pool.terminate()
        raise
    return Pools(pool, claims)


@dataclass
class Parts:
    """A running worker's parts."""

    producers: list[Producer]
    completer: Completer
    heartbeater: Heartbeater
    elector: Elector
    leader: LeaderServices
    rescuer: Rescuer
    reaper: Reaper
    retention: Retention
    periodic: Periodic | None
    control: Control
    successor: Successor | None
    strays: Strays
    reports: RescueReports
    unrunnable: UnrunnableReport


@dataclass(frozen=True, slots=True)
class Identity:
    """What the parts need to know of the worker they make up."""

    app: App
    settings: WorkerSettings
    worker_id: uuid.UUID
    name: str
    #: Whether the name was given (a stable name: a restart takes its runs over).
    stable_name: bool
    target: Target
    queues: Mapping[str, int]
    observers: Observers

    def bounds(self) -> store_producers.Bounds:
        """What this worker's producers declare: peers judge them by these."""
        s = self.settings
        return store_producers.Bounds(
            s.fencing_bound, s.stale_after, s.rescue_grace, tuple(sorted(t.name for t in self.app))
        )


def build(
    me: Identity, pools: Pools, counted: Callable[[list[Outcome], list[Outcome]], None]
) -> Parts:
    """Every part of a worker, wired together; ``counted`` hears of each written batch."""
    s = me.settings
    pool = pools.main
    limiter = anyio.CapacityLimiter(s.max_threads)
    completer = Completer(pool, counted, async_commit=s.async_commit)
    reports = RescueReports(me.observers.app_hooks, me.observers.own_rescued)
    producers = [
        _producer(me, pools, queue, n, completer, limiter) for queue, n in me.queues.items()
    ]
    heartbeater = Heartbeater(
        me.target, producers, s, worker_id=me.worker_id, worker_name=me.name,
        bounds=me.bounds(),
    )  # fmt: skip
    elector = Elector(
        pool, worker_id=me.worker_id, worker_name=me.name, ttl_s=s.leader_ttl,
        connect_s=connect_budget_s(me.target.dsn),
    )  # fmt: skip
    rescuer = Rescuer(
        pool,
        s,
        me.worker_id,
        sick_queues=lambda: [p.queue for p in producers if not p.health.healthy],
        after_rescue=lambda: leader.wake(Promoter.name),
        reports=reports,
    )
    reaper = Reaper(pool, s)
    retention = Retention(pool, s)
    periodic = None
    if me.app.schedules:
        periodic = Periodic(
            pool,
            me.app,
            me.worker_id,
            interval_s=s.schedule_interval,
            term=lambda: elector.terms,
            worker_name=me.name,
        )
    services: list[LeaderService] = [Promoter(pool, s.schedule_interval)]
    services += [periodic] if periodic else []
    unrunnable = UnrunnableReport(pool, s.stale_after)
    services += [rescuer, reaper, retention, Throughput(pool), Statistics(pool), unrunnable]
    leader = LeaderServices(elector, services, everywhere=frozenset({Promoter.name}))
    control = Control(
        pool,
        producers,
        s,
        wake_leader=elector.wake,
        stable_name=me.name if me.stable_name else None,
    )
    successor = _successor(me, pool, producers, leader, reports) if me.stable_name else None
    strays = Strays(
        pool, producers, completer.pending_attempts, s.stale_after, reports,
        async_commit=s.async_commit,
    )  # fmt: skip
    return Parts(
        producers, completer, heartbeater, elector, leader, rescuer, reaper, retention,
        periodic, control, successor, strays, reports, unrunnable,
    )  # fmt: skip


def _successor(
    me: Identity,
    pool: Pool,
    producers: list[Producer],
    leader: LeaderServices,
    reports: RescueReports,
) -> Successor:
    """The watch of a stable name's previous run, whose jobs it takes over."""
    return Successor(
        pool,
        me.name,
        lambda: [i for p in producers for i in p.ids()],
        margin_s=me.settings.heartbeat_timeout,
        after_rescue=lambda: leader.wake(Promoter.name),
        reports=reports,
    )


def _producer(
    me: Identity,
    pools: Pools,
    queue: str,
    concurrency: int,
    completer: Completer,
    limiter: anyio.CapacityLimiter,
) -> Producer:
    s = me.settings
    return Producer(
        queue=queue,
        concurrency=concurrency,
        # Every task of the App, whatever queue it is declared on: a job enqueued with
        # queue= on another queue runs where that queue is worked.
        tasks={t.name: t for t in me.app},
        pool=pools.main,
        claim_pool=pools.claims,
        outcomes=completer.add,
        hurry_outcomes=completer.hurry,
        limiter=limiter,
        poll_interval=s.poll_interval,
        fence_after_s=s.fencing_bound,
        claim_ahead=s.claim_ahead,
        async_commit=s.async_commit,
        hooks=me.observers.hooks,
        worker_name=me.name,
    )


# --------------------------------------------------------------------------- observers
# What a worker adds to an App's hooks so operators can see it work: the job log, the
# Prometheus metrics (when the extra is installed) and OpenTelemetry tracing (when asked).


@dataclass
class Observers:
    """The worker's hooks (the App's, with pgq's own joined), and the parts behind them."""

    hooks: Hooks
    joblog: JobLog
    metrics: _metrics.WorkerMetrics | None
    #: The App's own hooks, and pgq's own ``job_rescued`` handlers (synchronous, quick):
    #: rescues reach them apart (``pgq._worker.recovery``).
    app_hooks: Hooks
    own_rescued: list[Hook]


def observers(
    app_hooks: Hooks,
    worker_name: str,
    settings: WorkerSettings,
    stats: Callable[[], dict[str, Any]],
    registry: CollectorRegistry | None,
) -> Observers:
    """Build the job log, metrics and tracing a worker's settings ask for."""
    joblog = JobLog(worker_name, log_jobs=settings.log_jobs)
    metrics = None
    if settings.metrics and _metrics.available():
        metrics = _metrics.WorkerMetrics(stats, registry)
    elif registry is not None:
        _metrics.require()
    middleware: list[Middleware] = []
    if settings.tracing:
        from pgq._core.tracing import attempt_middleware

        middleware.append(attempt_middleware(worker_name))
    handlers: dict[EventName, list[Hook]] = {name: [] for name in EVENTS}
    for part in (metrics.hooks() if metrics else {}, joblog.hooks()):
        for name, hooks in part.items():
            handlers[name] += hooks
    joined = app_hooks.joined(handlers, middleware, joblog.failure_hooks())
    return Observers(joined, joblog, metrics, app_hooks, handlers["job_rescued"])


# --------------------------------------------------------------------------- the snapshot


def worker_stats(
    worker_id: uuid.UUID, name: str, p: Parts | None, job_log_suppressed: int
) -> dict[str, Any]:
    """The snapshot :meth:`pgq.Worker.stats` describes (``p``: None before the worker
    runs)."""
    return {
        "worker_id": str(worker_id),
        "worker_name": name,
        "time": time.time(),
        "leader": p is not None and p.elector.is_leader,
        "leader_terms": p.elector.terms if p else 0,
        "rescued": p.rescuer.rescued if p else 0,
        "reaped": p.reaper.reaped if p else 0,
        "retention_deleted": p.retention.deleted if p else 0,
        "periodic_enqueued": p.periodic.enqueued if p and p.periodic else 0,
        "leader_services": ({n: st.snapshot() for n, st in p.leader.status.items()} if p else {}),
        "heartbeats": p.heartbeater.beats if p else 0,
        "heartbeat_failures": p.heartbeater.failures if p else 0,
        "job_log_suppressed": job_log_suppressed,
        "predecessor_rescued": p.successor.rescued if p and p.successor else 0,
        "duplicate_names": len(p.successor.duplicates) if p and p.successor else 0,
        "reregistrations": p.heartbeater.reregistrations if p else 0,
        "strays_handed_back": p.strays.handed_back if p else 0,
        "rescue_events_waiting": p.reports.waiting if p else 0,
        "cancelled_on_request": p.control.cancelled if p else 0,
        "listen_reconnects": p.control.listen_reconnects if p else 0,
        "outcomes_pending": p.completer.pending if p else 0,
        "outcomes_held": p.completer.held if p else 0,
        "outcomes_salvaged": p.completer.salvaged if p else 0,
        "outcomes_waiting_on_locks": p.completer.waiting_on_locks if p else 0,
        "resource_failures": sum(pr.resources.total for pr in p.producers) if p else 0,
        "unrunnable": (
            [dataclasses.asdict(u) for u in p.unrunnable.found] if p and p.elector.is_leader else []
        ),
        "producers": [producer.stats() for producer in p.producers] if p else [],
    }


# --------------------------------------------------------------------------- stoppable loops


class Stoppable:
    """Runs ``loop`` until it returns or is cancelled; :meth:`stop` cancels it alone and
    waits until it has unwound (what its cleanup records is recorded by then)."""

    def __init__(self, loop: Callable[[], Awaitable[None]]) -> None:
        self._loop = loop
        self._scope = anyio.CancelScope()
        self._ended = anyio.Event()
        self._started = False

    async def run(self) -> None:
        """Run the loop (start this in a task group)."""
        self._started = True
        try:
            if not self._scope.cancel_called:  # stopped before it started: it never runs
                with self._scope:
                    await self._loop()
        finally:
            self._ended.set()

    async def stop(self) -> None:
        """Cancel the loop and wait until it has ended, however long its own cleanup takes
        (at once if it has not started: it then never runs)."""
        self._scope.cancel()
        if self._started:
            await self._ended.wait()
