"""Every error pgq raises derives from :class:`PgqError`.

The tree::

    PgqError
    ├── ConfigError               a setting, a DSN or a name is wrong; fix the call
    │   ├── UnknownTaskError      a task name no App registered
    │   └── ClientClosed          a client used before open() or after close()
    ├── SerializationError        job arguments (or a result) are not JSON
    ├── AttemptSuperseded         a task settled an attempt that is no longer the job's
    └── DatabaseError             the database refused what pgq asked (``sqlstate`` says why)
        ├── DatabaseUnavailable   the server does not answer, refuses us or cut us off:
        │                         the same call may succeed later
        ├── TransactionConflict   a deadlock or serialization failure: run the transaction
        │                         again
        └── SchemaMismatch        the pgq tables are missing or at another revision

The public calls (:class:`~pgq.Client`, :class:`~pgq.SyncClient`, ``JobContext.complete``
and its siblings) raise only these for what the database or its driver says: the
driver's exception stays on ``__cause__``.
"""

from __future__ import annotations

__all__ = (
    "AttemptSuperseded",
    "ClientClosed",
    "ConfigError",
    "DatabaseError",
    "DatabaseUnavailable",
    "PgqError",
    "SchemaMismatch",
    "SerializationError",
    "TransactionConflict",
    "UnknownTaskError",
)


class PgqError(Exception):
    """Root of every error pgq raises."""


class ConfigError(PgqError, ValueError):
    """A setting, DSN, queue or task name is invalid; the message says which and why."""


class UnknownTaskError(ConfigError, LookupError):
    """A task name that the App in use has not registered."""


class ClientClosed(ConfigError):
    """A client used while it is not open: before ``open()`` (or ``async with``) when it
    opens its own pool, after ``close()``, or closed while the call was under way. Open it
    again (``open()``) to go on. A :class:`ConfigError`, as it always was."""


class SerializationError(PgqError, TypeError):
    """A value that cannot be stored as JSON; ``path`` names where it sits."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path


class AttemptSuperseded(PgqError):
    """Raised by ``ctx.complete(connection=...)`` (and its siblings) when this attempt is no
    longer the job's running attempt: the job was rescued, cancelled, re-claimed or already
    settled. Let it propagate out of your transaction, so your writes roll back with it."""

    def __init__(self, job_id: int, attempt: int) -> None:
        super().__init__(
            f"job {job_id} attempt {attempt} is no longer the job's running attempt (rescued, "
            "cancelled, re-claimed or already settled): nothing was written; roll your "
            "transaction back"
        )
        self.job_id = job_id
        self.attempt = attempt


class DatabaseError(PgqError):
    """The database failed to do what pgq asked: raised as such, the server refused the
    statement (a constraint or trigger of yours, a permission, a limit); the subclasses
    name the conditions worth handling. ``sqlstate`` is the server's five-character code
    (``"23505"``), None when the server gave none; the driver's exception is on
    ``__cause__``."""

    def __init__(self, message: str, *, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class DatabaseUnavailable(DatabaseError, ConnectionError):
    """The server does not answer, refuses the connection, or cannot serve now: the
    connection was lost mid-call, the server is shutting down, is a standby (a failover
    under way), ran out of connections or resources, or cancelled the statement. The same
    call may succeed later. A write whose connection was lost while it committed may have
    landed. On ``connection=``, what is lost is the caller's transaction: run it again
    whole (on a new connection when the message says this one was lost)."""


class TransactionConflict(DatabaseError):
    """The server rolled the transaction back for a conflict with another (a deadlock, or
    a serialization failure under ``REPEATABLE READ`` / ``SERIALIZABLE``; SQLSTATE class
    40). Nothing of it was written: run the whole transaction again."""


class SchemaMismatch(DatabaseError):
    """The pgq schema is missing or at a revision this pgq does not run on. ``shared``: pgq's
    revisions are recorded in the project's own alembic version table, so the project's
    alembic environment migrates them. ``fix``: advice that replaces the usual."""

    def __init__(
        self,
        found: str | None,
        needed: str,
        *,
        shared: bool = False,
        newer: bool = False,
        min_code: str | None = None,
        fix: str | None = None,
    ) -> None:
        shown = found if found is not None else "none (pgq tables not found)"
        head = f"schema at revision {shown}, this pgq needs {needed}"
        if fix is not None:  # the caller knows more of what went wrong
            pass
        elif newer and min_code is not None:
            head = (
                f"schema at revision {shown}, which serves pgq code from revision {min_code} "
                f"on, and this pgq is at {needed}"
            )
            fix = (
                f"run a pgq release that ships revision {min_code} or later (upgrade pgq "
                "here); `pgq migrate` cannot undo a revision it does not have"
            )
        elif newer:
            fix = (
                "this pgq does not know that revision, so a newer pgq (or another tool) "
                "migrated the database: run the pgq release that ships it (upgrade pgq "
                "here); `pgq migrate` cannot undo a revision it does not have"
            )
        elif shared:
            fix = (
                "run `alembic upgrade heads` in your project (pgq's revisions are in its "
                "alembic_version)"
            )
        else:
            fix = "run `pgq migrate`"
        super().__init__(f"{head}: {fix}")
        self.found = found
        self.needed = needed
        self.shared = shared
        self.min_code = min_code
