"""What a worker recovers that no peer can judge, and what every rescue shares.

A commit whose reply was lost leaves its outcome unknown: :class:`Unsure` runs rescues,
takeovers and hand-backs each in a transaction named by a token, and asks later whether it
landed. Every job taken back is reported to the ``job_rescued`` hooks through
:class:`RescueReports`, by a task of their own. :class:`Strays` hands back the jobs of a
worker's own claims whose reply was lost; :class:`Successor` takes over the jobs of a
stable-named worker's previous run.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Container, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, Protocol, TypeVar

import anyio

from pgq._core.hooks import Hook, Hooks, JobEvent
from pgq._db import claims, maintenance, producers
from pgq._db.connections import DATABASE_ERRORS, Connection, Db, Pool
from pgq._db.maintenance import Rescued
from pgq._db.producers import RunningJob
from pgq._worker.attempt import Outcome, error_entry
from pgq.job import Job, JobState

log = logging.getLogger("pgq.worker")


# --------------------------------------------------------------------------- unsure commits
# Writes whose commit's outcome is unknown: rescues, takeovers and hand-backs of strays, run
# each in a transaction of its own and named by a token in the error entries they write, so
# that the worker can later ask whether they landed.


class Taken(Protocol):
    """A job a write took, as it came back before the commit."""

    @property
    def id(self) -> int:
        """The job's id."""
        ...

    @property
    def xact(self) -> str:
        """The write's transaction (its ``pg_current_xact_id()``, in text)."""
        ...


W = TypeVar("W", bound=Taken)


class Unsure(Generic[W]):
    """Runs writes each in a transaction of its own, and keeps those whose commit's outcome
    is unknown (the connection broke, or the wait was cancelled, after the rows came back).
    :meth:`landed` later asks the database what became of each such transaction, so that
    every write that landed is counted and reported once (found by a token it drew, written
    in its error entries of kind ``kind``: not another worker's write of the same job), none
    that did not, and one still in progress (its commit held up) is asked about again."""

    def __init__(self, log: logging.Logger, kind: str = "rescued", what: str = "rescued") -> None:
        self._log = log
        self._kind = kind
        self._what = what
        #: By the write's token: its transaction's id, and its rows.
        self._pending: dict[str, tuple[str, list[W]]] = {}
        #: Answers "still in progress" about a write whose outcome was unknown.
        self.in_progress = 0
        # One asker at a time: a round and the worker's stop may both ask.
        self._asking = anyio.Lock()

    async def commit(
        self, conn: Connection, write: Callable[[Connection, str], Awaitable[list[W]]]
    ) -> list[W]:
        """Run ``write`` on ``conn`` in a transaction, with the token it is to write into
        its error entries; return its rows once committed."""
        rows: list[W] = []
        token = uuid.uuid4().hex
        try:
            async with conn.transaction():
                await maintenance.begin_rescue(conn, token)
                rows = await write(conn, token)
        except BaseException:
            if rows:  # the rows came back, so the commit is what failed: its outcome unknown
                self._pending[token] = (rows[0].xact, rows)
            raise
        return rows

    async def landed(self, db: Db) -> list[W]:
        """The rows of the transactions whose outcome was unknown that have landed since;
        those that did not are forgotten (their jobs are as they were, and may be taken
        again). A transaction still in progress is asked about again next time. Nothing is
        decided unless every question got its answer."""
        async with self._asking:
            verdicts = await self._ask(db)
        landed: list[W] = []
        for token, found in verdicts.items():
            rows = self._pending.pop(token)[1]
            if found:
                landed += rows
        if landed:
            self._log.info(
                "%d job(s) %s by a commit whose reply was lost: it had landed",
                len(landed),
                self._what,
            )
        return landed

    async def _ask(self, db: Db) -> dict[str, bool]:
        """Whether each pending write landed, by its token; a write whose transaction is
        still in progress has no answer yet."""
        verdicts: dict[str, bool] = {}
        for token, (xact, rows) in list(self._pending.items()):  # a commit may add one
            if await maintenance.xact_status(db, xact) == "in progress":
                self.in_progress += 1
                continue
            # Committed, aborted, or unknown here (after a crash or a failover the server
            # may even have given the id to another transaction): the jobs say whether the
            # write named by this token is there.
            verdicts[token] = await maintenance.rescue_landed(
                db, [r.id for r in rows], token, self._kind
            )
        return verdicts

    @property
    def waiting(self) -> int:
        """Jobs whose write's outcome is still unknown."""
        return sum(len(rows) for _, rows in self._pending.values())


