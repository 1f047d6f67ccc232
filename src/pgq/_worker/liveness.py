"""Liveness: each producer's health, the heartbeats that drive it (with self-fencing), the
whole re-registration protocol, and the verdict a liveness probe reads.

The protocol in one place: every ``heartbeat_interval`` one statement writes every
producer's heartbeat on the database clock; ``max_heartbeat_failures`` failures in a row (or
no success for the fencing bound, whatever held the loop up, or a beat that lands longer
than the bound after the last by the database's clock) fence a producer: it claims nothing
until a beat lands. A producer whose row is gone re-registers under a new id and
adopts its jobs still running under the old one; their attempt tokens do not change, so
their outcomes stay valid. The old id keeps a row, beaten with the new one's, until no job
is left under it.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import anyio
import asyncpg

from pgq._db import producers as store
from pgq._db.connections import Target, connect, connect_budget_s
from pgq._db.producers import Beat
from pgq.settings import WorkerSettings

log = logging.getLogger("pgq.liveness")

#: The clock silences are measured on. Where the system has one, it is the clock that keeps
#: counting while the host is suspended (CLOCK_BOOTTIME): a worker on a laptop or a VM
#: that slept past the fencing bound must find out before it starts a job it held, and the
#: event loop's monotonic clock stands still meanwhile.
if hasattr(time, "CLOCK_BOOTTIME"):
    clock: Callable[[], float] = functools.partial(time.clock_gettime, time.CLOCK_BOOTTIME)
else:  # pragma: no cover - not Linux
    clock = time.monotonic


class ProducerHealth:
    """One producer's standing: healthy (claims) or fenced (claims nothing)."""

    def __init__(
        self,
        queue: str,
        fence_after_s: float,
        *,
        on_healthy: Callable[[], None] | None = None,
        on_fenced: Callable[[], None] | None = None,
    ) -> None:
        self._queue = queue
        self._healthy = anyio.Event()
        self._healthy.set()
        #: False while the producer has fenced itself (``_healthy`` is set when True; the
        #: flag is what each job reads, without a call).
        self.healthy = True
        self._fence_after_s = fence_after_s
        # The registration counts as the first proof of life.
        self._alive_at = clock()
        #: Failed heartbeats in a row.
        self.consecutive_failures = 0
        #: ``time.time()`` of the last heartbeat that landed; None before the first.
        self.last_ok_at: float | None = None
        #: Called when the producer becomes healthy again (to claim at once).
        self._on_healthy = on_healthy or _nothing
        #: Called when the producer fences itself: its jobs may be rescued from then on, so
        #: those it holds unstarted are handed back, never started.
        self._on_fenced = on_fenced or _nothing
        #: How many times the producer fenced itself: a claim that spans a fence may bring
        #: back jobs a peer rescued meanwhile.
        self.fences = 0

    async def wait_healthy(self) -> None:
        """Return once the producer is healthy."""
        await self._healthy.wait()

    def may_claim(self) -> bool:
        """Whether claiming is allowed now. Past the fencing bound since the last proof of
        life (even with the heartbeat loop itself held up) the producer fences itself."""
        return self.may_start(clock())

    def may_start(self, now: float) -> bool:
        """Whether the producer may claim, or start a job it holds, at ``now`` (by
        :data:`clock`): healthy, and not silent past the fencing bound. A process held up
        (stopped, starved) past the bound finds out here, before it starts an attempt a
        peer may have rescued meanwhile, whatever its heartbeat loop has yet to notice."""
        if not self.healthy:
            return False
        silent = now - self._alive_at
        if silent > self._fence_after_s:
            log.warning(
                "queue %s: no heartbeat for %.1fs; claiming nothing until one lands, and "
                "handing back the jobs claimed ahead",
                self._queue,
                silent,
            )
            self._fence()
            return False
        return True

    def beat_ok(self, now: float, sent_at: float, db_silent_s: float = 0.0) -> None:
        """A heartbeat sent at ``sent_at`` (by :data:`clock`) landed: reset the failure
        count and unfence. The proof of life dates from the sending, not the reply: the
        database stamped the row when the statement began, and peers judge from that stamp,
        so the fencing bound must not start later here than there. A beat after a silence
        past the fencing bound fences the producer first: whatever it holds unstarted may
        have been rescued, and is handed back. The silence is the longer of this process's
        (it was held up, and none of its checks ran meanwhile) and the database's,
        ``db_silent_s`` from the row's previous stamp to this one: the clock peers judge
        by, which also counts a stop this process's clocks did not see."""
        silent = max(sent_at - self._alive_at, db_silent_s)
        if self.healthy and silent > self._fence_after_s:
            log.warning(
                "queue %s: %.1fs passed without a heartbeat (the process or its host was "
                "held up); handing back the jobs claimed ahead",
                self._queue,
                silent,
            )
            self._fence()
        self._alive_at = sent_at
        self.last_ok_at = now
        if self.consecutive_failures or not self.healthy:
            log.info("queue %s: heartbeat ok again; claiming resumes", self._queue)
        self.consecutive_failures = 0
        if not self.healthy:
            self.healthy = True
            self._healthy.set()
            self._on_healthy()

    def beat_failed(self, exc: BaseException, max_failures: int, running: int) -> None:
        """A heartbeat failed; the ``max_failures``-th in a row fences the producer."""
        self.consecutive_failures += 1
        reason = str(exc) or type(exc).__name__
        if self.consecutive_failures >= max_failures and self.healthy:
            log.warning(
                "queue %s: %d heartbeats failed in a row (last: %s); claiming nothing until "
                "one succeeds (%d jobs keep running)",
                self._queue,
                self.consecutive_failures,
                reason,
                running,
            )
            self._fence()
        else:
            log.warning(
                "queue %s: heartbeat failed (%d in a row): %s",
                self._queue,
                self.consecutive_failures,
                reason,
            )

    def release(self) -> None:
        """Let a waiter through for good (the producer is stopping)."""
        self.healthy = True
        self._healthy.set()

    def _fence(self) -> None:
        if self.healthy:
            self.healthy = False
            self._healthy = anyio.Event()
            self.fences += 1
            self._on_fenced()


