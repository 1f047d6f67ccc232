"""One claim of a producer's: the statement its queue's limits call for."""

from __future__ import annotations

import uuid

import anyio

from pgq._db import claims
from pgq._db.claims import ClaimPlan
from pgq._db.connections import Pool
from pgq._worker.limits import LimitsCache
from pgq.job import Job


class Claimer:
    """Claims up to ``limit`` jobs of the plan's queue and tasks: in one statement on an
    unlimited queue, under the queue's lock (usage counted) in one call on a limited one;
    both on ``claim_pool`` when given (connections that keep cached plans, which the
    limited claim's function keeps for its own statements too)."""

    __slots__ = ("_async_commit", "_claim_pool", "_limits", "_plan", "_pool", "_worker_name")

    def __init__(
        self,
        pool: Pool,
        plan: ClaimPlan,
        limits: LimitsCache,
        *,
        worker_name: str,
        async_commit: bool,
        claim_pool: Pool | None = None,
    ) -> None:
        self._pool = pool
        self._claim_pool = pool if claim_pool is None else claim_pool
        self._plan = plan
        self._limits = limits
        self._worker_name = worker_name
        self._async_commit = async_commit

    async def claim(self, limit: int, producer_id: uuid.UUID, *, slots_free: int) -> list[Job]:
        """Claim up to ``limit`` jobs under ``producer_id``, in claim order; those beyond
        ``slots_free`` are claimed ahead, which a limited queue grants only where its
        limits leave room to spare."""
        now = anyio.current_time()
        limits = await self._limits.current(now)
        if limits.limited:
            now_part = max(0, min(limit, slots_free))
            jobs, held_back, under_lock = await claims.claim_limited(
                self._claim_pool,
                self._plan,
                producer_id,
                self._worker_name,
                now_part,
                ahead=limit - now_part,
                async_commit=self._async_commit,
            )
            self._limits.claimed_limited(held_back, under_lock)
            return jobs
        self._limits.claiming_unlimited()
        jobs = await claims.claim(
            self._claim_pool,
            self._plan,
            producer_id,
            self._worker_name,
            limit,
            async_commit=self._async_commit,
        )
        if not jobs:
            self._limits.found_nothing(now)
        return jobs
