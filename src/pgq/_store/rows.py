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
    """A :class:`~pgq.Job` from a row of ``sql.JOB_COLUMNS``. A row whose JSON Python cannot
    decode (written around pgq's checks) still reads: its arguments then say why, and the
    other undecodable values are empty."""
    try:
        args = _serde.loads(row["args"])
        errors = _serde.loads(row["errors"])
        metadata = _serde.loads(row["metadata"])
        result = _serde.loads(row["result"])
    except Exception as exc:  # whatever the decoder raised: say so
        args, errors, metadata, result = _undecodable(
            exc, row["errors"], row["metadata"], row["result"]
        )
    return Job(
        id=row["id"],
        queue=row["queue"],
        task=row["task"],
        args=args,
        state=STATES[row["state"]],
        priority=row["priority"],
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        scheduled_at=row["scheduled_at"],
        attempted_at=row["attempted_at"],
        finalized_at=row["finalized_at"],
        created_at=row["created_at"],
        producer_id=row["producer_id"],
        errors=errors,
        tags=list(row["tags"]),
        metadata=metadata,
        result=result,
        unique_key=row["unique_key"],
        attempt_token=row["attempt_token"],
        attempted_by=row["attempted_by"],
        limit_key=row["limit_key"],
        depends_on=row["depends_on"],
    )


def _undecodable(
    exc: Exception, errors: str | None, metadata: str | None, result: str | None
) -> tuple[Any, Any, Any, Any]:
    """A row that raised ``exc`` when decoded: arguments saying why, and of its errors,
    metadata and result what decodes (empty where it does not, or where it is NULL)."""
    return (
        _serde.undecodable(exc), _loads_or(errors, []), _loads_or(metadata, {}),
        _loads_or(result, None),
    )  # fmt: skip


def _loads_or(text: str | None, default: Any) -> Any:
    try:
        value = _serde.loads(text)
    except Exception:  # see _undecodable
        return default
    return default if value is None else value


_RUNNING = JobState.RUNNING


def jobs_from_claim(
    rows: list[Record], queue: str, producer_id: uuid.UUID, worker_name: str
) -> list[Job]:
    """The :class:`~pgq.Job` of each row of ``sql.CLAIM_COLUMNS``, claimed from ``queue`` by
    ``producer_id`` of worker ``worker_name``, read in column order (half the cost, on the
    claim's path, of reading by name). What the claim wrote from what the producer passed
    (its id and its worker's name) and the queue it claimed from are not read back, and the
    state is running. The attempt's start comes in the first row (``attempted_at``, the
    eighth column); a creation time, only where it differs from the row before; empty
    errors, tags and metadata as NULL. Its jobs share the producer's objects, one start, and
    one creation time for each run of rows that have the same, instead of holding a copy
    each while they run; each job has lists and a dict of its own."""
    jobs: list[Job] = []
    if not rows:
        return jobs
    append = jobs.append
    started: datetime | None = rows[0][7]
    created: datetime | None = None
    for row in rows:
        (
            id_, task, args, priority, attempt, max_attempts, scheduled_at, _, finalized_at,
            created_at, errors, tags, metadata, result, unique_key, attempt_token, limit_key,
            depends_on,
        ) = row  # fmt: skip
        if created_at is not None:
            created = created_at
        try:
            args_ = _loads(args)
            errors_ = [] if errors is None else _loads(errors)
            metadata_ = {} if metadata is None else _loads(metadata)
            result_ = None if result is None else _loads(result)
        except Exception as exc:  # whatever the decoder raised: say so
            # Written around pgq's own checks (by SQL, or another client): the job fails
            # with the reason instead of the claim around it; its row keeps its values.
            args_, errors_, metadata_, result_ = _undecodable(exc, errors, metadata, result)
        # Positional, in Job's field order (duplicate is False: a row read back is no
        # duplicate); errors, tags and metadata each the job's own.
        job = Job(
            id_, queue, task, args_, _RUNNING, priority, attempt, max_attempts,
            created if scheduled_at is None else scheduled_at, started, finalized_at, created,
            producer_id, errors_, [] if tags is None else tags, metadata_, result_,
            unique_key, False, attempt_token, worker_name, limit_key, depends_on,
        )  # fmt: skip
        append(job)
    return jobs