def _nothing() -> None:
    pass


class ProducerIdentity:
    """A producer's ids, which the re-registration protocol alone changes: the id it beats
    and claims under now, its former ids whose jobs may still need adopting, the new id of
    a re-registration not yet seen to land (a try that timed out may have committed, its
    jobs moved under it: the next try reuses it), and the id its claim in flight was sent
    under. Others read them; the protocol's steps are its methods."""

    __slots__ = ("_claiming_as", "_former", "_id", "_pending")

    def __init__(self, producer_id: uuid.UUID | None = None) -> None:
        self._id = producer_id if producer_id is not None else uuid.uuid4()
        self._former: list[uuid.UUID] = []
        self._pending: uuid.UUID | None = None
        self._claiming_as: uuid.UUID | None = None

    @property
    def id(self) -> uuid.UUID:
        """The producer's row id now."""
        return self._id

    @property
    def former_ids(self) -> list[uuid.UUID]:
        """Its ids before re-registration whose jobs may still need adopting (a copy)."""
        return list(self._former)

    @property
    def reregistering_as(self) -> uuid.UUID | None:
        """The new id of a re-registration not yet seen to land (None when none is)."""
        return self._pending

    @property
    def claiming_as(self) -> uuid.UUID | None:
        """The id its claim in flight was sent under (None when no claim is in flight)."""
        return self._claiming_as

    def ids(self) -> list[uuid.UUID]:
        """Every id the database may hold jobs of this producer's under: its own, its former
        ids, and the new id of a re-registration still pending."""
        pending = self._pending
        return [self._id, *self._former, *([pending] if pending is not None else [])]

    def claim_sent(self) -> uuid.UUID:
        """A claim goes out now: under the id it returns, until :meth:`claim_ended`."""
        self._claiming_as = self._id
        return self._id

    def claim_ended(self) -> None:
        """The claim in flight came back (or failed)."""
        self._claiming_as = None

    def reregister_as(self) -> uuid.UUID:
        """The new id a re-registration is tried under: made on the first try, the same on
        every try after it until one is seen to land."""
        if self._pending is None:
            self._pending = uuid.uuid4()
        return self._pending

    def reregistered(self) -> uuid.UUID:
        """The re-registration landed: its new id is the producer's, and the old one (which
        it returns) a former id until no job is left under it."""
        assert self._pending is not None, "no re-registration under way"
        old, self._id, self._pending = self._id, self._pending, None
        self._former.append(old)
        return old

    def released(self, former_ids: Sequence[uuid.UUID]) -> None:
        """These former ids were let go: no job is left under them, nor can one come."""
        self._former = [i for i in self._former if i not in former_ids]


