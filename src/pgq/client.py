"""The :class:`Client`: enqueue jobs (alone, in bulk, or inside the caller's transaction)
and read them back."""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import asyncpg

from pgq import serde, sql
from pgq.app import DEFAULT_QUEUE, App, Task, check_queue_name
from pgq.app import check_task_name as _check_task_name
from pgq.db import Connection, Pool, caller_connection, check_schema, create_pool
from pgq.dsn import resolve_dsn
from pgq.errors import ConfigError, SerializationError
from pgq.job import Job, JobState
from pgq.operations import Operations, job_from_record

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

    AnyConnection = Connection | AsyncConnection | AsyncSession


@dataclass(slots=True)
class JobSpec:
    """One job for :meth:`Client.enqueue_many`. Options left as None take the task's
    defaults (when the client knows the task) or pgq's."""

    task: str | Task
    args: Mapping[str, Any] = field(default_factory=dict)
    queue: str | None = None
    priority: int | None = None
    delay: float | timedelta | None = None
    run_at: datetime | None = None
    max_attempts: int | None = None
    tags: Sequence[str] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)
    #: Jobs sharing a unique key never coexist in ``unique_states``.
    unique_key: str | None = None
    #: Derive ``unique_key`` from the task, queue and args (within ``unique_period`` seconds).
    unique: bool = False
    unique_period: float | None = None
    #: States the key is unique across; default: all but completed, discarded, cancelled.
    unique_states: Sequence[JobState | str] | None = None


DEFAULT_UNIQUE_STATES = (
    JobState.SCHEDULED,
    JobState.AVAILABLE,
    JobState.RUNNING,
    JobState.RETRYABLE,
)
_STATE_BITS = {state: 1 << i for i, state in enumerate(JobState)}


def unique_mask(states: Iterable[JobState | str]) -> int:
    """The bit mask (as the unique index reads it) of ``states``."""
    mask = 0
    for state in states:
        try:
            mask |= _STATE_BITS[JobState(state)]
        except ValueError:
            raise ConfigError(
                f"unknown job state {state!r} in unique_states; states are "
                + ", ".join(s.value for s in JobState)
            ) from None
    if not mask:
        raise ConfigError("unique_states must name at least one state")
    return mask


