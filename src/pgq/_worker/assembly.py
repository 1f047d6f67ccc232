"""How a worker is put together: its connections (:func:`open_pools`) and its parts, each
built once from the worker's settings and wired to the others (:func:`build`). The
:class:`~pgq.Worker` runs and stops what it gets here."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import anyio

from pgq._db import producers as store_producers
from pgq._db.connections import (
    CLAIM_SESSION_SETTINGS,
    WORKER_SESSION_SETTINGS,
    Pool,
    Target,
    connect_budget_s,
    create_pool,
)
from pgq._db.revision import check_schema
from pgq._worker.control import Control
from pgq._worker.leader.elector import Elector
from pgq._worker.leader.periodic import Periodic
from pgq._worker.leader.promoter import Promoter
from pgq._worker.leader.reaper import Reaper
from pgq._worker.leader.rescuer import Rescuer
from pgq._worker.leader.retention import Retention
from pgq._worker.leader.services import LeaderService, LeaderServices
from pgq._worker.leader.statistics import Statistics
from pgq._worker.leader.throughput import Throughput
from pgq._worker.leader.unrunnable import UnrunnableReport
from pgq._worker.liveness import Heartbeater
from pgq._worker.observe import Observers
from pgq._worker.outcome import Outcome
from pgq._worker.outcomes import LOCK_WAITERS, WRITERS, Completer
from pgq._worker.producer import Producer
from pgq._worker.recovery import Strays
from pgq._worker.rescue_reports import RescueReports
from pgq._worker.successor import Successor
from pgq.app import App
from pgq.settings import WorkerSettings


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
