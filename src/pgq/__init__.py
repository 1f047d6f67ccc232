"""pgq: a PostgreSQL-backed job queue for asyncio services.

Jobs live in Postgres; workers claim them with ``FOR UPDATE SKIP LOCKED``; producers
heartbeat on the database clock, and the elected leader rescues the jobs of producers that
went silent. See ``docs/`` for the guide.

Every public name is here. Modules whose names start with ``_`` are internals that may
change without notice; ``pgq.migrate`` and ``pgq.schema`` are public too.
"""

from pgq._core.backoff import Backoff
from pgq._core.gc import tune_gc
from pgq._core.hooks import JobEvent
from pgq._worker.worker import Worker
from pgq.app import App, JobSpec, Task
from pgq.client import Client, QueueInfo, QueueLimits, QueueStats
from pgq.errors import (
    AttemptSuperseded,
    ClientClosed,
    ConfigError,
    DatabaseError,
    DatabaseUnavailable,
    PgqError,
    SchemaMismatch,
    SerializationError,
    TransactionConflict,
    UnknownTaskError,
)
from pgq.job import Cancel, Discard, Job, JobContext, JobState, Retry, Snooze
from pgq.settings import WorkerSettings
from pgq.sync import SyncClient

__version__ = "0.1.0"

__all__ = (
    "App",
    "AttemptSuperseded",
    "Backoff",
    "Cancel",
    "Client",
    "ClientClosed",
    "ConfigError",
    "DatabaseError",
    "DatabaseUnavailable",
    "Discard",
    "Job",
    "JobContext",
    "JobEvent",
    "JobSpec",
    "JobState",
    "PgqError",
    "QueueInfo",
    "QueueLimits",
    "QueueStats",
    "Retry",
    "SchemaMismatch",
    "SerializationError",
    "Snooze",
    "SyncClient",
    "Task",
    "TransactionConflict",
    "UnknownTaskError",
    "Worker",
    "WorkerSettings",
    "tune_gc",
)