class Beating(Protocol):
    """What the heartbeat needs of a producer."""

    queue: str
    concurrency: int
    health: ProducerHealth
    #: Its ids, which only this module's protocol changes.
    identity: ProducerIdentity

    def beat(self) -> Beat:
        """This producer's heartbeat row (its id and counters) as of now."""
        ...

    def running_ids(self) -> list[int]:
        """The ids of the jobs it runs now."""
        ...

    def lost(self, job_ids: set[int]) -> None:
        """These jobs were rescued from it (not adopted on re-registration)."""
        ...


class Heartbeater:
    """Beats for every producer of a worker, on a connection of its own (job traffic can
    never starve it), and runs the re-registration protocol."""

    def __init__(
        self,
        target: Target,
        producers: Sequence[Beating],
        settings: WorkerSettings,
        *,
        worker_id: uuid.UUID,
        worker_name: str,
        bounds: store.Bounds,
    ) -> None:
        self._target = target
        self._producers = producers
        self._bounds = bounds
        self._interval_s = settings.heartbeat_interval
        self._timeout_s = settings.heartbeat_timeout
        #: A connect tries each host of the DSN in turn, each for ``heartbeat_timeout``:
        #: under one host's budget, a silent first host would spend it all.
        self._connect_s = connect_budget_s(target.dsn, self._timeout_s)
        self._max_failures = settings.max_heartbeat_failures
        self._worker_id = worker_id
        self._worker_name = worker_name
        self._conn: asyncpg.Connection[asyncpg.Record] | None = None
        #: Heartbeats that landed, and re-registrations (rows found gone).
        self.beats = 0
        #: Heartbeats that did not land, since the worker started.
        self.failures = 0
        self.reregistrations = 0

    async def run(self) -> None:
        """Beat until cancelled. The schedule is start-to-start, so a slow beat does not
        stretch the interval the fencing invariant counts on."""
        next_at = anyio.current_time()  # the first beat at once: health shows up early
        try:
            while True:
                await anyio.sleep(max(0.0, next_at - anyio.current_time()))
                next_at += self._interval_s
                if next_at < anyio.current_time():  # the loop itself was held up
                    next_at = anyio.current_time() + self._interval_s
                await self.beat()
        finally:
            if self._conn is not None:
                self._conn.terminate()

    async def beat(self) -> bool:
        """One heartbeat; returns whether it succeeded. A connection is made first if
        need be: each host of the DSN gets ``heartbeat_timeout`` in turn, then the beat
        itself gets it."""
        try:
            if self._conn is None or self._conn.is_closed():
                with anyio.fail_after(self._connect_s):
                    self._conn = await connect(
                        self._target.dsn,
                        timeout_s=self._timeout_s,
                        **self._target.options(f"pgq heartbeat {self._worker_name}"),
                    )
            # The proof of life dates from here, before the statement is sent: the database
            # stamps the row later, so peers never count the silence from before this.
            sent_at = clock()
            with anyio.fail_after(self._timeout_s):
                alive = await store.heartbeat(self._conn, self._beats())
                for producer in self._producers:
                    identity = producer.identity
                    # A re-registration not yet seen to land is tried again even when the
                    # old row is back: the try that timed out may have committed (and made
                    # it again), its jobs then under a new id that only this try can claim.
                    if identity.id not in alive or identity.reregistering_as is not None:
                        await self._reregister(self._conn, producer)
                    if identity.former_ids:
                        await self._adopt(self._conn, producer)
        except Exception as exc:  # whatever stopped it, this heartbeat did not land
            if self._conn is not None:
                self._conn.terminate()  # its state is unknown after a cut-off statement
                self._conn = None
            self.failures += 1
            for producer in self._producers:
                producer.health.beat_failed(exc, self._max_failures, len(producer.running_ids()))
            return False
        self.beats += 1
        now = time.time()
        for producer in self._producers:
            producer.health.beat_ok(now, sent_at, alive.get(producer.identity.id, 0.0))
        return True

    def _beats(self) -> list[Beat]:
        """Every producer's beat, and one for each of its former ids while it holds them
        (their rows keep the jobs found under them from counting as a missing producer's;
        beaten by the same statement, they go stale together with the producer's own)."""
        beats = [p.beat() for p in self._producers]
        for p in self._producers:
            for former in p.identity.former_ids:
                beats.append(Beat(former, 0, p.health.healthy, 0, 0, 0, 0))
        return beats

    async def _reregister(
        self, conn: asyncpg.Connection[asyncpg.Record], producer: Beating
    ) -> None:
        identity = producer.identity
        old, beat = identity.id, producer.beat()
        # A try that timed out may still commit under its new id: the next one reuses it.
        new_id = identity.reregister_as()
        new_beat = Beat(
            new_id, beat.running, beat.healthy, beat.claimed, beat.completed, beat.failed,
            beat.rejected_outcomes,
        )  # fmt: skip
        running = set(producer.running_ids())
        moved = await store.reregister(
            conn,
            [old, *identity.former_ids],
            new_beat,
            worker_id=self._worker_id,
            worker_name=self._worker_name,
            queue=producer.queue,
            concurrency=producer.concurrency,
            bounds=self._bounds,
        )
        # Only the id changes: outcomes are fenced on each attempt's own token, which
        # adoption leaves alone, so nothing pending needs rewriting. A claim sent under the
        # old id may commit after the statement above, and jobs whose rows were locked were
        # passed over: the old id stays a former one, whose jobs _adopt moves over, until
        # none is left under it and no claim under it can still be in flight.
        identity.reregistered()
        kept = set(moved.adopted) | set(moved.passed_over)
        producer.lost(running - kept)
        self.reregistrations += 1
        log.warning(
            "producer %s (queue %s) found its row gone: peers judged it dead, or it was "
            "deleted; re-registered as %s and kept %d of its %d running jobs (the others "
            "were rescued: their late outcomes will be rejected)%s",
            old,
            producer.queue,
            new_id,
            len(kept & running),
            len(running),
            f", and {len(kept - running)} claimed or ending" if kept - running else "",
        )

    async def _adopt(self, conn: asyncpg.Connection[asyncpg.Record], producer: Beating) -> None:
        """Adopt the jobs still running under a re-registered producer's former ids. The
        former ids are let go, and their rows deleted, once this found none left under
        them, with no claim under one of them in flight: no claim is sent under them any
        more, so none can commit under them later."""
        identity = producer.identity
        former = identity.former_ids
        in_flight = identity.claiming_as
        moved = await store.adopt(conn, identity.id, former)
        if not moved.passed_over:
            done = [i for i in former if i != in_flight]
            if done:
                await store.release(conn, done)
                identity.released(done)
        if moved.adopted:
            log.info(
                "producer %s (queue %s) adopted %d jobs still running under its former ids",
                identity.id,
                producer.queue,
                len(moved.adopted),
            )


