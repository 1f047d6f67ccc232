"""Lease-based leader election on the database clock."""

from __future__ import annotations

import logging
import uuid

import anyio

from pgq._db import producers as store
from pgq._db.connections import DATABASE_ERRORS, Pool
from pgq._worker.liveness import clock

log = logging.getLogger("pgq.leader")

#: The longest a resignation waits for its statement.
RESIGN_S = 2.0


class Elector:
    """Holds, renews or waits for the single ``default`` leader lease.

    The lease lasts ``ttl_s`` on the database clock and is renewed every ``ttl_s / 3``.
    Locally the worker counts itself leader only until ``ttl_s`` after it *sent* its last
    successful renewal, which is never later than the lease's expiry in the database; a
    leader cut off from the database therefore stops leading before anyone else can start.
    That time is kept on the clock producers measure their silence on, which counts a
    suspended host's sleep: a leader whose host slept past its lease wakes up deposed.
    """

    def __init__(
        self,
        pool: Pool,
        *,
        worker_id: uuid.UUID,
        worker_name: str,
        ttl_s: float,
        connect_s: float = 0.0,
    ):
        self._pool = pool
        #: How long a round may wait for a connection of the pool: the time to open one
        #: through every host of the DSN (connect_budget_s), at least a renewal interval.
        self._acquire_s = max(connect_s, ttl_s / 3)
        self._worker_id = worker_id
        self._worker_name = worker_name
        self._ttl_s = ttl_s
        self._valid_until = 0.0
        self._held = False
        self._wake = anyio.Event()
        #: Times this worker became leader.
        self.terms = 0

    @property
    def renew_interval_s(self) -> float:
        """How often the lease is renewed (or sought)."""
        return self._ttl_s / 3

    @property
    def is_leader(self) -> bool:
        """True while this worker holds an unexpired lease."""
        return self._held and clock() < self._valid_until

    def wake(self) -> None:
        """Seek the lease now (the leader resigned)."""
        self._wake.set()

    async def run(self, *, attempted: bool = False) -> None:
        """Seek or renew the lease until cancelled; ``attempted``: :meth:`attempt` has just
        run, so the first round waits its turn (or a :meth:`wake`)."""
        while True:
            if not attempted:
                self._wake = anyio.Event()
                await self.attempt()
            attempted = False
            with anyio.move_on_after(self.renew_interval_s):
                await self._wake.wait()

    async def attempt(self) -> bool:
        """One election round; returns whether this worker leads afterwards."""
        try:
            # A connection first (a new one may try every host of the DSN in turn), then
            # the statement within the renewal interval; the lease dates from its sending.
            async with self._pool.acquire(timeout=self._acquire_s) as conn:
                sent = clock()
                with anyio.fail_after(self.renew_interval_s):
                    won = await store.acquire_lease(
                        conn, self._worker_id, self._worker_name, self._ttl_s
                    )
        except DATABASE_ERRORS as exc:
            if self._held:
                log.warning(
                    "could not renew the leader lease (%s); leading until it lapses",
                    _why(exc, self.renew_interval_s),
                )
            return self.is_leader
        if won:
            self._valid_until = sent + self._ttl_s
            if not self._held:
                self.terms += 1
                log.info("worker %s is now the leader", self._worker_name)
            self._held = True
        elif self._held:
            log.warning("worker %s lost the leader lease to another worker", self._worker_name)
            self._held = False
        return self.is_leader

    async def resign(self) -> None:
        """Give the lease up at once and tell followers (NOTIFY) so one takes over now."""
        if not self._held:
            return
        self._held = False
        try:
            with anyio.fail_after(RESIGN_S):
                await store.resign_lease(self._pool, self._worker_id)
            log.info("worker %s resigned leadership", self._worker_name)
        except DATABASE_ERRORS as exc:
            log.warning(
                "could not resign leadership (%s); the lease will lapse", _why(exc, RESIGN_S)
            )


def _why(exc: BaseException, limit_s: float) -> str:
    """What a lease statement that failed met, readable: a timeout (whose text is empty)
    says what it waited for."""
    if isinstance(exc, TimeoutError):
        return (
            f"TimeoutError: no reply within {limit_s:g} s; the statement may be waiting on "
            "a lock another session holds on pgq_leader, or the server is slow or out of reach"
        )
    return f"{type(exc).__name__}: {str(exc).strip() or 'no message'}"
