"""The settle check: after an attempt whose task settled it in its own transaction, whether
that transaction committed (then its outcome stands, and the worker writes none)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from pgq._db.connections import DATABASE_ERRORS
from pgq._worker.attempt import Execution
from pgq._worker.outcomes import Settler

log = logging.getLogger("pgq.producer")

#: How long the check of a task's own committed outcome may take when it is asked again
#: after a stop interrupted it (a stop must not wait on a database that does not answer).
RECHECK_S = 5.0


class SettleCheck:
    """Asks, for an attempt its task settled, which state the task's committed transaction
    left the job in; holds the producer's settler of each task."""

    __slots__ = ("settlers",)

    def __init__(self, settlers: Mapping[str, Settler]) -> None:
        #: The settler of each task the producer runs (each attempt's context gets its own).
        self.settlers = settlers

    async def committed(self, execution: Execution) -> str | None:
        """The state the task's own committed transaction left the attempt in; None when
        none committed, or when that could not be told: then the worker writes its outcome
        (fenced out, if the task's did commit)."""
        settler = self.settlers[execution.ctx.job.task]
        for asked in range(2):
            try:
                # Asked again, the check is bounded: it no longer answers to a stop.
                async with asyncio.timeout(RECHECK_S if asked else None):
                    return await settler.committed(execution.ctx)
            except asyncio.CancelledError:
                # A stop or cancel request that came as the attempt ended, and interrupted
                # the check: the attempt is over either way. The worker cancels an attempt
                # once, so the check asked again runs to its end. (Interrupted twice, by
                # someone else: the worker's outcome is written, fenced out if need be.)
                if execution.judge_cancel() == "raise":
                    raise
                if asked:
                    return None
            except DATABASE_ERRORS as exc:  # TimeoutError included
                log.warning(
                    "job %d: could not check its transactional outcome (%s); writing the worker's",
                    execution.ctx.job.id,
                    str(exc) or type(exc).__name__,
                )
                return None
        return None  # pragma: no cover - the loop returns
