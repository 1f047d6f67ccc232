"""Rows into jobs: from a job row of ``sql.JOB_COLUMNS`` to :class:`~pgq.Job`.

Every statement that returns whole jobs (reads, unique-key lookups) returns
``sql.JOB_COLUMNS``, mapped by column name (asyncpg records or psycopg's dict rows). The
claim, on the hot path, returns ``sql.CLAIM_COLUMNS`` (less what the claiming producer
knows), read by position; a test holds the two equal."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any, TypeAlias

from pgq import _serde
from pgq._store.connections import Record
from pgq.job import STATES, Job, JobState

_loads = _serde.loads

#: A row read by column name: an asyncpg Record, or a dict (psycopg's dict_row).
RowLike: TypeAlias = Record | Mapping[str, Any]


def job_from_row(row: RowLike) -> Job:
    """A :class:`~pgq.Job` from a row of ``sql.JOB_COLUMNS``."""
    return Job(
        id=row["id"],
        queue=row["queue"],
        task=row["task"],
        args=_serde.loads(row["args"]),
        state=STATES[row["state"]],
        priority=row["priority"],
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        scheduled_at=row["scheduled_at"],
        attempted_at=row["attempted_at"],
        finalized_at=row["finalized_at"],
        created_at=row["created_at"],
        producer_id=row["producer_id"],
        errors=_serde.loads(row["errors"]),
        tags=list(row["tags"]),
        metadata=_serde.loads(row["metadata"]),
        result=_serde.loads(row["result"]),
        unique_key=row["unique_key"],
        attempt_token=row["attempt_token"],
        attempted_by=row["attempted_by"],
        limit_key=row["limit_key"],
        depends_on=row["depends_on"],
    )


_RUNNING = JobState.RUNNING


def job_from_claim(
    row: Record, started: datetime | None, producer_id: uuid.UUID, worker_name: str
) -> Job:
    """The :class:`~pgq.Job` of a row of ``sql.CLAIM_COLUMNS``, claimed by ``producer_id`` of
    worker ``worker_name`` at ``started`` (the attempt's start, which the claim's first row
    carries for all), read in column order (half the cost, on the claim's path, of reading by
    name). What the claim wrote from what the producer passed (its id and its worker's name)
    is not read back, and the state is running: its jobs share the producer's objects, and
    one start and (when due at creation) one creation time, instead of holding a copy each
    while they run."""
    (
        id_, queue, task, args, priority, attempt, max_attempts, scheduled_at, _, finalized_at,
        created_at, errors, tags, metadata, result, unique_key, attempt_token, limit_key,
        depends_on,
    ) = row  # fmt: skip
    # Positional, in Job's field order (duplicate is False: a row read back is no duplicate);
    # tags as asyncpg decoded them, a list of the job's own.
    return Job(
        id_, queue, task, _loads(args), _RUNNING, priority, attempt, max_attempts,
        created_at if scheduled_at is None else scheduled_at, started, finalized_at, created_at,
        producer_id, [] if errors == "[]" else _loads(errors), tags,
        {} if metadata == "{}" else _loads(metadata), None if result is None else _loads(result),
        unique_key, False, attempt_token, worker_name, limit_key, depends_on,
    )  # fmt: skip
