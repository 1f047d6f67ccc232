"""The :class:`Worker`: builds a worker's parts, runs them, stops them. Nothing else: each
part owns its concern (see ``pgq._worker``)."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, Unpack

import anyio
import anyio.abc

from pgq._core import metrics as _metrics
from pgq._core.gc import untuned_note
from pgq._core.names import check_queue_name
from pgq._db import inspect
from pgq._db import producers as store_producers
from pgq._db.connections import (
    DATABASE_ERRORS,
    Pool,
    Target,
)
from pgq._db.producers import ProducerRow
from pgq._worker import assembly
from pgq._worker import health as health_server
from pgq._worker.assembly import Identity, Parts, Pools, open_pools
from pgq._worker.attempt import SHUTDOWN
from pgq._worker.liveness import health_verdict
from pgq._worker.observe import observers
from pgq._worker.outcome import Outcome
from pgq._worker.outcomes import Completer
from pgq._worker.producer import Producer
from pgq._worker.recovery import CHECK_ERRORS, Strays
from pgq._worker.run_once import RunOnce
from pgq._worker.snapshot import worker_stats
from pgq._worker.stoppable import Stoppable
from pgq.app import App
from pgq.errors import ConfigError
from pgq.settings import MAX_SETTING, WorkerOverrides, WorkerSettings

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = logging.getLogger("pgq.worker")

#: How long a stopping worker asks what became of rescues whose commit's reply was lost,
#: and how often.
SETTLE_S = 5.0
SETTLE_AGAIN_S = 0.2
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
        self._settling: anyio.CancelScope | None = None
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
            if self._settling is not None:
                self._settling.cancel()
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
                parts = self._parts = assembly.build(self._identity(), pools, self._counted)
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
                for loop in self._rescuing:  # see _settle
                    await loop.stop()
                if not parts.completer.pending:  # else the database may be down: no wait
                    await self._sweep(parts.strays)
                await self._settle(parts)
                await parts.reports.flush()  # at most FLUSH_S, whatever a hook does
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
        # Stopped before the rest, at the stop: see _settle.
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
            if strays.unsure > unsure:  # its commit was sent: _settle asks what became of it
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

    async def _settle(self, parts: Parts) -> None:
        # A rescue, takeover or hand-back whose commit's reply was lost is reported if it
        # landed, before the last rescue reports go out: after the stop, nothing would ask.
        # The leader's duties, the successor's watch and the checks for strays have ended
        # (before the stop's sweep), so a round or check cut short has recorded what it left
        # unknown; a commit still in progress is asked about again until SETTLE_S has passed.
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
            with anyio.move_on_after(SETTLE_S) as self._settling:
                while any(party.unsure for party, _ in parties):
                    for party, what in parties:
                        try:
                            await party.settle()
                        except DATABASE_ERRORS as exc:
                            errors[what] = str(exc) or type(exc).__name__
                    await anyio.sleep(SETTLE_AGAIN_S)
        for party, what in parties:
            if party.unsure:
                log.warning(
                    "%d job(s) %s by a commit whose reply was lost could not be settled "
                    "(%s): those that landed are not reported",
                    party.unsure,
                    what,
                    self._unsettled(parts, errors.get(what)),
                )

    def _unsettled(self, parts: Parts, error: str | None) -> str:
        """Why the stop could not settle a rescue whose commit's reply was lost."""
        if self._stop_now:
            return "stopping at once"
        if parts.completer.pending:
            return "the database did not take the last outcomes"
        return error or f"still in progress, or no answer, after {SETTLE_S:g} s"

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
