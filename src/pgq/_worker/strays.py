"""Strays: jobs running under a producer's id in the database that no part of its worker
knows of.

A claim commits in the database before its reply reaches the worker. When the connection
breaks in between (a network cut, a proxy restart, a timeout that gives up on the reply),
the claimed jobs stay ``running`` under a producer that is alive and beating: no peer may
rescue them, and the producer never starts them. Only the worker can tell. Every
``interval_s`` it reads the jobs running under its producers' ids, and hands back each one
it has seen at two checks in a row, the same attempt both times, neither run by its
producer nor waiting in the completer, while no one claim of that producer was in flight
across both checks: whatever claim took the job has ended without its rows reaching the
worker. The hand-back is an outcome like any other, fenced on the attempt's token: the job
is available again at once, in its place in the queue, the attempt not counted, with an
error entry saying why.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Container, Sequence
from typing import Protocol

import anyio

from pgq._store import claims
from pgq._store import producers as store
from pgq._store.connections import DATABASE_ERRORS, Pool
from pgq._store.producers import RunningJob
from pgq._worker.outcome import Outcome, error_entry

log = logging.getLogger("pgq.strays")

#: The error entry of a stray handed back.
LOST_REPLY = (
    "handed back before it started: the reply to the claim that took it never reached "
    "its worker (the connection broke after the claim committed)"
)


class Claimer(Protocol):
    """What the check needs of a producer."""

    id: uuid.UUID
    queue: str
    #: Claims sent so far, and whether one is in flight now.
    claims_sent: int
    fetching: bool

    @property
    def running(self) -> Container[int]:
        """The ids of the jobs it runs or holds for a slot."""
        ...


class Strays:
    """Finds and hands back the jobs of claims whose replies were lost, for every producer
    of a worker (one statement per check)."""

    def __init__(
        self,
        pool: Pool,
        producers: Sequence[Claimer],
        pending: Callable[[], Container[int]],
        interval_s: float,
    ) -> None:
        self._pool = pool
        self._producers = producers
        self._pending = pending
        self._interval_s = interval_s
        # At the last check: the unknown attempts seen, (job id, token), and per producer
        # (claims sent, a claim in flight) as the check read them.
        self._seen: set[tuple[int, uuid.UUID | None]] = set()
        self._claims: dict[Claimer, tuple[int, bool]] = {}
        #: Jobs handed back since the worker started.
        self.handed_back = 0

    async def run(self) -> None:
        """Check every ``interval_s`` until cancelled."""
        failing = False
        while True:
            await anyio.sleep(self._interval_s)
            try:
                await self.check()
            except DATABASE_ERRORS as exc:
                # Start over: what the next check sees is compared with nothing older.
                self._seen, self._claims = set(), {}
                if not failing:
                    log.warning("could not check for jobs nobody runs (%s); trying again", exc)
                failing = True
                continue
            failing = False

    async def check(self) -> list[int]:
        """One check; returns the ids of the jobs it handed back."""
        rows = await store.running_under(self._pool, [p.id for p in self._producers])
        # From here to the comparison nothing awaits: what the producers know and the
        # claims they have in flight are read at one moment, after the rows.
        by_id = {p.id: p for p in self._producers}
        pending = self._pending()
        unknown: dict[tuple[int, uuid.UUID | None], RunningJob] = {}
        for row in rows:
            owner = by_id.get(row.producer_id)
            if owner is not None and row.id not in owner.running and row.id not in pending:
                unknown[(row.id, row.token)] = row
        claims_now = {p: (p.claims_sent, p.fetching) for p in self._producers}
        strays = [
            row
            for key, row in unknown.items()
            if key in self._seen
            and not self._one_claim_throughout(by_id[row.producer_id], claims_now)
        ]
        self._seen = set(unknown) - {(r.id, r.token) for r in strays}
        self._claims = claims_now
        if not strays:
            return []
        outcomes = [
            Outcome(
                r.id,
                r.token,
                r.attempt,
                r.queue,
                "available",
                error=error_entry(r.attempt, "shutdown", LOST_REPLY),
                attempt_delta=-1,
            )
            for r in strays
        ]
        written = sorted(await claims.write_outcomes(self._pool, outcomes))
        self.handed_back += len(written)
        if written:
            log.warning(
                "handed back %d jobs claimed by this worker whose claim's reply never arrived "
                "(the connection broke after the claim committed): %s",
                len(written),
                ", ".join(map(str, written[:20])) + (" ..." if len(written) > 20 else ""),
            )
        return written

    def _one_claim_throughout(
        self, producer: Claimer, claims_now: dict[Claimer, tuple[int, bool]]
    ) -> bool:
        """Whether one claim of the producer was in flight at the last check and still is:
        its reply, with the job, may yet arrive."""
        sent, fetching = claims_now[producer]
        return fetching and self._claims.get(producer) == (sent, fetching)