# --------------------------------------------------------------------------- rescue reports
# The job_rescued events of one worker, delivered to its hooks by a task of their own.
#
# Three parts of a worker take running jobs back from a producer: the leader's rescuer, a
# worker restarted under its stable name (its previous run's jobs), and the check of strays
# (the jobs of its own claims whose reply was lost). Each writes the rescue first, then hands
# the event here and goes on. pgq's own handlers (the rescue metric) see it at once; the
# App's hooks get it from RescueReports.run, one event after another: a hook that is slow,
# or never returns, delays only the App's events after it, never a rescue round, a check,
# the metric or the worker's stop. A stopping worker waits at most REPORTS_FLUSH_S for the
# events left (not at all after stop(now=True)); then it says how many were not delivered,
# and stops (a hook still awaiting sees CancelledError).

#: How long a stopping worker waits for its ``job_rescued`` hooks, in seconds.
REPORTS_FLUSH_S = 5.0


class RescueReports:
    """The events of jobs taken back: handed at once to ``inline`` (pgq's own handlers,
    which are synchronous and quick), and queued, in the order the jobs were taken, for
    ``hooks`` (the App's), which :meth:`run` delivers."""

    def __init__(self, hooks: Hooks | None, inline: Sequence[Hook] = ()) -> None:
        self._hooks = hooks if hooks is not None and hooks.wants("job_rescued") else None
        self._inline = list(inline)
        self._queue: deque[JobEvent] = deque()
        self._news = anyio.Event()
        # Set, then replaced, by run() each time a hook returns: every flush waiting at
        # that moment wakes and looks again.
        self._returned = anyio.Event()
        self._in_hooks = 0
        self._flushing: anyio.CancelScope | None = None
        self._cut = False
        #: Events the App's hooks have had since the worker started.
        self.delivered = 0

    def add(
        self, *, job_id: int, queue: str, task: str, state: JobState, attempt: int, reason: str
    ) -> None:
        """Report a job taken back from its attempt ``attempt`` (it is now in ``state``);
        nothing when nothing listens. The event's job carries no arguments: a rescue
        never reads them."""
        if self._hooks is None and not self._inline:
            return
        job = Job(id=job_id, queue=queue, task=task, args={}, state=state, attempt=attempt)
        event = JobEvent("job_rescued", job, state, reason=reason)
        for handler in self._inline:
            try:
                handler(event)
            except Exception:
                log.exception("job_rescued handler %r failed for job %d", handler, job_id)
        if self._hooks is not None:
            self._queue.append(event)
            self._news.set()

    @property
    def waiting(self) -> int:
        """Events the App's hooks have not had yet: queued, or in a hook now."""
        return len(self._queue) + self._in_hooks

    async def run(self) -> None:
        """Deliver events as they come, in order, until cancelled (the only deliverer)."""
        while True:
            await self._news.wait()
            self._news = anyio.Event()
            while self._queue and self._hooks is not None:
                event = self._queue.popleft()
                self._in_hooks += 1
                try:
                    await self._hooks.emit(event)
                finally:
                    self._in_hooks -= 1
                    self._returned.set()
                    self._returned = anyio.Event()
                self.delivered += 1

    async def flush(self, timeout_s: float | None = None) -> None:
        """Wait, for at most ``timeout_s`` (default ``REPORTS_FLUSH_S``) and until :meth:`cut`,
        while :meth:`run` delivers every event left (a worker that stops); say how many
        it had not."""
        if timeout_s is None:
            timeout_s = REPORTS_FLUSH_S
        with anyio.move_on_after(0 if self._cut else timeout_s) as scope:
            self._flushing = scope
            while self.waiting:
                await self._returned.wait()
        self._flushing = None
        if self.waiting:
            log.warning(
                "%d job_rescued events were not delivered: a job_rescued hook had not "
                "returned when the worker stopped (it waits %g s for them at most, not at "
                "all when told to stop at once)",
                self.waiting,
                timeout_s,
            )

    def cut(self) -> None:
        """Wait no more for the hooks: the worker was told to stop at once."""
        self._cut = True
        if self._flushing is not None:
            self._flushing.cancel()


def report_rescue(reports: RescueReports | None, r: Rescued) -> None:
    """Queue the ``job_rescued`` event of the rescue ``r`` (the rescuer's, or a
    successor's) for the hooks."""
    if reports is not None:
        reports.add(
            job_id=r.id,
            queue=r.queue,
            task=r.task,
            state=r.state,
            attempt=r.attempt,
            reason=r.reason,
        )


