"""Test fixtures: a PostgreSQL server, a migrated template, and a fresh database per test,
from pgq's pytest plugin (pgq.testing.TestDatabase): ``PGQ_TEST_DSN`` when set, else the
server at 127.0.0.1:5432 when it answers, else an embedded server (the ``pgserver`` wheel)
started for the session; with ``PGQ_TEST_EMBEDDED=1`` the embedded one whatever answers.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

import pgq
from pgq.testing import TestDatabase

# Settings must come from each test, never from the shell that runs the suite.
for _var in list(os.environ):
    if (
        _var.startswith(("PGQ_", "PG"))
        and _var
        not in ("PGQ_TEST_DSN", "PGQ_TEST_EMBEDDED", "PGQ_TEST_EMBEDDED_DIR", "PGQ_TEST_DB_PREFIX")
    ) or _var == "DATABASE_URL":
        del os.environ[_var]

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def with_database(dsn: str, database: str) -> str:
    """``dsn`` pointing at another database."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/" + database))


# The server and databases come from pgq's own pytest plugin (pgq.testing), as they would in
# a user's suite; these names are the ones the tests were written with.


@pytest.fixture(scope="session")
def server_dsn(pgq_database: TestDatabase) -> str:
    """A DSN of the test server's maintenance database."""
    return pgq_database.server_dsn


@pytest.fixture
def dsn(pgq_dsn: str) -> str:
    """A migrated database of this test's own."""
    return pgq_dsn


@pytest.fixture
def empty_dsn(pgq_database: TestDatabase) -> Iterator[str]:
    """An empty (unmigrated) database of this test's own."""
    dsn = pgq_database.create(migrated=False)
    yield dsn
    pgq_database.drop(dsn)


@pytest.fixture
async def client(dsn: str) -> AsyncIterator[pgq.Client]:
    async with pgq.Client(dsn) as c:
        yield c


@pytest.fixture
async def conn(dsn: str) -> AsyncIterator[asyncpg.Connection[asyncpg.Record]]:
    c = await asyncpg.connect(dsn)
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture
def python() -> str:
    """The interpreter running the tests, for subprocesses."""
    return sys.executable
