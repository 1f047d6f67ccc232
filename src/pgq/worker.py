"""The :class:`Worker`: owns the producers, the notifier, the completer and maintenance, and
their lifecycle (start, graceful stop, burst)."""

from __future__ import annotations

import functools
import logging
import os
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Self

import anyio
import anyio.abc

from pgq import health, sql
from pgq.app import App, check_queue_name
from pgq.completer import Completer
from pgq.db import DATABASE_ERRORS, WORKER_SESSION_SETTINGS, Pool, check_schema, create_pool
from pgq.dsn import resolve_dsn
from pgq.errors import ConfigError
from pgq.executor import CANCEL, SHUTDOWN
from pgq.heartbeat import Heartbeater
from pgq.leader import Elector
from pgq.maintenance import (
    LeaderService,
    LeaderServices,
    Periodic,
    Promoter,
    Reaper,
    Rescuer,
    Retention,
)
from pgq.notifier import Notifier
from pgq.outcome import Outcome
from pgq.producer import Producer
from pgq.settings import WorkerSettings

log = logging.getLogger("pgq.worker")


def default_worker_name() -> str:
    """``host:pid``; override with ``name=`` (e.g. the Kubernetes pod name)."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Worker:
    """Runs the jobs of an :class:`~pgq.App`.

    ``queues`` maps queue names to their concurrency, or lists names (each gets
    ``concurrency``); by default every queue the App's tasks use. Every other keyword is a
    :class:`~pgq.settings.WorkerSettings` field and falls back to its ``PGQ_*`` variable.

    ``health_port`` serves ``GET /healthz`` on ``health_host`` (loopback by default) for
    liveness probes; ``name`` defaults to ``PGQ_WORKER_NAME``, else ``host:pid``.

    Embedded: ``async with pgq.Worker(app, dsn) as worker:`` runs it in the background
    until the block ends (then stops gracefully). Standalone: ``await worker.run()``.
    """

    def __init__(
        self,
        app: App,
        dsn: str | None = None,
        *,
        queues: Mapping[str, int] | Sequence[str] | None = None,
        name: str | None = None,
        health_port: int | None = None,
        health_host: str = "127.0.0.1",
        **settings: Any,
    ) -> None:
        self.app = app
        self.settings = WorkerSettings.resolve(settings)
        self.name = name or os.environ.get("PGQ_WORKER_NAME") or default_worker_name()
        self._dsn = resolve_dsn(dsn)
        self._queues = self._resolve_queues(queues)
        self._stop_requested = anyio.Event()
        self._stop_now = False
        self._tg: anyio.abc.TaskGroup | None = None
        self.id = uuid.uuid4()
        self.producers: list[Producer] = []
        self.started = anyio.Event()
        self.elector: Elector | None = None
        self.maintenance: LeaderServices | None = None
        self._rescuer: Rescuer | None = None
        self._completer: Completer | None = None
        self._reaper: Reaper | None = None
        self._health_port = health_port
        #: The port /healthz is served on once started (useful with ``health_port=0``).
        self.health_port: int | None = None
        self._health_host = health_host
        self._started_at = 0.0

    def _resolve_queues(self, queues: Mapping[str, int] | Sequence[str] | None) -> dict[str, int]:
        if isinstance(queues, str):
            queues = [queues]
        if queues is None:
            names = self.app.queues()
            if not names:
                raise ConfigError("the App registers no task: decorate functions with @app.task")
            resolved = dict.fromkeys(names, self.settings.concurrency)
        elif isinstance(queues, Mapping):
            resolved = dict(queues)
        else:
            resolved = dict.fromkeys(queues, self.settings.concurrency)
        if not resolved:
            raise ConfigError("a worker needs at least one queue")
        for queue, n in resolved.items():
            check_queue_name(queue)
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ConfigError(
                    f"queue {queue!r}: concurrency must be a whole number >= 1, got {n!r}"
                )
            if not any(t.queue == queue for t in self.app):
                raise ConfigError(
                    f"queue {queue!r} has no task in this App (its queues: "
                    f"{', '.join(self.app.queues()) or 'none'}); a worker only runs tasks it "
                    "registers"
                )
        return resolved

    # ------------------------------------------------------------------ lifecycle

    def stop(self, *, now: bool = False) -> None:
        """Ask the worker to stop: claim nothing more, let running jobs finish within
        ``shutdown_timeout`` (``now=True``: cancel them at once), record the rest retryable."""
        if now:
            self._stop_now = True
            for producer in self.producers:
                producer.cancel_running(SHUTDOWN)
        self._stop_requested.set()

    async def run(self, *, burst: bool = False) -> None:
        """Run until :meth:`stop` (or, with ``burst=True``, until no runnable job is left)."""
        await self._main(burst, await self._open())

    async def __aenter__(self) -> Self:
        pool = await self._open()
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
        assert self._tg is not None
        return await self._tg.__aexit__(et, e, tb)

    async def _open(self) -> Pool:
        pool = await create_pool(
            self._dsn,
            min_size=1,
            max_size=len(self._queues) + 3,
            server_settings={
                **WORKER_SESSION_SETTINGS,
                "application_name": f"pgq worker {self.name}"[:63],
            },
        )
        try:
            async with pool.acquire() as conn:
                await check_schema(conn)
        except BaseException:
            await pool.close()
            raise
        return pool

    async def _main(
        self,
        burst: bool,
        pool: Pool,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        try:
            await self._serve(pool, burst, task_status)
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(5) as scope:
                await pool.close()
            if scope.cancelled_caught:
                pool.terminate()

    async def _serve(
        self, pool: Pool, burst: bool, task_status: anyio.abc.TaskStatus[None]
    ) -> None:
        s = self.settings
        self._completer = completer = Completer(pool, self._report)
        limiter = anyio.CapacityLimiter(s.max_threads)
        self.producers = [
            Producer(
                queue=queue,
                concurrency=n,
                tasks={t.name: t for t in self.app if t.queue == queue},
                pool=pool,
                completer=completer,
                limiter=limiter,
                poll_interval=s.poll_interval,
                fence_after_s=s.fencing_bound,
                hooks=self.app.hooks,
            )
            for queue, n in self._queues.items()
        ]
        self._started_at = anyio.current_time()
        async with pool.acquire() as conn:
            await conn.executemany(
                sql.REGISTER_PRODUCER,
                [(p.id, self.id, self.name, p.queue, p.concurrency) for p in self.producers],
            )
        heartbeater = Heartbeater(
            self._dsn,
            self.producers,
            worker_id=self.id,
            worker_name=self.name,
            interval_s=s.heartbeat_interval,
            timeout_s=s.heartbeat_timeout,
            max_failures=s.max_heartbeat_failures,
        )
        self.elector = elector = Elector(
            pool, worker_id=self.id, worker_name=self.name, ttl_s=s.leader_ttl
        )
        self.maintenance = maintenance = self._leader_services(pool, elector)
        try:
            async with anyio.create_task_group() as tg:
                if not s.poll_only:
                    notifier = Notifier(
                        self._dsn,
                        {
                            sql.CHANNEL_JOBS: self._on_jobs,
                            sql.CHANNEL_LEADER: lambda _payload: elector.wake(),
                            sql.CHANNEL_CONTROL: self._on_control,
                        },
                        on_connect=self._wake_all,
                        connect_kwargs={
                            "server_settings": {"application_name": f"pgq listen {self.name}"[:63]}
                        },
                    )
                    await tg.start(notifier.run)
                tg.start_soon(completer.run)
                tg.start_soon(heartbeater.run)
                await elector.attempt()
                tg.start_soon(elector.run)
                tg.start_soon(maintenance.run)
                tg.start_soon(self._watch_cancels, pool)
                if self._health_port is not None:
                    self.health_port = await tg.start(
                        functools.partial(
                            health.serve,
                            self.health,
                            host=self._health_host,
                            port=self._health_port,
                        )
                    )
                async with anyio.create_task_group() as producers_tg:
                    for producer in self.producers:
                        await producers_tg.start(producer.run)
                    log.info(
                        "worker %s started: %s%s",
                        self.name,
                        ", ".join(f"{q}[{n}]" for q, n in self._queues.items()),
                        " (leader)" if elector.is_leader else "",
                    )
                    self.started.set()
                    task_status.started()
                    if burst:
                        producers_tg.start_soon(self._watch_burst, pool, completer)
                    await self._stop_requested.wait()
                    await self._drain()
                # Every job has ended; make the outcomes durable before letting go.
                with anyio.move_on_after(10) as flush:
                    await completer.wait_idle()
                if flush.cancelled_caught:
                    log.error(
                        "%d outcomes could not be written; the rescuer will retry those jobs",
                        completer.pending,
                    )
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                await elector.resign()
                try:
                    async with pool.acquire() as conn:
                        await conn.execute(sql.DELETE_PRODUCERS, [p.id for p in self.producers])
                except DATABASE_ERRORS as exc:
                    log.warning("could not delete this worker's producer rows: %s", exc)
            log.info("worker %s stopped", self.name)

    def _leader_services(self, pool: Pool, elector: Elector) -> LeaderServices:
        s = self.settings
        services: list[LeaderService] = [Promoter(pool, s.schedule_interval)]
        if self.app.schedules:
            services.append(
                Periodic(
                    pool,
                    self.app,
                    self.id,
                    interval_s=s.schedule_interval,
                    term=lambda: elector.terms,
                )
            )
        self._rescuer = Rescuer(
            pool,
            s,
            self.id,
            sick_queues=lambda: [p.queue for p in self.producers if not p.healthy],
            after_rescue=lambda: leader.wake(Promoter.name),
            hooks=self.app.hooks,
        )
        self._reaper = Reaper(pool, s)
        services += [self._rescuer, self._reaper, Retention(pool, s)]
        leader = LeaderServices(elector, services)
        return leader

    def _on_jobs(self, queue: str) -> None:
        for producer in self.producers:
            if queue in (producer.queue, "*"):
                producer.wake()

    def _on_control(self, message: str) -> None:
        kind, _, value = message.partition(":")
        if kind == "cancel" and value.isdigit():
            self._cancel_running({int(value)})

    def _cancel_running(self, job_ids: set[int]) -> None:
        for producer in self.producers:
            for job_id in job_ids & producer.running.keys():
                log.info("job %d: cancel requested; cancelling it", job_id)
                producer.running[job_id].cancel(CANCEL)

    async def _watch_cancels(self, pool: Pool) -> None:
        """The poll fallback for cancel requests (no LISTEN, or a lost notification)."""
        while True:
            await anyio.sleep(self.settings.poll_interval)
            running = [i for p in self.producers for i in p.running]
            if not running:
                continue
            try:
                async with pool.acquire() as conn:
                    rows = await conn.fetch(sql.CANCEL_REQUESTED, running)
            except DATABASE_ERRORS as exc:
                log.warning("cancel check failed: %s", exc)
                continue
            pending = {r[0] for r in rows}
            self._cancel_running(
                {
                    i
                    for p in self.producers
                    for i, e in p.running.items()
                    if i in pending and e.reason != CANCEL
                }
            )

    async def _drain(self) -> None:
        for producer in self.producers:
            producer.stop_fetching()
        if not self._stop_now:
            with anyio.move_on_after(self.settings.shutdown_timeout):
                for producer in self.producers:
                    await producer.wait_empty()
        running = sum(len(p.running) for p in self.producers)
        if running:
            log.warning(
                "cancelling %d jobs still running at shutdown; they will be retried", running
            )
            for producer in self.producers:
                producer.cancel_running(SHUTDOWN)

    async def _watch_burst(self, pool: Pool, completer: Completer) -> None:
        """Stop once nothing runs, nothing is being claimed or written, and the database
        holds no job these producers could run now, nor a job of their queues running under a
        producer that is gone or silent past the fencing bound (it will be rescued)."""
        orphans_said = False
        while not self._stop_requested.is_set():
            # Wait for the jobs to end and their outcomes to be written (events, so the
            # check below runs as soon as the last one is durable), then for any claim in
            # flight, which sets no event: look again shortly.
            for producer in self.producers:
                await producer.wait_empty()
            await completer.wait_idle()
            if any(p.running or p.fetching for p in self.producers) or completer.pending:
                await anyio.sleep(0.005)
                continue
            try:
                async with pool.acquire() as conn:
                    await conn.fetch(sql.PROMOTE_DUE, 1000)
                    left = [
                        await conn.fetchrow(
                            sql.RUNNABLE_LEFT,
                            p.queue,
                            list(p._tasks),
                            self.settings.fencing_bound,
                        )
                        for p in self.producers
                    ]
            except DATABASE_ERRORS as exc:
                log.warning("burst check failed: %s", exc)
                continue
            if any(r is not None and r["runnable"] for r in left):
                # Runnable jobs are left (another worker's to claim, or just promoted):
                # let the producers claim them, and look again in a while.
                for producer in self.producers:
                    producer.wake()
                await anyio.sleep(0.05)
            elif any(r is not None and r["orphaned"] for r in left):
                if not orphans_said:
                    log.info("burst: waiting for the rescue of jobs whose worker is gone or silent")
                    orphans_said = True
                await anyio.sleep(min(self.settings.rescue_interval, 1.0))
            else:
                log.info("burst: no runnable job left")
                self.stop()

    def _report(self, written: list[Outcome], rejected: list[Outcome]) -> None:
        by_queue = {p.queue: p for p in self.producers}
        for o in written:
            producer = by_queue.get(o.queue)
            if producer is None:
                continue
            if o.state == "completed":
                producer.completed += 1
            elif o.error is not None and o.attempt_delta == 0 and o.state != "cancelled":
                producer.failed += 1
        for o in rejected:
            producer = by_queue.get(o.queue)
            if producer is not None:
                producer.rejected_outcomes += 1
            log.warning(
                "outcome %s of job %d attempt %d rejected: the job is no longer running under "
                "this producer (rescued or re-claimed elsewhere)",
                o.state,
                o.job_id,
                o.attempt,
            )

    def _wake_all(self) -> None:
        for producer in self.producers:
            producer.wake()

    # ------------------------------------------------------------------ stats

    def stats(self) -> dict[str, Any]:
        """A snapshot for operators: per producer its queue, health (``healthy``,
        ``consecutive_failures``, ``last_heartbeat_ok_at`` as a Unix time, None before the
        first) and counters (``running``, ``claimed``, ``completed``, ``failed``,
        ``rejected_outcomes``); the worker's leader flag, the rescues and reaps it did, each
        leader service's ``runs``/``failures``/``last_error``, and the outcomes not yet
        durable (``outcomes_pending``) or written in a fallback form (``outcomes_salvaged``)."""
        maintenance = self.maintenance
        return {
            "worker_id": str(self.id),
            "worker_name": self.name,
            "time": time.time(),
            "leader": self.elector is not None and self.elector.is_leader,
            "rescued": self._rescuer.rescued if self._rescuer else 0,
            "reaped": self._reaper.reaped if self._reaper else 0,
            "leader_services": (
                {n: st.snapshot() for n, st in maintenance.status.items()} if maintenance else {}
            ),
            "outcomes_pending": self._completer.pending if self._completer else 0,
            "outcomes_salvaged": self._completer.salvaged if self._completer else 0,
            "producers": [p.stats() for p in self.producers],
        }

    def health(self) -> tuple[bool, dict[str, Any]]:
        """Whether this worker is alive for a liveness probe, and why (``/healthz``).

        Unhealthy when a producer fenced itself, or when the last heartbeat is older than
        the fencing bound; healthy during a start-up grace (``stale_after``) before the first
        heartbeat lands."""
        s = self.settings
        bound = s.fencing_bound
        stats = self.stats()
        body: dict[str, Any] = {
            "worker_name": self.name,
            "leader": stats["leader"],
            "producers": stats["producers"],
        }
        if not self.producers:
            return False, {**body, "status": "stopped", "reason": "the worker is not running"}
        sick = [p for p in self.producers if not p.healthy]
        if sick:
            reason = "; ".join(
                f"producer of queue {p.queue} is unhealthy after "
                f"{p.consecutive_failures} failed heartbeats"
                for p in sick
            )
            return False, {**body, "status": "unhealthy", "reason": reason}
        last = [p.last_heartbeat_ok_at for p in self.producers]
        now = time.time()
        if any(t is None for t in last):
            if anyio.current_time() - self._started_at <= s.stale_after:
                return True, {**body, "status": "starting"}
            return False, {
                **body,
                "status": "unhealthy",
                "reason": f"no heartbeat within the start-up grace ({s.stale_after:g}s)",
            }
        age = now - min(t for t in last if t is not None)
        if age > bound:
            return False, {
                **body,
                "status": "unhealthy",
                "reason": f"last heartbeat {age:.1f}s ago (bound {bound:g}s)",
            }
        return True, {**body, "status": "ok", "last_heartbeat_age_s": round(age, 3)}