# --------------------------------------------------------------------------- strays
# Jobs running under a producer's id in the database that no part of its worker knows of.
#
# A claim commits in the database before its reply reaches the worker. When the connection
# breaks in between (a network cut, a proxy restart, a timeout that gives up on the reply),
# the claimed jobs stay ``running`` under a producer that is alive and beating: no peer may
# rescue them, and the producer never starts them. (With the worker's ``async_commit``, a
# crash of the database server leaves the same behind: an outcome committed without waiting
# for the disk is lost, and its job is running again under the producer that ran it; the
# hand-back's error entry then names both causes.) Only the worker can tell. Every
# ``interval_s`` it reads the jobs running under its producers' ids, and hands back each
# attempt (job and token) it has seen at two checks in a row, neither run by its producer nor
# waiting in the completer, while no one claim of that producer was in flight across both
# checks: whatever claim took the job has ended without its rows reaching the worker. A
# worker that stops hands back, once its producers have ended, every such attempt at once:
# no claim of its can still bring one. A hand-back is an outcome like any other, fenced on
# the attempt's token: the job is available again at once, in its place in the queue, the
# attempt not counted, with an error entry saying why. A job handed back so
# ``FREE_LOST_REPLIES`` times already (whose claims, it seems, never reach a worker: a payload
# too big to read within the claim's bound) has each further attempt counted, retried after a
# backoff, and discarded when its attempts run out, instead of coming back forever. Each
# hand-back written is reported to the ``job_rescued`` hooks (reason ``RESCUE_REASON``, the
# state the write gave the job), through the worker's ``RescueReports``. A hand-back is a
# transaction of its own, named by a token in its error entries: one whose commit's reply is
# lost is asked about at the next check (and at the worker's stop), and reported if it landed.

strays_log = logging.getLogger("pgq.strays")

#: What makes one check fail without stopping the next: the database, or the check's bound.
CHECK_ERRORS: tuple[type[Exception], ...] = (TimeoutError, *DATABASE_ERRORS)

#: The error entry of a stray handed back (kind ``lost_reply``).
LOST_REPLY = (
    "handed back before it started: the reply to the claim that took it never reached "
    "its worker (the connection broke after the claim committed)"
)

#: The error entry of a stray handed back by a worker with ``async_commit``: there, an
#: outcome committed without waiting for the disk and lost in a crash of the database
#: server leaves its job running under the producer too (the claim had reached the disk).
LOST_REPLY_OR_OUTCOME = (
    "handed back: its producer, alive, was not running it: either the reply to the claim "
    "that took it never reached its worker, or (async_commit) the outcome its worker wrote "
    "was lost when the database server crashed, and it may have run"
)

#: The reason a hand-back gives its ``job_rescued`` event.
RESCUE_REASON = "claim reply lost"

#: Hand-backs of one job that do not count its attempt; from the next on, each does.
FREE_LOST_REPLIES = 2

#: The longest wait before a job whose attempt a hand-back counted is retried, in seconds.
MAX_LOST_REPLY_DELAY_S = 3600.0

#: An attempt: (job id, token).
Attempt = tuple[int, uuid.UUID | None]


class Claimer(Protocol):
    """What the check needs of a producer."""

    queue: str

    @property
    def claims_sent(self) -> int:
        """Claims sent so far."""
        ...

    @property
    def fetching(self) -> bool:
        """Whether a claim is in flight now."""
        ...

    def knows(self, job_id: int, token: uuid.UUID | None) -> bool:
        """Whether it runs, or holds for a slot, that attempt."""
        ...

    def ids(self) -> list[uuid.UUID]:
        """Every id the database may hold its jobs under (re-registration changes it)."""
        ...


