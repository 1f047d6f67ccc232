"""Every way an attempt's outcome is written. The :class:`Completer` batches the worker's
outcomes into fenced UPDATEs: one round trip for many jobs, and up to ``WRITERS`` batches
written at once, each on a connection of its own; a task may write its own instead, in its
own transaction (:class:`InTransactionOutcomes`).

Every outcome reaches the database, and none waits for a lock held elsewhere: a batch passes
over the rows locked now (an application transaction that holds a job's row), and each of
those is written on its own, on a connection that waits for that row alone, so that it,
not a rescue, gets the row when it frees. A batch the database refuses for want of a connection
(or for a transient reason: a deadlock, a full disk, a standby) is kept and retried whole.
A batch it refuses for what one outcome holds is written outcome by outcome, and an outcome
refused on its own is retried once, then written without its result and error details (the
reason recorded instead), then as a failed attempt; one that even that cannot write is held
and retried, never dropped while the worker lives.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable
from operator import attrgetter
from typing import Any

import anyio
import anyio.abc
import asyncpg

from pgq._db import claims
from pgq._db import jobs as store_jobs
from pgq._db.boundary import database_errors
from pgq._db.claims import Written
from pgq._db.connections import Db, Pool, is_transient
from pgq._db.drivers import caller_driver
from pgq._worker.attempt import Outcome, _completed, _raised, error_entry
from pgq.app import Task
from pgq.errors import AttemptSuperseded
from pgq.job import Cancel, Job, JobContext, Retry, Snooze

log = logging.getLogger("pgq.completer")

#: Called with the outcomes a flush wrote, and those the fence rejected.
Reporter = Callable[[list[Outcome], list[Outcome]], None]

#: Seconds between tries of an outcome the database refused in every form.
HELD_RETRY_S = 30.0

#: Batches written at once, each on a connection of its own (the worker sizes its pool for
#: them): with one, a worker whose handlers outran a statement of ``batch_size`` outcomes
#: finished its jobs well before their outcomes were durable. Their id sets are disjoint and
#: each is written in id order, so they never wait on each other's rows.
WRITERS = 2

#: Outcomes waiting for their rows at once, each on a connection of its own (the rest of a
#: worker's pool stays free for claims and batches; the worker sizes it for these).
LOCK_WAITERS = 2

#: Milliseconds a batch waits for a row locked elsewhere before it is written again passing
#: over such rows (a lock of pgq's own, a rescue's or an adoption's, lasts less).
LOCK_WAIT_MS = 50

#: Seconds one wait for a locked row lasts before it is asked again (a stalled connection
#: would otherwise hold a waiter for good).
LOCK_WAIT_S = 60.0

_BY_JOB_ID = attrgetter("job_id")


def brief(exc: BaseException | None, limit: int = 300) -> str:
    """An exception as one short line (a driver error may quote a huge parameter)."""
    if exc is None:
        return "no error"
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[:limit] + "..."


class Completer:
    """Collects outcomes from every producer of a worker and writes them in batches.

    A batch goes out when ``batch_size`` outcomes wait or ``interval_s`` after the first one,
    whichever is sooner, once one of the ``writers`` is free; while a batch is out, the next
    goes beside it once a quarter of ``batch_size`` waits. With ``async_commit``, each batch
    commits without waiting for the WAL's flush (the worker's ``async_commit`` setting).
    """

    def __init__(
        self,
        pool: Pool,
        report: Reporter,
        *,
        batch_size: int = 1000,
        interval_s: float = 0.002,
        retry_max_s: float = 5.0,
        async_commit: bool = False,
        writers: int = WRITERS,
    ) -> None:
        self._pool = pool
        self._async_commit = async_commit
        self._report = report
        self._batch_size = batch_size
        self._interval_s = interval_s
        self._retry_max_s = retry_max_s
        self._buffer: list[Outcome] = []
        # Batches being written now, each by a writer of its own.
        self._writing: list[list[Outcome]] = []
        self._writer_count = writers
        # Set when a writer ends, or when a quarter of a full batch waits.
        self._more = anyio.Event()
        # After a batch kept for a transient failure, no batch goes out before this time.
        self._retry_at = 0.0
        self._retry_delay = 0.1
        # Outcomes the database refused in every form: (when to try again, outcome).
        self._held: list[tuple[float, Outcome]] = []
        self._has_items = anyio.Event()
        self._full = anyio.Event()
        self._idle = anyio.Event()
        self._idle.set()
        #: Outcomes written in a fallback form (without their result or as a failed attempt).
        self.salvaged = 0
        # Outcomes a batch passed over (their rows locked elsewhere), each written on its own.
        self._locked: list[Outcome] = []
        self._waiters = anyio.CapacityLimiter(LOCK_WAITERS)
        self._tg: anyio.abc.TaskGroup | None = None
        #: Outcomes that waited for their rows, locked elsewhere, since the worker started.
        self.waited_on_locks = 0

    @property
    def pending(self) -> int:
        """Outcomes not yet written (with ``async_commit``, a written one may still be lost
        in a crash of the database server)."""
        return (
            len(self._buffer) + sum(map(len, self._writing)) + len(self._held) + len(self._locked)
        )

    @property
    def waiting_on_locks(self) -> int:
        """Outcomes waiting now for their rows, locked by another transaction."""
        return len(self._locked)

    def pending_attempts(self) -> set[tuple[int, uuid.UUID | None]]:
        """The attempts (job id, token) whose outcomes are not yet durable."""
        return (
            {(o.job_id, o.token) for o in self._buffer}
            | {(o.job_id, o.token) for batch in self._writing for o in batch}
            | {(o.job_id, o.token) for _, o in self._held}
            | {(o.job_id, o.token) for o in self._locked}
        )

    @property
    def held(self) -> int:
        """Outcomes the database refused in every form, waiting to be tried again."""
        return len(self._held)

    def add(self, outcome: Outcome) -> None:
        """Queue one outcome; never blocks."""
        self._buffer.append(outcome)
        if len(self._buffer) == 1:
            self._has_items.set()
            if self._idle.is_set():  # never replace the event a caller may be waiting on
                self._idle = anyio.Event()
        if len(self._buffer) >= self._batch_size:
            self._full.set()
        elif len(self._buffer) == self._batch_size // 4:
            self._more.set()

    def hurry(self) -> None:
        """Write what waits now, without the rest of the gather window."""
        if self._buffer:
            self._full.set()

    async def wait_idle(self) -> None:
        """Return once every outcome added so far is written (or rejected)."""
        await self._idle.wait()

    async def run(self) -> None:
        """Write batches until cancelled. Cancel only after :meth:`wait_idle`."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            await self._run()

    async def _run(self) -> None:
        assert self._tg is not None
        while True:
            await self._wait_for_work()
            if len(self._buffer) < self._batch_size:
                with anyio.move_on_after(self._interval_s):
                    await self._full.wait()
            if self._retry_at > anyio.current_time():
                # After a transient failure, the batches kept wait out the backoff.
                await anyio.sleep_until(self._retry_at)
            await self._writer_free()
            self._tg.start_soon(self._write_batch, self._take(), name="pgq outcome batch")

    async def _writer_free(self) -> None:
        """Wait for a free writer. While a batch is out, the next goes beside it only once a
        quarter of a full batch waits: a worker whose writer keeps up writes one statement
        at a time, each with as many outcomes as gathered meanwhile, as with one writer."""
        while self._writing and (
            len(self._writing) >= self._writer_count or len(self._buffer) < self._batch_size // 4
        ):
            self._more = anyio.Event()
            await self._more.wait()

    def _take(self) -> list[Outcome]:
        """The next batch, out of the buffer and into the batches being written."""
        batch = self._buffer[: self._batch_size]
        del self._buffer[: len(batch)]
        self._writing.append(batch)
        if len(self._buffer) < self._batch_size:
            self._full = anyio.Event()
        if not self._buffer:
            self._has_items = anyio.Event()
        return batch

    async def _write_batch(self, batch: list[Outcome]) -> None:
        """Write one batch (a writer's); what a transient failure kept from being written
        goes back to the front of the buffer, to be tried again after a backoff."""
        try:
            kept = await self._flush(batch)
        finally:
            # By identity: two batches are never the same list.
            self._writing[:] = [b for b in self._writing if b is not batch]
            self._more.set()
        if kept:
            self._retry_at = anyio.current_time() + self._retry_delay
            self._retry_delay = min(self._retry_delay * 2, self._retry_max_s)
            self._buffer[:0] = kept
            self._has_items.set()
            if len(self._buffer) >= self._batch_size:
                self._full.set()
        else:
            self._retry_delay = 0.1
            self._idle_if_done()

    def _idle_if_done(self) -> None:
        if not self._buffer and not self._writing and not self._held and not self._locked:
            self._idle.set()

    async def _wait_for_work(self) -> None:
        while True:
            now = anyio.current_time()
            due = [o for at, o in self._held if at <= now]
            if due:
                self._held = [(at, o) for at, o in self._held if at > now]
                for outcome in due:
                    self.add(outcome)
            if self._buffer:
                return
            if self._has_items.is_set():  # woken to read the held outcomes' times again
                self._has_items = anyio.Event()
            next_at = min((at for at, _ in self._held), default=None)
            with anyio.move_on_after(None if next_at is None else next_at - now):
                await self._has_items.wait()

    async def _flush(self, batch: list[Outcome]) -> list[Outcome]:
        """Write ``batch``, one statement per kind of outcome; returns the outcomes a
        transient failure kept from being written (or rejected by the fence, or held)."""
        simple: list[Outcome] = []
        other: list[Outcome] = []
        for o in batch:
            (simple if o.state == "completed" and o.error is None else other).append(o)
        kept: list[Outcome] = []
        for group in (simple, other):
            if group:
                kept += await self._flush_group(group)
        return kept

    async def _flush_group(self, group: list[Outcome]) -> list[Outcome]:
        try:
            await self._write(group)
            return []
        except Exception as exc:
            if is_transient(exc):
                log.warning(
                    "could not write %d outcomes (%s); keeping them and retrying",
                    len(group),
                    brief(exc),
                )
                return group
            log.warning(
                "a batch of %d outcomes was refused (%s); writing them one by one",
                len(group),
                brief(exc),
            )
        for i, outcome in enumerate(group):
            try:
                await self._write_with_fallbacks(outcome)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                log.warning("could not write outcomes (%s); keeping them and retrying", brief(exc))
                return group[i:]
        return []

    async def _write_with_fallbacks(self, outcome: Outcome) -> None:
        """Write one outcome, falling back step by step; raises only transient errors."""
        error: Exception | None = None
        for form in ("as is", "again", "salvaged", "failed attempt"):
            try:
                if form == "failed attempt":
                    assert error is not None
                    await self._fail_attempt(outcome, error)
                else:
                    await self._write(
                        [_salvaged(outcome, error) if form == "salvaged" else outcome]
                    )
            except Exception as exc:
                if is_transient(exc):
                    raise
                error = exc
                continue
            if form in ("salvaged", "failed attempt"):
                self.salvaged += 1
                log.error(
                    "the outcome %s of job %d attempt %d was refused by the database (%s); "
                    "written %s instead",
                    outcome.state,
                    outcome.job_id,
                    outcome.attempt,
                    brief(error),
                    "without its result and error details"
                    if form == "salvaged"
                    else "as a failed attempt",
                )
            return
        log.error(
            "the outcome of job %d attempt %d cannot be written in any form (%s); holding it "
            "and trying again every %gs (the job stays running)",
            outcome.job_id,
            outcome.attempt,
            brief(error),
            HELD_RETRY_S,
        )
        self._held.append((anyio.current_time() + HELD_RETRY_S, outcome))
        # Held by a writer while the batching loop may be waiting without a time to wake:
        # it reads the held outcomes' times again.
        self._has_items.set()

    async def _fail_attempt(self, outcome: Outcome, exc: Exception) -> None:
        message = f"the outcome ({outcome.state}) could not be written: {brief(exc, 2000)}"
        entry = error_entry(outcome.attempt, "outcome", message)
        with anyio.fail_after(30):
            accepted = await claims.fail_attempt(
                self._pool, outcome.job_id, outcome.token, entry, async_commit=self._async_commit
            )
        self._reported([outcome] if accepted else [], [] if accepted else [outcome])

    async def _write(self, batch: list[Outcome], db: Db | None = None) -> None:
        """One statement for outcomes of one kind (plain successes, or the rest); a batch
        that meets a row locked elsewhere is written again passing over such rows, which go
        to be written on their own (``db``: a transaction that holds the one row)."""
        batch.sort(key=_BY_JOB_ID)  # a stable lock order across concurrent writers
        try:
            if db is None:
                done = await self._statement(batch, self._pool, lock_wait_ms=LOCK_WAIT_MS)
            else:
                done = await self._statement(batch, db, skip_locked=True)
        except asyncpg.LockNotAvailableError:
            done = await self._statement(batch, self._pool, skip_locked=True)
        written = done.states  # the ids the fence let through
        if len(written) == len(batch):
            self._reported(batch, [])
            return
        ok: list[Outcome] = []
        rejected: list[Outcome] = []
        locked: list[Outcome] = []
        passed_over = set(done.passed_over) if db is None else set()
        for o in batch:
            if o.job_id in written:
                ok.append(o)
            elif o.job_id in passed_over:
                locked.append(o)
            else:
                rejected.append(o)
        self._reported(ok, rejected)
        for o in locked:
            self._wait_for_row(o)

    async def _statement(
        self,
        batch: list[Outcome],
        db: Db,
        *,
        skip_locked: bool = False,
        lock_wait_ms: int | None = None,
    ) -> Written:
        with anyio.fail_after(30):
            if batch[0].state == "completed" and batch[0].error is None:
                return await claims.complete_successes(
                    db,
                    [o.job_id for o in batch],
                    [o.token for o in batch],
                    [o.result for o in batch],
                    async_commit=self._async_commit,
                    skip_locked=skip_locked,
                    lock_wait_ms=lock_wait_ms,
                )
            return await claims.write_outcomes(
                db,
                batch,
                async_commit=self._async_commit,
                skip_locked=skip_locked,
                lock_wait_ms=lock_wait_ms,
            )

    def _wait_for_row(self, outcome: Outcome) -> None:
        log.warning(
            "the outcome of job %d attempt %d waits for its row, locked by another "
            "transaction (one that enqueued a dependent of it, or acts on it, and is still "
            "open); the other outcomes go on",
            outcome.job_id,
            outcome.attempt,
        )
        self.waited_on_locks += 1
        self._locked.append(outcome)
        assert self._tg is not None
        self._tg.start_soon(self._write_alone, outcome, name=f"pgq outcome {outcome.job_id}")

    async def _write_alone(self, outcome: Outcome) -> None:
        """Write ``outcome`` once its row frees, waiting on it in a transaction of its own;
        an outcome the database refuses goes back to the batches (whose fallbacks apply)."""
        delay = 0.1
        async with self._waiters:
            while True:
                try:
                    with anyio.move_on_after(LOCK_WAIT_S):
                        async with self._pool.acquire() as conn, conn.transaction():
                            await claims.lock_job(conn, outcome.job_id)
                            await self._write([outcome], conn)
                        break
                except Exception as exc:
                    if not is_transient(exc):
                        self.add(outcome)
                        break
                    log.warning(
                        "could not write the outcome of job %d (%s); retrying",
                        outcome.job_id,
                        brief(exc),
                    )
                    await anyio.sleep(delay)
                    delay = min(delay * 2, self._retry_max_s)
        self._locked.remove(outcome)
        self._idle_if_done()

    def _reported(self, written: list[Outcome], rejected: list[Outcome]) -> None:
        for o in rejected:
            log.warning(
                "outcome %s of job %d attempt %d rejected: the job is no longer running this "
                "attempt (rescued or re-claimed elsewhere)",
                o.state,
                o.job_id,
                o.attempt,
            )
        self._report(written, rejected)


