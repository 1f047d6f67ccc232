"""pgq: a PostgreSQL-backed job queue for asyncio services.

Jobs live in Postgres; workers claim them with ``FOR UPDATE SKIP LOCKED``; producers
heartbeat on the database clock, and the elected leader rescues the jobs of producers that
went silent. See ``docs/`` for the guide.
"""

from pgq.app import App, Backoff, Task
from pgq.client import Client, JobSpec
from pgq.errors import (
    ConfigError,
    DatabaseError,
    DatabaseUnavailable,
    PgqError,
    SchemaMismatch,
    SerializationError,
    UnknownTaskError,
)
from pgq.hooks import JobEvent
from pgq.job import Cancel, Job, JobContext, JobState, Retry, Snooze
from pgq.settings import WorkerSettings
from pgq.worker import Worker

__version__ = "0.1.0"

__all__ = (
    "App",
    "Backoff",
    "Cancel",
    "Client",
    "ConfigError",
    "DatabaseError",
    "DatabaseUnavailable",
    "Job",
    "JobContext",
    "JobEvent",
    "JobSpec",
    "JobState",
    "PgqError",
    "Retry",
    "SchemaMismatch",
    "SerializationError",
    "Snooze",
    "Task",
    "UnknownTaskError",
    "Worker",
    "WorkerSettings",
)