class Strays:
    """Finds and hands back the jobs of claims whose replies were lost, for every producer
    of a worker (one statement per check)."""

    def __init__(
        self,
        pool: Pool,
        producers: Sequence[Claimer],
        pending: Callable[[], Container[Attempt]],
        interval_s: float,
        reports: RescueReports | None = None,
        *,
        async_commit: bool = False,
    ) -> None:
        self._pool = pool
        self._message = LOST_REPLY_OR_OUTCOME if async_commit else LOST_REPLY
        self._reports = reports
        self._producers = producers
        self._pending = pending
        self._interval_s = interval_s
        # At the last check: the unknown attempts seen, and per producer (claims sent, a
        # claim in flight) as the check read them.
        self._seen: set[Attempt] = set()
        self._claims: dict[Claimer, tuple[int, bool]] = {}
        self._unsure: Unsure[HandedBack] = Unsure(strays_log, kind="lost_reply", what="handed back")
        #: Jobs handed back since the worker started.
        self.handed_back = 0

    async def run(self) -> None:
        """Check every ``interval_s`` until cancelled."""
        failing = False
        while True:
            await anyio.sleep(self._interval_s)
            try:
                # Bounded: a check held up by a stalled connection waits for the next one.
                with anyio.fail_after(self._interval_s):
                    await self.check()
            except CHECK_ERRORS as exc:
                # Start over: what the next check sees is compared with nothing older.
                self._seen, self._claims = set(), {}
                if not failing:
                    reason = str(exc) or type(exc).__name__
                    strays_log.warning(
                        "could not check for jobs nobody runs (%s); trying again", reason
                    )
                failing = True
                continue
            failing = False

    async def check(self) -> list[int]:
        """One check; returns the ids of the jobs it handed back. It first asks about the
        hand-backs whose commit's reply was lost, and counts and reports those that landed
        (within a bound; the question's failure is not the check's)."""
        if self._unsure.waiting:
            with anyio.move_on_after(self._interval_s / 2), contextlib.suppress(*CHECK_ERRORS):
                await self.ask_unsure()
        unknown, by_id = await self._unknown()
        # Read right after the rows, with nothing awaited between: a claim whose reply came
        # meanwhile made its jobs known above.
        claims_now = {p: (p.claims_sent, p.fetching) for p in self._producers}
        strays = [
            row
            for key, row in unknown.items()
            if key in self._seen
            and not self._one_claim_throughout(by_id[row.producer_id], claims_now)
        ]
        self._seen = set(unknown) - {(r.id, r.token) for r in strays}
        self._claims = claims_now
        return await self._hand_back(strays)

    async def sweep(self) -> list[int]:
        """Hand back every attempt running under the producers' ids that the worker does not
        know, at once. Only for a worker whose producers have ended: no claim of theirs is
        in flight, so none can still bring one."""
        unknown, _ = await self._unknown()
        return await self._hand_back(list(unknown.values()))

    async def _unknown(self) -> tuple[dict[Attempt, RunningJob], dict[uuid.UUID, Claimer]]:
        by_id = {i: p for p in self._producers for i in p.ids()}
        rows = await producers.running_under(self._pool, list(by_id))
        pending = self._pending()
        unknown = {}
        for row in rows:
            owner = by_id.get(row.producer_id)
            attempt = (row.id, row.token)
            if owner is not None and not owner.knows(*attempt) and attempt not in pending:
                unknown[attempt] = row
        return unknown, by_id

    def _one_claim_throughout(
        self, producer: Claimer, claims_now: dict[Claimer, tuple[int, bool]]
    ) -> bool:
        """Whether one claim of the producer was in flight at the last check and still is:
        its reply, with the job, may yet arrive."""
        sent, fetching = claims_now[producer]
        return fetching and self._claims.get(producer) == (sent, fetching)

    async def ask_unsure(self) -> None:
        """Count and report the hand-backs whose commit's reply was lost that have landed
        since (each check asks first, and so does the worker as it stops)."""
        if self._unsure.waiting:
            self._handed(await self._unsure.landed(self._pool))

    @property
    def unsure(self) -> int:
        """Jobs whose hand-back's commit has an outcome still unknown."""
        return self._unsure.waiting

    async def _hand_back(self, strays: list[RunningJob]) -> list[int]:
        if not strays:
            return []
        before = await producers.lost_replies(self._pool, [r.id for r in strays])

        async def write(conn: Connection, token: str) -> list[HandedBack]:
            outcomes = [_hand_back(r, before.get(r.id, 0), token, self._message) for r in strays]
            states = (await claims.write_outcomes(conn, outcomes)).states
            if not states:
                return []
            xact = await maintenance.current_xact(conn)
            return [
                HandedBack(r, JobState(states[r.id]), o.attempt_delta == 0, xact)
                for r, o in zip(strays, outcomes, strict=True)
                if r.id in states
            ]

        # In a transaction of its own, named by a token in its error entries: a commit whose
        # reply is lost is asked about later, and counted and reported if it landed.
        async with self._pool.acquire() as conn:
            return self._handed(await self._unsure.commit(conn, write))

    def _handed(self, handed: list[HandedBack]) -> list[int]:
        """Count, log and report the hand-backs written; their job ids, in order."""
        if not handed:
            return []
        written = sorted(h.id for h in handed)
        self.handed_back += len(written)
        counted = sorted(h.id for h in handed if h.counted)
        if counted:
            strays_log.warning(
                "jobs %s: their claims' replies were lost %d times or more, so these hand-backs "
                "count their attempts (retried later, or discarded after the last)",
                _some(counted),
                FREE_LOST_REPLIES + 1,
            )
        strays_log.warning(
            "handed back %d jobs running under this worker's producers that it was not "
            "running (%s): %s",
            len(written),
            "a claim's reply never arrived, or async_commit outcomes a database crash lost"
            if self._message is LOST_REPLY_OR_OUTCOME
            else "the connection broke after the claim committed, before its reply arrived",
            _some(written),
        )
        if self._reports is not None:
            for h in handed:
                # What the write made of it: a job with a cancel request ends cancelled.
                r = h.row
                self._reports.add(
                    job_id=r.id,
                    queue=r.queue,
                    task=r.task,
                    state=h.state,
                    attempt=r.attempt,
                    reason=RESCUE_REASON,
                )
        return written