def _salvaged(outcome: Outcome, exc: Exception | None) -> Outcome:
    """``outcome`` without the payloads the database may have refused, saying why."""
    message = (
        f"the outcome ({outcome.state}) could not be written with its "
        f"{'result' if outcome.result is not None else 'error details'}: {brief(exc, 2000)}"
    )
    return dataclasses.replace(
        outcome, result=None, error=error_entry(outcome.attempt, "outcome", message)
    )


# --------------------------------------------------------------------------- in the task's transaction
# A task writing its own attempt's outcome in its own transaction (ctx.complete(connection=...)
# and the like): fenced on the attempt's token, so the effects of the transaction and the
# job's outcome commit together or not at all.


class InTransactionOutcomes:
    """Writes outcomes a task's own transaction carries; one per task of a producer. It is
    the :class:`pgq.job.Settling` a :class:`~pgq.JobContext` calls (``settle``: the public
    protocol's name for an in-transaction outcome)."""

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
        own_token = uuid.uuid4()
        with database_errors(caller=connection):
            driver = await caller_driver(connection)
            state = await claims.write_in_transaction(
                driver, outcome.job_id, outcome.token, own_token, outcome.state,
                delay_s=outcome.delay_s, error=outcome.error, result=outcome.result,
                attempt_delta=outcome.attempt_delta,
            )  # fmt: skip
        self._written(ctx, own_token, state)

    def settle_sync(self, ctx: JobContext, connection: Any, kind: str, **details: Any) -> None:
        """:meth:`settle` for plain ``def`` tasks, on a psycopg or SQLAlchemy connection."""
        from pgq._db.psycopg_drivers import caller_connection_sync

        outcome = self.outcome(ctx, kind, **details)
        own_token = uuid.uuid4()
        with database_errors(caller=connection):
            state = claims.write_in_transaction_sync(
                caller_connection_sync(connection), outcome.job_id, outcome.token,
                own_token, outcome.state, delay_s=outcome.delay_s, error=outcome.error,
                result=outcome.result, attempt_delta=outcome.attempt_delta,
            )  # fmt: skip
        self._written(ctx, own_token, state)

    @staticmethod
    def _written(ctx: JobContext, own_token: uuid.UUID, state: str | None) -> None:
        if state is None:
            raise AttemptSuperseded(ctx.job.id, ctx.job.attempt)
        if ctx._own_outcomes is None:
            ctx._own_outcomes = []
        ctx._own_outcomes.append((own_token, state))

    async def committed(self, ctx: JobContext) -> str | None:
        """The state the task's own transaction left the job in, when one that wrote it
        committed; None when none did (rolled back, or still open)."""
        if not ctx._own_outcomes:
            return None
        held = await claims.in_transaction_token(
            self._pool, ctx.job.id, [t for t, _ in ctx._own_outcomes]
        )
        return next((state for token, state in ctx._own_outcomes if token == held), None)
