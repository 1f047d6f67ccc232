"""The :class:`Client`: enqueue jobs (alone, in bulk, or inside the caller's transaction)
and read them back."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from pgq import serde, sql
from pgq.app import DEFAULT_QUEUE, App, Task, check_queue_name
from pgq.app import check_task_name as _check_task_name
from pgq.db import Connection, Pool, caller_connection, check_schema, create_pool
from pgq.dsn import resolve_dsn
from pgq.errors import ConfigError, SerializationError
from pgq.job import Job, JobState

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


class Client:
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
        """Close the pool if this client opened it."""
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
        connection: AnyConnection | None = None,
    ) -> Job:
        """Enqueue one job and return it. ``delay`` (seconds) or ``run_at`` schedules it.

        With ``connection=`` the job is written in that connection's transaction: it exists,
        and wakes workers, only if the caller commits.
        """
        spec = JobSpec(
            task, args or {}, queue, priority, delay, run_at, max_attempts, tags, metadata or {}
        )
        (job,) = await self.enqueue_many([spec], connection=connection)
        return job

    async def enqueue_many(
        self, specs: Iterable[JobSpec], *, connection: AnyConnection | None = None
    ) -> list[Job]:
        """Enqueue many jobs in one round trip; returns them in the order given.

        Every spec is checked and serialized before anything is written: one bad spec
        raises and none are enqueued.
        """
        rows = [self._row(i, spec) for i, spec in enumerate(specs)]
        if not rows:
            return []
        columns = [list(col) for col in zip(*(r[0] for r in rows), strict=True)]
        if connection is not None:
            conn = await caller_connection(connection)
            result = await conn.fetch(sql.ENQUEUE, *columns)
        else:
            async with self.pool.acquire() as conn:
                result = await conn.fetch(sql.ENQUEUE, *columns)
        jobs = []
        for (values, args, metadata), rec in zip(rows, result, strict=True):
            queue, task, _, priority, max_attempts, _, _, _, _ = values
            jobs.append(
                Job(
                    id=rec[0],
                    queue=queue,
                    task=task,
                    args=args,
                    state=JobState(rec[1]),
                    priority=priority,
                    max_attempts=max_attempts,
                    scheduled_at=rec[2],
                    created_at=rec[3],
                    tags=list(json_tags(values[7])),
                    metadata=metadata,
                )
            )
        return jobs

    def _row(
        self, index: int, spec: JobSpec
    ) -> tuple[tuple[Any, ...], dict[str, Any], dict[str, Any]]:
        where = f"job {index}: " if index else ""
        task = spec.task
        if isinstance(task, Task):
            defaults: Task | None = task
            name = task.name
        else:
            name = _check_task_name(task)
            defaults = self._app.get(name) if self._app is not None else None
        if spec.queue is not None:
            queue = check_queue_name(spec.queue)
        else:
            queue = defaults.queue if defaults else DEFAULT_QUEUE
        priority = (
            spec.priority if spec.priority is not None else (defaults.priority if defaults else 0)
        )
        max_attempts = (
            spec.max_attempts
            if spec.max_attempts is not None
            else (defaults.max_attempts if defaults else None)
        )
        if max_attempts is not None and max_attempts < 1:
            raise ConfigError(f"{where}max_attempts must be at least 1, got {max_attempts}")
        if not isinstance(spec.args, Mapping):
            raise SerializationError(
                f"{where}args must be a mapping of keyword arguments, not "
                f"{type(spec.args).__name__}",
                "args",
            )
        if any(not isinstance(k, str) for k in spec.args):
            raise SerializationError(f"{where}args keys must be strings", "args")
        if spec.delay is not None and spec.run_at is not None:
            raise ConfigError(f"{where}give delay or run_at, not both")
        delay_s: float | None = None
        if spec.delay is not None:
            delay_s = (
                spec.delay.total_seconds()
                if isinstance(spec.delay, timedelta)
                else float(spec.delay)
            )
            if not delay_s >= 0:
                raise ConfigError(f"{where}delay must be zero or more seconds, got {spec.delay!r}")
        if spec.run_at is not None and spec.run_at.tzinfo is None:
            raise ConfigError(f"{where}run_at must be timezone-aware (e.g. datetime.now(UTC))")
        if isinstance(spec.tags, str) or not all(isinstance(t, str) for t in spec.tags):
            raise ConfigError(f"{where}tags must be a list of strings")
        args = dict(spec.args)
        metadata = dict(spec.metadata)
        values = (
            queue,
            name,
            serde.dumps(args, "args"),
            priority,
            max_attempts,
            spec.run_at,
            delay_s,
            serde.dumps(list(spec.tags), "tags"),
            serde.dumps(metadata, "metadata"),
        )
        return values, args, metadata

    # ------------------------------------------------------------------ reads

    async def get_job(self, job_id: int, *, connection: AnyConnection | None = None) -> Job | None:
        """The job with ``job_id``, or None."""
        if connection is not None:
            rec = await (await caller_connection(connection)).fetchrow(sql.GET_JOB, job_id)
        else:
            async with self.pool.acquire() as conn:
                rec = await conn.fetchrow(sql.GET_JOB, job_id)
        return None if rec is None else job_from_record(rec)

    async def count_by_state(self, queue: str | None = None) -> dict[JobState, int]:
        """How many jobs are in each state (all queues, or one)."""
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(sql.COUNT_BY_STATE, queue)
        counts = dict.fromkeys(JobState, 0)
        counts.update({JobState(r[0]): r[1] for r in rows})
        return counts


def json_tags(text: str) -> list[str]:
    """Tags as sent (JSON text) back to a list."""
    value = serde.loads(text)
    assert isinstance(value, list)
    return [str(v) for v in value]


def job_from_record(rec: Any) -> Job:
    """A full :class:`Job` from a ``sql.GET_JOB``-shaped row."""
    producer = rec["producer_id"]
    return Job(
        id=rec["id"],
        queue=rec["queue"],
        task=rec["task"],
        args=serde.loads(rec["args"]),
        state=JobState(rec["state"]),
        priority=rec["priority"],
        attempt=rec["attempt"],
        max_attempts=rec["max_attempts"],
        scheduled_at=rec["scheduled_at"],
        attempted_at=rec["attempted_at"],
        finalized_at=rec["finalized_at"],
        created_at=rec["created_at"],
        producer_id=uuid.UUID(str(producer)) if producer is not None else None,
        errors=serde.loads(rec["errors"]),
        tags=list(rec["tags"]),
        metadata=serde.loads(rec["metadata"]),
        result=serde.loads(rec["result"]),
    )
