"""Rows and jobs, in one place: every :class:`~pgq.Job` the store returns is built here.

:data:`FIELDS` is the column list of a whole job: Job's fields, in order. Statements that
return whole jobs (reads, unique-key lookups: see ``JOB_STATEMENTS``) name their columns
after it (all but ``duplicate``, which no row holds), and :func:`job_from_row` maps them by name (asyncpg records or
psycopg's dict rows). Where a path builds many jobs (the claim, an enqueue), the job is made
positionally, half the cost of keywords, by a constructor generated from :data:`FIELDS` and
a mapping of each field to its value (:func:`_constructor`): never a hand-written list of
23 arguments that a new field would shift. The claim, on the hot path, returns fewer
columns (less what the claiming producer knows), read by position; a test holds the job it
makes equal to a read by id."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

from pgq._core import serde
from pgq._core.specs import NewJob
from pgq._db.connections import Record
from pgq.job import STATES, Job, JobState

_loads = serde.loads

#: A row read by column name: an asyncpg Record, or a dict (psycopg's dict_row).
RowLike: TypeAlias = Record | Mapping[str, Any]

#: Job's fields, in order: the columns of a whole job.
FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Job))

#: The statements that return whole jobs, read by :func:`job_from_row` (a test holds their
#: columns to :data:`FIELDS`).
JOB_STATEMENTS = ("GET_JOB", "LIST_JOBS", "JOBS_ATTEMPTED_SINCE", "PARENT_JOBS",
                  "EXISTING_UNIQUE", "JOBS_PAGE")  # fmt: skip


def _arguments(name: str, values: Mapping[str, str]) -> str:
    """``Job``'s arguments by position, in :data:`FIELDS` order, each the expression
    ``values`` names for its field (every field: a new one must be given a value here, not
    silently shifted)."""
    if set(values) != set(FIELDS):
        raise TypeError("a Job constructor must give every field", name, set(values) ^ set(FIELDS))
    return ", ".join(values[f] for f in FIELDS)


def _generated(name: str, source: str, **names: Any) -> Any:
    """The function ``name`` that ``source`` defines, compiled once (at import), with
    ``Job``, ``RUNNING`` and ``names`` in its globals."""
    namespace: dict[str, Any] = {"Job": Job, "RUNNING": JobState.RUNNING, **names}
    exec(source, namespace)  # only this module's constants, compiled at import
    return namespace[name]


def _constructor(name: str, params: str, values: Mapping[str, str]) -> Callable[..., Job]:
    """A function ``name(params)`` returning the ``Job`` of ``values`` (see
    :func:`_arguments`)."""
    source = "def " + name + "(" + params + "):\n    return Job(" + _arguments(name, values) + ")\n"
    constructor: Callable[..., Job] = _generated(name, source)
    return constructor


#: ``enqueued(r, job_id, state, scheduled_at, created_at)``: the job the :class:`NewJob`
#: ``r`` became, stored under ``job_id``; nothing attempted yet.
enqueued = _constructor(
    "enqueued",
    "r, job_id, state, scheduled_at, created_at",
    {
        "id": "job_id", "queue": "r.queue", "task": "r.task", "args": "r.args",
        "state": "state", "priority": "r.priority", "attempt": "0",
        "max_attempts": "r.max_attempts", "scheduled_at": "scheduled_at",
        "attempted_at": "None", "finalized_at": "None", "created_at": "created_at",
        "producer_id": "None", "errors": "[]", "tags": "r.tags", "metadata": "r.metadata",
        "result": "None", "unique_key": "r.unique_key", "duplicate": "False",
        "attempt_token": "None", "attempted_by": "None", "limit_key": "r.limit_key",
        "depends_on": "None if r.depends_on is None else list(r.depends_on)",
    },
)  # fmt: skip

#: ``copied_plain(rows, ids, now)``: the jobs of a plain batch (see enqueue.copy_plan),
#: each :class:`NewJob` of ``rows`` copied under its id of ``ids`` at ``now``: available,
#: without a key, a limit key or parents. One generated comprehension: a function call
#: per job would cost as much as a twentieth of the batch's enqueue.
copied_plain: Callable[..., list[Job]] = _generated(
    "copied_plain",
    "def copied_plain(rows, ids, now):\n    return [Job("
    + _arguments(
        "copied_plain",
        {
            "id": "job_id", "queue": "r.queue", "task": "r.task", "args": "r.args",
            "state": "AVAILABLE", "priority": "r.priority", "attempt": "0",
            "max_attempts": "r.max_attempts", "scheduled_at": "now", "attempted_at": "None",
            "finalized_at": "None", "created_at": "now", "producer_id": "None",
            "errors": "[]", "tags": "r.tags", "metadata": "r.metadata", "result": "None",
            "unique_key": "None", "duplicate": "False", "attempt_token": "None",
            "attempted_by": "None", "limit_key": "None", "depends_on": "None",
        },
    )
    + ") for job_id, r in zip(ids, rows, strict=True)]\n",
    AVAILABLE=JobState.AVAILABLE,
)  # fmt: skip


def vanished_holder(
    row: NewJob, unique_key: str | None, metadata: dict[str, Any] | None = None
) -> Job:
    """The job reported for ``row`` whose unique key was taken by a job that finished (and
    left the unique states) before it could be read: a duplicate, with what we know (its
    ``metadata``, the row's unless given)."""
    return Job(
        0, row.queue, row.task, row.args, JobState.COMPLETED,
        metadata=row.metadata if metadata is None else metadata, unique_key=unique_key,
        duplicate=True,
    )  # fmt: skip


def job_from_row(row: RowLike) -> Job:
    """A :class:`~pgq.Job` from a row of a whole job (``JOB_STATEMENTS``). A row whose JSON Python cannot
    decode (written around pgq's checks) still reads: its arguments then say why, and the
    other undecodable values are empty."""
    try:
        args = serde.loads(row["args"])
        errors = serde.loads(row["errors"])
        metadata = serde.loads(row["metadata"])
        result = serde.loads(row["result"])
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
        serde.undecodable(exc), _loads_or(errors, []), _loads_or(metadata, {}),
        _loads_or(result, None),
    )  # fmt: skip


