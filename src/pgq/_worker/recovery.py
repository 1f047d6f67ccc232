"""Strays: jobs running under a producer's id in the database that no part of its worker
knows of.

A claim commits in the database before its reply reaches the worker. When the connection
breaks in between (a network cut, a proxy restart, a timeout that gives up on the reply),
the claimed jobs stay ``running`` under a producer that is alive and beating: no peer may
rescue them, and the producer never starts them. (With the worker's ``async_commit``, a
crash of the database server leaves the same behind: an outcome committed without waiting
for the disk is lost, and its job is running again under the producer that ran it; the
hand-back's error entry then names both causes.) Only the worker can tell. Every
``interval_s`` it reads the jobs running under its producers' ids, and hands back each
attempt (job and token) it has seen at two checks in a row, neither run by its producer nor
waiting in the completer, while no one claim of that producer was in flight across both
checks: whatever claim took the job has ended without its rows reaching the worker. A
worker that stops hands back, once its producers have ended, every such attempt at once:
no claim of its can still bring one. A hand-back is an outcome like any other, fenced on
the attempt's token: the job is available again at once, in its place in the queue, the
attempt not counted, with an error entry saying why. A job handed back so
``FREE_LOST_REPLIES`` times already (whose claims, it seems, never reach a worker: a payload
too big to read within the claim's bound) has each further attempt counted, retried after a
backoff, and discarded when its attempts run out, instead of coming back forever. Each
hand-back written is reported to the ``job_rescued`` hooks (reason ``RESCUE_REASON``, the
state the write gave the job), through the worker's ``RescueReports``. A hand-back is a
transaction of its own, named by a token in its error entries: one whose commit's reply is
lost is asked about at the next check (and at the worker's stop), and reported if it landed.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from typing import Protocol

import anyio

from pgq._db import claims, maintenance
from pgq._db import producers as store
from pgq._db.connections import DATABASE_ERRORS, Connection, Pool
from pgq._db.producers import RunningJob
from pgq._worker.attempt import Outcome, error_entry
from pgq._worker.rescue_reports import RescueReports
from pgq._worker.unsure import Unsure
from pgq.job import JobState

log = logging.getLogger("pgq.strays")

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
        self._unsure: Unsure[HandedBack] = Unsure(log, kind="lost_reply", what="handed back")
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
                    log.warning("could not check for jobs nobody runs (%s); trying again", reason)
                failing = True
                continue
            failing = False

    async def check(self) -> list[int]:
        """One check; returns the ids of the jobs it handed back. It first asks about the
        hand-backs whose commit's reply was lost, and counts and reports those that landed
        (within a bound; the question's failure is not the check's)."""
        if self._unsure.waiting:
            with anyio.move_on_after(self._interval_s / 2), contextlib.suppress(*CHECK_ERRORS):
                await self.settle()
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
        rows = await store.running_under(self._pool, list(by_id))
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

    async def settle(self) -> None:
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
        before = await store.lost_replies(self._pool, [r.id for r in strays])

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
            log.warning(
                "jobs %s: their claims' replies were lost %d times or more, so these hand-backs "
                "count their attempts (retried later, or discarded after the last)",
                _some(counted),
                FREE_LOST_REPLIES + 1,
            )
        log.warning(
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