@dataclass(frozen=True, slots=True)
class HandedBack:
    """A stray the hand-back's write took, as it came back before the commit."""

    row: RunningJob
    #: What the write made of it.
    state: JobState
    #: Whether the hand-back counted the attempt.
    counted: bool
    #: The write's transaction.
    xact: str

    @property
    def id(self) -> int:
        """The job's id."""
        return self.row.id


def _some(ids: list[int]) -> str:
    """Up to 20 of ``ids``, for a log line."""
    return ", ".join(map(str, ids[:20])) + (" ..." if len(ids) > 20 else "")


def _hand_back(row: RunningJob, before: int, token: str, message: str = LOST_REPLY) -> Outcome:
    """The outcome that hands ``row``'s attempt back: not counted while the job was handed
    back fewer than ``FREE_LOST_REPLIES`` times ``before`` (in its whole history, retries by
    an operator included); counted from then on, retried after 1, 2, 4 ... seconds (at most
    ``MAX_LOST_REPLY_DELAY_S``), discarded once it was the last attempt. Its error entry
    carries ``token``, the hand-back's, and ``message``."""
    if before < FREE_LOST_REPLIES:
        error = error_entry(row.attempt, "lost_reply", message, rescue=token)
        return Outcome(
            row.id, row.token, row.attempt, row.queue, "available", error=error, attempt_delta=-1
        )
    times = before + 1
    last = row.attempt >= row.max_attempts
    counted = f"{message}; handed back so {times} times, so this attempt counts" + (
        ", and it was the last" if last else ""
    )
    error = error_entry(row.attempt, "lost_reply", counted, rescue=token)
    if last:
        return Outcome(row.id, row.token, row.attempt, row.queue, "discarded", error=error)
    # The exponent capped first: a job handed back a thousand times would overflow.
    delay_s = min(MAX_LOST_REPLY_DELAY_S, 2.0 ** min(times - FREE_LOST_REPLIES - 1, 12))
    return Outcome(
        row.id, row.token, row.attempt, row.queue, "retryable", delay_s=delay_s, error=error
    )


# --------------------------------------------------------------------------- the successor
# Fast recovery for a worker with a stable name (``--name``, ``PGQ_WORKER_NAME``): one that
# starts and finds producer rows of its own name left by a previous run rescues their running
# jobs as soon as those rows' heartbeats are older than their fencing bound (past it, a live
# predecessor has stopped claiming), instead of waiting for the leader's ``stale_after``.
#
# "Older than the fencing bound" adds this worker's ``heartbeat_timeout`` as a margin (the
# predecessor's clock starts when it sends a heartbeat, the row's stamp when the statement
# begins), judged in SQL with the producer rows locked.
#
# A row of the same name whose heartbeat moves on while this worker watches it belongs to a
# live process: two workers misconfigured with one name. That is reported (a warning and
# ``Worker.stats()["duplicate_names"]``) and its jobs are never touched. The trade: a
# predecessor that was cut off rather than dead may still be running a job rescued this way,
# which then runs twice, as after any rescue (its late outcome is rejected by the token).
# Each job taken over is reported to the ``job_rescued`` hooks, with the reason "worker
# restarted".

#: Looks at the rows before this worker leaves them to the leader's rescuer.
TAKEOVER_ROUNDS = 20
#: Pause after a round that left a row past its bound (a job of it was being written).
TAKEOVER_RETRY_S = 0.5


