"""What the drivers raise comes out of a public call as one of pgq's errors, by the
condition a caller handles, the driver's exception on ``__cause__`` and no password in the
message (tests/integration/_db/test_boundary.py shows it through the public calls)."""

from __future__ import annotations

import asyncpg
import psycopg
import pytest

import pgq
from pgq._db.boundary import database_error, database_errors

DSN = "postgresql://app:hunter2-secret@db.example:5432/app"


@pytest.mark.parametrize(
    ("exc", "kind", "sqlstate"),
    [
        (
            asyncpg.SerializationError("could not serialize access"),
            pgq.TransactionConflict,
            "40001",
        ),
        (asyncpg.DeadlockDetectedError("deadlock detected"), pgq.TransactionConflict, "40P01"),
        (asyncpg.AdminShutdownError("terminating connection"), pgq.DatabaseUnavailable, "57P01"),
        (asyncpg.ReadOnlySQLTransactionError("read-only"), pgq.DatabaseUnavailable, "25006"),
        (
            asyncpg.ConnectionDoesNotExistError("closed mid-operation"),
            pgq.DatabaseUnavailable,
            None,
        ),
        (ConnectionResetError("reset by peer"), pgq.DatabaseUnavailable, None),
        (asyncpg.UniqueViolationError("duplicate key"), pgq.DatabaseError, "23505"),
        (asyncpg.RaiseError("no boom jobs"), pgq.DatabaseError, "P0001"),
        (psycopg.errors.SerializationFailure("could not serialize"), pgq.TransactionConflict, None),
        (psycopg.OperationalError("server closed the connection"), pgq.DatabaseUnavailable, None),
        (psycopg.errors.UniqueViolation("duplicate key"), pgq.DatabaseError, None),
    ],
)
def test_a_driver_error_is_raised_as_the_condition_it_is(
    exc: Exception, kind: type[pgq.DatabaseError], sqlstate: str | None
) -> None:
    error = database_error(exc, DSN)
    assert type(error) is kind
    if sqlstate is not None:  # psycopg's errors made by hand carry no diagnostics
        assert error.sqlstate == sqlstate
        assert f"(SQLSTATE {sqlstate})" in str(error)


def test_a_message_keeps_no_password() -> None:
    error = database_error(asyncpg.InvalidPasswordError("hunter2-secret refused"), DSN)
    assert "hunter2" not in str(error) and "*** refused" in str(error)


def test_the_driver_error_stays_on_the_cause_and_pgqs_pass_as_they_are() -> None:
    refused = asyncpg.UniqueViolationError("duplicate key")
    with pytest.raises(pgq.DatabaseError) as info, database_errors(DSN):
        raise refused
    assert info.value.__cause__ is refused
    mismatch = pgq.SchemaMismatch("pgq_0001", "pgq_0002")
    with pytest.raises(pgq.SchemaMismatch) as same, database_errors(DSN):
        raise mismatch
    assert same.value is mismatch
    with pytest.raises(TimeoutError), database_errors(DSN):
        raise TimeoutError  # a wait's own bound: the builtin, as documented
    with pytest.raises(KeyError), database_errors(DSN):
        raise KeyError("not the driver's")


def test_the_new_errors_keep_the_old_catches_working() -> None:
    assert issubclass(pgq.ClientClosed, pgq.ConfigError)
    assert issubclass(pgq.ClientClosed, ValueError)
    assert issubclass(pgq.TransactionConflict, pgq.DatabaseError)
    assert issubclass(pgq.DatabaseUnavailable, ConnectionError)
    for name in pgq.errors.__all__:
        assert issubclass(getattr(pgq, name), pgq.PgqError), name
        assert name in pgq.errors.__doc__, f"{name} is not in the tree of errors.py"


def test_sqlalchemys_error_for_a_callers_session_is_read_for_the_drivers() -> None:
    from sqlalchemy.exc import DBAPIError

    shutdown = asyncpg.AdminShutdownError("terminating connection")
    adapted = RuntimeError("the dialect's adapted error")
    adapted.__cause__ = shutdown
    with pytest.raises(pgq.DatabaseUnavailable) as info, database_errors(DSN):
        raise DBAPIError("SELECT 1", None, adapted)
    assert info.value.sqlstate == "57P01"
    cause = info.value.__cause__
    assert isinstance(cause, DBAPIError) and cause.orig is adapted