def health_verdict(
    healths: Sequence[tuple[str, ProducerHealth]],
    settings: WorkerSettings,
    running_for_s: float,
) -> tuple[bool, dict[str, Any]]:
    """Whether a worker is alive for a liveness probe, and why: unhealthy when a producer
    fenced itself, or when a heartbeat is older than the fencing bound; healthy during a
    start-up grace (``stale_after``) before the first heartbeat lands."""
    if not healths:
        return False, {"status": "stopped", "reason": "the worker is not running"}
    sick = [(q, h) for q, h in healths if not h.healthy]
    if sick:
        reason = "; ".join(
            f"producer of queue {q} is unhealthy after {h.consecutive_failures} failed heartbeats"
            for q, h in sick
        )
        return False, {"status": "unhealthy", "reason": reason}
    last = [h.last_ok_at for _, h in healths]
    if any(t is None for t in last):
        if running_for_s <= settings.stale_after:
            return True, {"status": "starting"}
        return False, {
            "status": "unhealthy",
            "reason": f"no heartbeat within the start-up grace ({settings.stale_after:g}s)",
        }
    age = time.time() - min(t for t in last if t is not None)
    bound = settings.fencing_bound
    if age > bound:
        return False, {
            "status": "unhealthy",
            "reason": f"last heartbeat {age:.1f}s ago (bound {bound:g}s)",
        }
    return True, {"status": "ok", "last_heartbeat_age_s": round(age, 3)}