def derive_unique_key(
    task: str, queue: str, args_json: str, period_s: float | None, now: float | None = None
) -> str:
    """A key from what makes two jobs the same: task, queue and args (and the time bucket
    of ``period_s`` seconds, on this machine's clock, when given)."""
    digest = hashlib.sha256(f"{task}\0{queue}\0{args_json}".encode()).hexdigest()[:40]
    if period_s is None:
        return f"pgq:{task}:{digest}"
    if period_s <= 0:
        raise ConfigError("unique_period must be a positive number of seconds")
    bucket = int((time.time() if now is None else now) // period_s)
    return f"pgq:{task}:{digest}:{period_s:g}:{bucket}"


class Client(Operations):
    """Enqueues jobs and reads them. Use as ``async with pgq.Client(dsn) as client``, or
    pass ``pool=`` an asyncpg pool you own (the client then never closes it).

    Given ``app=``, the client checks task names and uses each task's queue, priority and
    max_attempts as defaults; without it, any valid task name is accepted.
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        pool: Pool | None = None,
        app: App | None = None,
        check_schema: bool = True,
    ) -> None:
        self._dsn = resolve_dsn(dsn) if pool is None else None
        self._pool = pool
        self._owns_pool = pool is None
        self._app = app
        self._check_schema = check_schema

    async def open(self) -> None:
        """Open the pool (unless one was given) and check the schema revision."""
        if self._pool is None:
            self._pool = await create_pool(self._dsn, min_size=1, max_size=10)
        if self._check_schema:
            try:
                async with self._pool.acquire() as conn:
                    await check_schema(conn)
            except BaseException:
                await self.close()
                raise

    async def close(self) -> None:
        """Close the pool if this client opened it (and the LISTEN connection of wait())."""
        await self._close_waiters()
        if self._pool is not None and self._owns_pool:
            await self._pool.close()
            self._pool = None

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    @property
    def pool(self) -> Pool:
        """The asyncpg pool in use."""
        if self._pool is None:
            raise ConfigError("the client is not open: use `async with pgq.Client(...)`")
        return self._pool

    # ------------------------------------------------------------------ enqueue

    async def enqueue(
        self,
        task: str | Task,
        args: Mapping[str, Any] | None = None,
        *,
        queue: str | None = None,
        priority: int | None = None,
        delay: float | timedelta | None = None,
        run_at: datetime | None = None,
        max_attempts: int | None = None,
        tags: Sequence[str] = (),
        metadata: Mapping[str, Any] | None = None,
        unique_key: str | None = None,
        unique: bool = False,
        unique_period: float | None = None,
        unique_states: Sequence[JobState | str] | None = None,
        connection: AnyConnection | None = None,
    ) -> Job:
        """Enqueue one job and return it. ``delay`` (seconds) or ``run_at`` schedules it.

        With ``connection=`` the job is written in that connection's transaction: it exists,
        and wakes workers, only if the caller commits.

        With ``unique_key`` (or ``unique=True``, which derives the key from task, queue and
        args, per ``unique_period`` seconds when given), a job whose key is already held by
        a job in ``unique_states`` is not enqueued: the existing job is returned with
        ``duplicate=True``.
        """
        spec = JobSpec(
            task,
            args or {},
            queue,
            priority,
            delay,
            run_at,
            max_attempts,
            tags,
            metadata or {},
            unique_key,
            unique,
            unique_period,
            unique_states,
        )
        (job,) = await self.enqueue_many([spec], connection=connection)
        return job

    async def enqueue_many(
        self, specs: Iterable[JobSpec], *, connection: AnyConnection | None = None
    ) -> list[Job]:
        """Enqueue many jobs in one round trip; returns them in the order given.

        Every spec is checked and serialized before anything is written: one bad spec
        raises and none are enqueued. A spec whose unique key is taken comes back as the
        job holding the key, with ``duplicate=True``.
        """
        rows = [self._row(i, spec) for i, spec in enumerate(specs)]
        if not rows:
            return []
        try:
            if connection is not None:
                return await self._insert(await caller_connection(connection), rows)
            async with self.pool.acquire() as conn:
                if len(rows) > 1 and all(r.unique_key is None for r in rows):
                    return await self._copy(conn, rows)
                return await self._insert(conn, rows)
        except asyncpg.ProgramLimitExceededError as exc:
            # jsonb limits that a JSON text under serde.MAX_JSON_BYTES can still exceed (a huge
            # array of small numbers takes more room in jsonb than as text).
            largest = max(range(len(rows)), key=lambda i: len(rows[i].args_json))
            raise SerializationError(
                f"{_where(largest)}args of task {rows[largest].task!r} are "
                f"{len(rows[largest].args_json.encode()):,} bytes of JSON, more than PostgreSQL "
                f"can store ({str(exc).splitlines()[0][:200]}); nothing was enqueued: store "
                "large data elsewhere and pass a reference",
                "args",
            ) from exc

    async def _copy(self, conn: Connection, rows: list[_Row]) -> list[Job]:
        """Write keyless rows with COPY, on pgq's own connection (whose jsonb codec COPY's
        binary format relies on: a caller's connection may have registered another)."""
        due: dict[str, datetime | None] = {}  # per queue, its earliest job; None: due now
        plain = True  # every job due now, without tags or metadata: columns keep defaults
        for r in rows:
            if r.run_at is None and not r.delay_s:
                due[r.queue] = None
                if r.tags or r.metadata:
                    plain = False
                continue
            plain = False
            if r.run_at is not None:
                earliest = due.get(r.queue, r.run_at)
                if earliest is not None:
                    due[r.queue] = min(earliest, r.run_at)
        async with conn.transaction():
            allocated = await conn.fetchrow(
                sql.ALLOCATE_JOBS, len(rows), list(due), list(due.values())
            )
            assert allocated is not None
            ids, now = allocated["ids"], allocated["now"]
            jobs: list[Job] = []
            records: list[tuple[Any, ...]] = []
            for job_id, r in zip(ids, rows, strict=True):
                if r.run_at is not None:
                    scheduled_at = r.run_at
                elif r.delay_s:
                    scheduled_at = now + timedelta(seconds=r.delay_s)
                else:
                    scheduled_at = now
                state = JobState.SCHEDULED if scheduled_at > now else JobState.AVAILABLE
                if plain:
                    records.append(
                        (job_id, r.queue, r.task, r.args_json, r.priority, r.max_attempts)
                    )
                else:
                    records.append(
                        (
                            job_id,
                            r.queue,
                            r.task,
                            r.args_json,
                            r.priority,
                            r.max_attempts,
                            state.value,
                            scheduled_at,
                            r.tags,
                            r.metadata_json,
                        )
                    )
                # Positional, in Job's field order: half the cost of keywords, per job.
                jobs.append(
                    Job(
                        job_id,
                        r.queue,
                        r.task,
                        r.args,
                        state,
                        r.priority,
                        0,  # attempt
                        r.max_attempts,
                        scheduled_at,
                        None,  # attempted_at
                        None,  # finalized_at
                        now,  # created_at
                        None,  # producer_id
                        [],  # errors
                        r.tags,
                        r.metadata,
                    )
                )
            await conn.copy_records_to_table(
                sql.COPY_JOBS_TABLE,
                records=records,
                columns=sql.COPY_JOBS_COLUMNS[: 6 if plain else None],
            )
        return jobs

    async def _insert(self, conn: Connection, rows: list[_Row]) -> list[Job]:
        if len(rows) == 1:
            result = await conn.fetch(sql.ENQUEUE_ONE, *rows[0].values())
        else:
            columns = [list(col) for col in zip(*(r.values() for r in rows), strict=True)]
            keyed = any(r.unique_key is not None for r in rows)
            result = await conn.fetch(sql.ENQUEUE if keyed else sql.ENQUEUE_PLAIN, *columns)
        inserted = iter(result)
        inserted_keys = {r[4] for r in result if r[4] is not None}
        claimed: set[str] = set()
        jobs: list[Job | None] = []
        duplicates: list[tuple[int, str]] = []
        for i, row in enumerate(rows):
            key = row.unique_key
            # Inserted rows come back in input order (ids follow it); a key's first holder
            # in this batch is the one inserted, the rest are duplicates.
            if key is not None and (key in claimed or key not in inserted_keys):
                duplicates.append((i, key))
                jobs.append(None)
                continue
            if key is not None:
                claimed.add(key)
            rec = next(inserted)
            jobs.append(
                Job(
                    id=rec[0],
                    queue=row.queue,
                    task=row.task,
                    args=row.args,
                    state=JobState(rec[1]),
                    priority=row.priority,
                    max_attempts=row.max_attempts,
                    scheduled_at=rec[2],
                    created_at=rec[3],
                    tags=row.tags,
                    metadata=row.metadata,
                    unique_key=key,
                )
            )
        if duplicates:
            existing = {
                r["unique_key"]: r
                for r in await conn.fetch(sql.EXISTING_UNIQUE, [k for _, k in duplicates])
            }
            for i, key in duplicates:
                held = existing.get(key)
                if held is not None:
                    job = job_from_record(held)
                    job.duplicate = True
                    jobs[i] = job
                else:
                    # The holder finished (and left the unique states) between our insert
                    # and this read: report the key as skipped with what we know.
                    jobs[i] = self._skipped(rows[i], key)
        return [j for j in jobs if j is not None]

    @staticmethod
    def _skipped(row: _Row, key: str) -> Job:
        return Job(
            id=0,
            queue=row.queue,
            task=row.task,
            args=row.args,
            state=JobState.COMPLETED,
            metadata=row.metadata,
            unique_key=key,
            duplicate=True,
        )

    def _row(self, index: int, spec: JobSpec) -> _Row:
        # Runs once per job of a batch: the common case (a registered task, no options)
        # takes the fewest steps; every check still runs.
        task = spec.task
        if type(task) is Task:
            defaults: Task | None = task
            name = task.name
        else:
            name = _check_task_name(task)
            defaults = self._app.get(name) if self._app is not None else None
        if spec.queue is not None:
            queue = check_queue_name(spec.queue)
        else:
            queue = defaults.queue if defaults else DEFAULT_QUEUE
        priority = spec.priority
        if priority is None:
            priority = defaults.priority if defaults else 0
        elif type(priority) is not int or not _INT4_MIN <= priority <= _INT4_MAX:
            raise ConfigError(
                f"{_where(index)}priority must be an integer from {_INT4_MIN} to {_INT4_MAX}, "
                f"got {priority!r}"
            )
        max_attempts = spec.max_attempts
        if max_attempts is None and defaults:
            max_attempts = defaults.max_attempts
        if max_attempts is not None and (
            type(max_attempts) is not int or not 1 <= max_attempts <= _INT4_MAX
        ):
            raise ConfigError(
                f"{_where(index)}max_attempts must be an integer from 1 to {_INT4_MAX}, "
                f"got {max_attempts!r}"
            )
        args = spec.args
        if type(args) is not dict:
            if not isinstance(args, Mapping):
                raise SerializationError(
                    f"{_where(index)}args must be a mapping of keyword arguments, not "
                    f"{type(args).__name__}",
                    "args",
                )
            args = dict(args)
        for key in args:
            if type(key) is not str and not isinstance(key, str):
                raise SerializationError(f"{_where(index)}args keys must be strings", "args")
        args_json = serde.dumps(args, "args")
        delay_s: float | None = None
        if spec.delay is not None:
            if spec.run_at is not None:
                raise ConfigError(f"{_where(index)}give delay or run_at, not both")
            delay_s = _delay_seconds(spec.delay, name, index)
        elif spec.run_at is not None:
            _check_run_at(spec.run_at, name, index)
        tags: list[str] = []
        if spec.tags:
            if isinstance(spec.tags, str) or not all(isinstance(t, str) for t in spec.tags):
                raise ConfigError(f"{_where(index)}tags must be a list of strings")
            tags = list(spec.tags)
        if spec.metadata:
            metadata = dict(spec.metadata)
            metadata_json = serde.dumps(metadata, "metadata")
        else:
            metadata, metadata_json = {}, "{}"
        unique_key = spec.unique_key
        states = None
        if unique_key is None and spec.unique:
            canonical = json.dumps(args, sort_keys=True, separators=(",", ":"))
            unique_key = derive_unique_key(name, queue, canonical, spec.unique_period)
        elif unique_key is not None and not isinstance(unique_key, str):
            raise ConfigError(f"{_where(index)}unique_key must be a string")
        if unique_key is not None:
            states = unique_mask(spec.unique_states or DEFAULT_UNIQUE_STATES)
        return _Row(
            queue,
            name,
            args,
            args_json,
            priority,
            max_attempts,
            spec.run_at,
            delay_s,
            tags,
            metadata,
            metadata_json,
            unique_key,
            states,
        )


_INT4_MIN, _INT4_MAX = -(2**31), 2**31 - 1  # the range of the integer columns
# The latest time both Python and PostgreSQL can hold (PostgreSQL goes on to 294276 AD; a
# row past Python's year 9999 could be written but not read back). A day is kept in hand
# for the distance between this machine's clock and the database's.
_LATEST = datetime.max.replace(tzinfo=UTC) - timedelta(days=1)


def _delay_seconds(delay: float | timedelta, task: str, index: int) -> float:
    """``delay`` as seconds from now, checked: a negative delay means now."""
    try:
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
    except (TypeError, ValueError):
        raise ConfigError(
            f"{_where(index)}delay for task {task!r} must be a number of seconds or a "
            f"timedelta, got {delay!r}"
        ) from None
    if not math.isfinite(seconds) or seconds > (_LATEST - datetime.now(UTC)).total_seconds():
        raise ConfigError(
            f"{_where(index)}delay={delay!r} for task {task!r} is out of range: the job "
            f"must be due before {_LATEST:%Y-%m-%d}; nothing was enqueued"
        )
    return max(seconds, 0.0)


def _check_run_at(run_at: datetime, task: str, index: int) -> None:
    if not isinstance(run_at, datetime):
        raise ConfigError(
            f"{_where(index)}run_at for task {task!r} must be a datetime, got {run_at!r}"
        )
    if run_at.tzinfo is None:
        raise ConfigError(
            f"{_where(index)}run_at for task {task!r} must be timezone-aware "
            "(e.g. datetime.now(UTC))"
        )
    try:
        in_range = run_at.astimezone(UTC) <= _LATEST
    except OverflowError:
        in_range = False
    if not in_range:
        raise ConfigError(
            f"{_where(index)}run_at={run_at.isoformat()} for task {task!r} is out of range: "
            f"the job must be due before {_LATEST:%Y-%m-%d}; nothing was enqueued"
        )


def _where(index: int) -> str:
    """How an error names the spec at ``index`` of a batch (the first needs no name)."""
    return f"job {index}: " if index else ""


@dataclass(slots=True)
class _Row:
    """One spec, checked and serialized: what every enqueue path writes."""

    queue: str
    task: str
    args: dict[str, Any]
    args_json: str
    priority: int
    max_attempts: int | None
    run_at: datetime | None
    delay_s: float | None
    tags: list[str]
    metadata: dict[str, Any]
    metadata_json: str
    unique_key: str | None
    unique_states: int | None

    def values(self) -> tuple[Any, ...]:
        """The parameters of one row of ENQUEUE / ENQUEUE_ONE (tags as JSON text: SQL
        arrays of arrays cannot be ragged)."""
        return (
            self.queue,
            self.task,
            self.args_json,
            self.priority,
            self.max_attempts,
            self.run_at,
            self.delay_s,
            serde.dumps(self.tags, "tags") if self.tags else "[]",
            self.metadata_json,
            self.unique_key,
            self.unique_states,
        )
