"""A producer's counters, reported in each heartbeat and in ``Worker.stats()``."""

from __future__ import annotations

from typing import Any

from pgq._worker.attempt import Outcome


class ProducerCounters:
    """Claims sent and returned, jobs claimed, and outcomes as the database took them."""

    __slots__ = ("claimed", "claims_sent", "completed", "failed", "fetches", "rejected_outcomes")

    def __init__(self) -> None:
        self.claims_sent = self.fetches = self.claimed = 0
        self.completed = self.failed = self.rejected_outcomes = 0

    def claim_sent(self) -> None:
        """A claim went out."""
        self.claims_sent += 1

    def claim_returned(self, jobs: int) -> None:
        """A claim came back with ``jobs`` jobs."""
        self.fetches += 1
        self.claimed += jobs

    def counted(self, outcomes: list[Outcome], accepted: bool) -> None:
        """Outcomes as the database took them (written, or rejected by the fence)."""
        if not accepted:
            self.rejected_outcomes += len(outcomes)
            return
        for outcome in outcomes:
            if outcome.state == "completed":
                self.completed += 1
            elif (
                outcome.error is not None
                and outcome.attempt_delta == 0
                and outcome.state != "cancelled"
            ):
                self.failed += 1

    def settled(self, state: str) -> None:
        """A task's own transaction settled its attempt in ``state``, and committed."""
        if state == "completed":
            self.completed += 1
        elif state in ("retryable", "discarded"):
            self.failed += 1

    def stats(self) -> dict[str, Any]:
        """The counters, for :meth:`pgq.Worker.stats`."""
        return {
            "fetches": self.fetches,
            "claimed": self.claimed,
            "completed": self.completed,
            "failed": self.failed,
            "rejected_outcomes": self.rejected_outcomes,
        }
