"""A task settling its own attempt in its own transaction (``ctx.complete(connection=...)``
and the like): the outcome written there, fenced on the attempt's token, so the effects of
the transaction and the job's outcome commit together or not at all."""

from __future__ import annotations

import uuid
from typing import Any

from pgq._db import claims as store
from pgq._db import jobs as store_jobs
from pgq._db.boundary import database_errors
from pgq._db.connections import Pool
from pgq._db.drivers import caller_driver
from pgq._worker.attempt import Outcome, _completed, _raised
from pgq.app import Task
from pgq.errors import AttemptSuperseded
from pgq.job import Cancel, Job, JobContext, Retry, Snooze


class Settler:
    """Writes outcomes a task's own transaction carries; one per task of a producer."""

    def __init__(self, pool: Pool, task: Task[Any, Any]) -> None:
        self._pool = pool
        self._task = task

    async def parents(self, job: Job) -> list[Job]:
        """The jobs ``job`` depends on, read now (for ``ctx.parents``)."""
        return await store_jobs.parents(self._pool, job.depends_on or [])

    def outcome(self, ctx: JobContext, kind: str, **details: Any) -> Outcome:
        """The outcome ``kind`` ("complete", "retry", "snooze", "cancel") means for this
        attempt: the same the worker writes when the task returns or raises."""
        job = ctx.job
        if kind == "complete":
            return _completed(job, details.get("result"))
        if kind == "retry":
            return _raised(
                job,
                self._task,
                Retry(details.get("delay"), details.get("reason", "retry requested")),
            )
        if kind == "snooze":
            return _raised(job, self._task, Snooze(details["delay"]))
        return _raised(job, self._task, Cancel(details.get("reason", "cancelled by the task")))

    async def settle(self, ctx: JobContext, connection: Any, kind: str, **details: Any) -> None:
        """Write the outcome in ``connection``'s transaction, or raise AttemptSuperseded;
        the driver's errors come out as pgq's (a public call's, for the task)."""
        outcome = self.outcome(ctx, kind, **details)
        settle_token = uuid.uuid4()
        with database_errors(caller=connection):
            driver = await caller_driver(connection)
            state = await store.settle(
                driver, outcome.job_id, outcome.token, settle_token, outcome.state,
                delay_s=outcome.delay_s, error=outcome.error, result=outcome.result,
                attempt_delta=outcome.attempt_delta,
            )  # fmt: skip
        self._settled(ctx, settle_token, state)

    def settle_sync(self, ctx: JobContext, connection: Any, kind: str, **details: Any) -> None:
        """:meth:`settle` for plain ``def`` tasks, on a psycopg or SQLAlchemy connection."""
        from pgq._db.psycopg_drivers import caller_connection_sync

        outcome = self.outcome(ctx, kind, **details)
        settle_token = uuid.uuid4()
        with database_errors(caller=connection):
            state = store.settle_sync(
                caller_connection_sync(connection), outcome.job_id, outcome.token,
                settle_token, outcome.state, delay_s=outcome.delay_s, error=outcome.error,
                result=outcome.result, attempt_delta=outcome.attempt_delta,
            )  # fmt: skip
        self._settled(ctx, settle_token, state)

    @staticmethod
    def _settled(ctx: JobContext, settle_token: uuid.UUID, state: str | None) -> None:
        if state is None:
            raise AttemptSuperseded(ctx.job.id, ctx.job.attempt)
        if ctx._settled is None:
            ctx._settled = []
        ctx._settled.append((settle_token, state))

    async def committed(self, ctx: JobContext) -> str | None:
        """The state the task's own transaction left the job in, when one that settled it
        committed; None when none did (rolled back, or still open)."""
        if not ctx._settled:
            return None
        held = await store.settled_by(self._pool, ctx.job.id, [t for t, _ in ctx._settled])
        return next((state for token, state in ctx._settled if token == held), None)