class Successor:
    """Takes over the jobs of this worker name's previous run."""

    def __init__(
        self,
        pool: Pool,
        worker_name: str,
        own_ids: Callable[[], list[uuid.UUID]],
        *,
        margin_s: float,
        after_rescue: Callable[[], None],
        reports: RescueReports | None = None,
    ) -> None:
        self._pool = pool
        self._name = worker_name
        self._margin_s = margin_s
        self._own_ids = own_ids
        self._after_rescue = after_rescue
        self._reports = reports
        #: Jobs of a previous run rescued.
        self.rescued = 0
        #: Producer rows of live processes with this worker's name.
        self.duplicates: set[uuid.UUID] = set()
        self._seen: dict[uuid.UUID, datetime] = {}
        self._unsure: Unsure[Rescued] = Unsure(log, what="taken over from the previous run")

    async def run(self) -> None:
        """Watch the rows of this name until each is rescued, found alive, or the rounds
        run out (the leader's rescuer then gets them after ``stale_after``)."""
        for _ in range(TAKEOVER_ROUNDS):
            try:
                wait_s = await self.round()
            except DATABASE_ERRORS as exc:
                log.warning("could not look for a previous run of worker %s: %s", self._name, exc)
                wait_s = TAKEOVER_RETRY_S
            if wait_s is None:
                break
            await anyio.sleep(wait_s)
        while self._unsure.waiting:  # a rescue whose commit's outcome is still unknown
            await anyio.sleep(TAKEOVER_RETRY_S)
            with contextlib.suppress(*DATABASE_ERRORS):
                self._took_over(await self._unsure.landed(self._pool))

    async def ask_unsure(self) -> None:
        """Report the takeovers whose commit's reply was lost that have landed since (as
        this worker stops, before its last rescue reports go out)."""
        if self._unsure.waiting:
            self._took_over(await self._unsure.landed(self._pool))

    @property
    def unsure(self) -> int:
        """Jobs whose takeover's commit has an outcome still unknown."""
        return self._unsure.waiting

    async def round(self) -> float | None:
        """One look: rescue what is past its bound; return how long to wait for the rest
        (None: nothing left to watch)."""
        waits: list[float] = []
        past: list[uuid.UUID] = []
        for row in await maintenance.same_name_producers(self._pool, self._name, self._own_ids()):
            if row.id in self.duplicates or row.fence_after_s is None:
                continue  # alive; or an older pgq's row, which records no bound
            first = self._seen.setdefault(row.id, row.heartbeat_at)
            if row.heartbeat_at > first:
                self.duplicates.add(row.id)
                log.warning(
                    "another live worker is named %s (producer %s beat %.1f s ago): worker "
                    "names must be unique; its jobs are left to it",
                    self._name,
                    row.id,
                    row.age_s,
                )
            elif row.age_s > row.fence_after_s + self._margin_s:
                past.append(row.id)
            else:
                waits.append(row.fence_after_s + self._margin_s - row.age_s + 0.05)
        self._took_over(await self._unsure.landed(self._pool))  # an earlier commit's
        if past:
            async with self._pool.acquire() as conn:
                self._took_over(
                    await self._unsure.commit(
                        conn, lambda c, _: maintenance.rescue_predecessor(c, past, self._margin_s)
                    )
                )
            await self._delete(past)
            waits.append(TAKEOVER_RETRY_S)  # look again: a row stays while a job of it was locked
        return min(waits) if waits else None

    def _took_over(self, rescued: list[Rescued]) -> None:
        """Count, log and report the jobs of the previous run just rescued."""
        if not rescued:
            return
        self.rescued += len(rescued)
        log.info(
            "worker %s took over %d job(s) of its previous run (silent %.1f s)",
            self._name,
            len(rescued),
            max(r.silent_s for r in rescued),
        )
        self._after_rescue()
        for r in rescued:
            report_rescue(self._reports, r)  # reason "worker restarted"

    async def _delete(self, past: list[uuid.UUID]) -> None:
        """Delete the previous run's rows whose jobs were rescued. The rescue has committed,
        been counted and reported: a failure here only leaves rows, which the next round,
        or the reaper, deletes."""
        try:
            await maintenance.delete_predecessor(self._pool, past, self._margin_s)
        except DATABASE_ERRORS as exc:
            log.warning(
                "could not delete the rows of worker %s's previous run (%s); trying again",
                self._name,
                exc,
            )