def _loads_or(text: str | None, default: Any) -> Any:
    try:
        value = serde.loads(text)
    except Exception:  # see _undecodable
        return default
    return default if value is None else value


#: The claim's columns, in order (CLAIM_JOBS and its siblings return them; a test holds
#: them equal): what a whole job has, less what the claiming producer knows, and
#: ``attempted_at`` in the first row only.
CLAIM_COLUMNS: tuple[str, ...] = (
    "id", "task", "args", "priority", "attempt", "max_attempts", "scheduled_at",
    "attempted_at", "finalized_at", "created_at", "errors", "tags", "metadata", "result",
    "unique_key", "attempt_token", "limit_key", "depends_on",
)  # fmt: skip

#: The claimed job's fields, from the claim's columns (by name, decoded: ``args_`` and the
#: like) and what the producer knows.
_CLAIMED = {
    "id": "id", "queue": "queue", "task": "task", "args": "args_", "state": "RUNNING",
    "priority": "priority", "attempt": "attempt", "max_attempts": "max_attempts",
    "scheduled_at": "created if scheduled_at is None else scheduled_at",
    "attempted_at": "started", "finalized_at": "finalized_at", "created_at": "created",
    "producer_id": "producer_id", "errors": "errors_", "tags": "[] if tags is None else tags",
    "metadata": "metadata_", "result": "result_", "unique_key": "unique_key",
    "duplicate": "False", "attempt_token": "attempt_token", "attempted_by": "worker_name",
    "limit_key": "limit_key", "depends_on": "depends_on",
}  # fmt: skip

# The loop of jobs_from_claim: each row unpacked in CLAIM_COLUMNS order, each job made
# positionally in FIELDS order (generated: no hand-kept list of either).
_CLAIM_LOOP = """
def claimed(rows, queue, producer_id, worker_name, started):
    jobs = []
    append = jobs.append
    created = None
    for row in rows:
        {columns} = row
        if created_at is not None:
            created = created_at
        try:
            args_ = loads(args)
            errors_ = [] if errors is None else loads(errors)
            metadata_ = {{}} if metadata is None else loads(metadata)
            result_ = None if result is None else loads(result)
        except Exception as exc:
            args_, errors_, metadata_, result_ = undecodable(exc, errors, metadata, result)
        append(Job({job}))
    return jobs
"""


def jobs_from_claim(
    rows: list[Record], queue: str, producer_id: uuid.UUID, worker_name: str
) -> list[Job]:
    """The :class:`~pgq.Job` of each row of the claim's columns, claimed from ``queue`` by
    ``producer_id`` of worker ``worker_name``, read in column order (half the cost, on the
    claim's path, of reading by name). What the claim wrote from what the producer passed
    (its id and its worker's name) and the queue it claimed from are not read back, and the
    state is running. The attempt's start comes in the first row (``attempted_at``, the
    eighth column); a creation time, only where it differs from the row before; empty
    errors, tags and metadata as NULL. Its jobs share the producer's objects, one start, and
    one creation time for each run of rows that have the same, instead of holding a copy
    each while they run; each job has lists and a dict of its own."""
    if not rows:
        return []
    # A row whose JSON does not decode (written around pgq's own checks, by SQL or another
    # client) fails its job with the reason, not the claim around it; its row keeps its
    # values.
    return _claim_rows(rows, queue, producer_id, worker_name, rows[0][_STARTED])


_STARTED = CLAIM_COLUMNS.index("attempted_at")
_claim_rows: Callable[..., list[Job]] = _generated(
    "claimed",
    _CLAIM_LOOP.format(
        columns=", ".join("_" if c == "attempted_at" else c for c in CLAIM_COLUMNS),
        job=_arguments("claimed", _CLAIMED),
    ),
    loads=_loads,
    undecodable=_undecodable,
)
