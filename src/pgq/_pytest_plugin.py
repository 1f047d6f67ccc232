"""pgq's pytest plugin (loaded by pytest through the ``pytest11`` entry point): a migrated
database of each test's own, and a client on it. See docs/testing.md."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from pgq.client import Client
from pgq.testing import TestDatabase


@pytest.fixture(scope="session")
def pgq_database() -> Iterator[TestDatabase]:
    """The PostgreSQL server of the session (see :class:`pgq.testing.TestDatabase`)."""
    database = TestDatabase.start()
    try:
        yield database
    finally:
        database.close()


@pytest.fixture
def pgq_dsn(pgq_database: TestDatabase) -> Iterator[str]:
    """A database of this test's own, migrated to pgq's head revision: its DSN."""
    dsn = pgq_database.create()
    try:
        yield dsn
    finally:
        pgq_database.drop(dsn)


@pytest.fixture
async def pgq_client(pgq_dsn: str) -> AsyncIterator[Client]:
    """A :class:`pgq.Client` open on ``pgq_dsn`` (an async fixture: run the test with
    pytest's anyio plugin, ``@pytest.mark.anyio``, or pytest-asyncio)."""
    async with Client(pgq_dsn) as client:
        yield client
