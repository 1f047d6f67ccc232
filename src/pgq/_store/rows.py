"""Rows into jobs: from a job row of ``sql.JOB_COLUMNS`` to :class:`~pgq.Job`.

Every statement that returns whole jobs (reads, claims, unique-key lookups) returns
``sql.JOB_COLUMNS``: reads map it by column name (asyncpg records or psycopg's dict rows),
the claim, on the hot path, by position (asyncpg records); a test holds the two equal."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, TypeAlias

from pgq import _serde
from pgq._store.connections import Record
from pgq.job import STATES, Job

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


def job_from_record(row: Record, claimed_by: uuid.UUID | None = None) -> Job:
    """:func:`job_from_row` for an asyncpg ``Record`` of ``sql.JOB_COLUMNS``, read in
    column order (half the cost, on the claim's path, of reading 22 columns by name).

    A claim passes its producer's id as ``claimed_by`` (the id its rows were written with):
    its jobs then share that one object instead of holding a copy each while they run."""
    (
        id_, queue, task, args, state, priority, attempt, max_attempts, scheduled_at,
        attempted_at, finalized_at, created_at, producer_id, errors, tags, metadata, result,
        unique_key, attempt_token, attempted_by, limit_key, depends_on,
    ) = row  # fmt: skip
    # Positional, in Job's field order (duplicate is False: a row read back is no duplicate);
    # tags as asyncpg decoded them, a list of the job's own.
    return Job(
        id_, queue, task, _loads(args), STATES[state], priority, attempt, max_attempts,
        scheduled_at, attempted_at, finalized_at, created_at, claimed_by or producer_id,
        [] if errors == "[]" else _loads(errors), tags,
        {} if metadata == "{}" else _loads(metadata), None if result is None else _loads(result),
        unique_key, False, attempt_token, attempted_by, limit_key, depends_on,
    )  # fmt: skip
