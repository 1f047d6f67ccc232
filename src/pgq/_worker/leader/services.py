"""Runs the leader's services, each in a loop of its own, while this worker leads; and the
few every worker runs whether it leads or not (the promotion of due jobs: no leader stands
on the path of a due job).

One failing service (a broken periodic schedule, retention that cannot delete, a rescue
statement the server refuses) never stops the others: each runs and fails on its own, its
failures are counted, and each distinct error is logged once until the service recovers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import anyio

from pgq._db.connections import DATABASE_ERRORS
from pgq._worker.leader.elector import Elector

log = logging.getLogger("pgq.leader")

#: The least time one question off the lead may take (a connection that stalls without
#: breaking would otherwise hold the service's loop).
SETTLE_BOUND_S = 5.0


class LeaderService(Protocol):
    """A duty only the leader performs, every ``interval_s`` seconds."""

    name: str
    #: Run at once when the loop starts, rather than after the first interval.
    eager: bool

    @property
    def interval_s(self) -> float:
        """Seconds before the next round (read before each wait)."""
        ...

    async def run_once(self) -> Any:
        """One round; returns what it did. Raises when the round failed."""
        ...


@runtime_checkable
class Settles(Protocol):
    """A service whose rounds may leave an outcome unknown (a commit whose reply was lost)
    and find it out later, whether or not this worker still leads."""

    async def settle(self) -> None:
        """Find out what became of what earlier rounds left unknown."""
        ...


@dataclass
class ServiceStatus:
    """How a leader service has fared, for :meth:`pgq.Worker.stats`."""

    runs: int = 0
    failures: int = 0
    consecutive_failures: int = 0
    last_error: str | None = None
    _logged: set[str] = field(default_factory=set, repr=False)

    def snapshot(self) -> dict[str, Any]:
        """The counters as plain values."""
        return {
            "runs": self.runs,
            "failures": self.failures,
            "consecutive_failures": self.consecutive_failures,
            "last_error": self.last_error,
        }


class LeaderServices:
    """Starts a loop per service; each loop runs its service only while ``elector`` leads,
    but for those named in ``everywhere``, which run on every worker."""

    def __init__(
        self,
        elector: Elector,
        services: list[LeaderService],
        everywhere: frozenset[str] = frozenset(),
    ) -> None:
        self._elector = elector
        self._everywhere = everywhere
        self.services = {s.name: s for s in services}
        self.status = {s.name: ServiceStatus() for s in services}
        self._wake = {s.name: anyio.Event() for s in services}

    def wake(self, name: str) -> None:
        """Run service ``name`` now rather than at its next interval (if leading)."""
        if name in self._wake:
            self._wake[name].set()

    async def run(self) -> None:
        """Run every service's loop until cancelled."""
        async with anyio.create_task_group() as tg:
            for service in self.services.values():
                tg.start_soon(self._loop, service, name=f"pgq leader service {service.name}")

    async def _loop(self, service: LeaderService) -> None:
        first = True
        while True:
            if not (first and service.eager):
                with anyio.move_on_after(service.interval_s):
                    await self._wake[service.name].wait()
            first = False
            self._wake[service.name] = anyio.Event()
            if self._elector.is_leader or service.name in self._everywhere:
                await self.run_service(service.name)
            else:
                await self._settle(service)

    async def _settle(self, service: LeaderService) -> None:
        """Off the lead, a service still settles what its rounds left unknown (each
        distinct failure logged once, like a round's)."""
        if not isinstance(service, Settles):
            return
        logged = self.status[service.name]._logged
        try:
            with anyio.fail_after(max(service.interval_s, SETTLE_BOUND_S)):
                await service.settle()
        except Exception as exc:
            text = f"could not settle what its rounds left unknown: {type(exc).__name__}: {exc}"
            if text not in logged:
                logged.add(text)
                expected = isinstance(exc, (TimeoutError, *DATABASE_ERRORS))
                log.log(
                    logging.WARNING if expected else logging.ERROR,
                    "leader service %s %s (asking again)",
                    service.name,
                    text,
                    exc_info=None if expected else exc,
                )
            return
        logged.difference_update([t for t in logged if t.startswith("could not settle")])

    async def run_service(self, name: str) -> Any:
        """Run one round of service ``name`` now, recording its success or failure;
        returns its result, or None when it failed."""
        service, status = self.services[name], self.status[name]
        try:
            result = await service.run_once()
        except Exception as exc:
            self._failed(service, status, exc)
            return None
        status.runs += 1
        if status.consecutive_failures:
            log.info(
                "leader service %s recovered after %d failed rounds",
                service.name,
                status.consecutive_failures,
            )
        status.consecutive_failures = 0
        status._logged.clear()
        return result

    @staticmethod
    def _failed(service: LeaderService, status: ServiceStatus, exc: Exception) -> None:
        status.runs += 1
        status.failures += 1
        status.consecutive_failures += 1
        text = f"{type(exc).__name__}: {exc}"
        status.last_error = text[:1000]
        if text in status._logged:
            log.debug("leader service %s failed again: %s", service.name, text)
            return
        status._logged.add(text)
        expected = isinstance(exc, DATABASE_ERRORS)
        log.log(
            logging.WARNING if expected else logging.ERROR,
            "leader service %s failed: %s (the other services go on; this error is logged "
            "once until the service recovers)",
            service.name,
            text,
            exc_info=None if expected else exc,
        )
