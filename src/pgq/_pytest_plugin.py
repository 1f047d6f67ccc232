"""pgq's pytest plugin (loaded by pytest through the ``pytest11`` entry point): a migrated
database of each test's own, and a client on it. See docs/testing.md."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from pgq.client import Client
from pgq.testing import TestDatabase


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pgq")
    group.addoption(
        "--pgq-db-prefix",
        dest="pgq_db_prefix",
        default=None,
        help="prefix of the test databases' names (default: the pgq_db_prefix ini setting, "
        "else PGQ_TEST_DB_PREFIX, else pgq); a random token per session follows it",
    )
    parser.addini("pgq_db_prefix", "prefix of pgq's test databases' names", default="")


def pytest_report_header(config: pytest.Config) -> str:
    return f"pgq: tests use {TestDatabase.choice()}"


@pytest.fixture(scope="session")
def pgq_template_setup() -> Callable[[str], None] | None:
    """Override to run the application's own migrations once per session, into the template
    every test's database is copied from: a function taking the template's DSN."""
    return None


@pytest.fixture(scope="session")
def pgq_database(
    request: pytest.FixtureRequest, pgq_template_setup: Callable[[str], None] | None
) -> Iterator[TestDatabase]:
    """The PostgreSQL server of the session (see :class:`pgq.testing.TestDatabase`)."""
    prefix = request.config.getoption("pgq_db_prefix") or request.config.getini("pgq_db_prefix")
    database = TestDatabase.start(prefix=prefix or None, setup=pgq_template_setup)
    try:
        yield database
    finally:
        database.close()


@pytest.fixture
def pgq_dsn(pgq_database: TestDatabase) -> Iterator[str]:
    """A database of this test's own, migrated to pgq's head revision (and by
    ``pgq_template_setup``): its DSN."""
    dsn = pgq_database.create()
    try:
        yield dsn
    finally:
        pgq_database.drop(dsn)


@pytest.fixture
async def pgq_client(pgq_dsn: str) -> AsyncIterator[Client]:
    """A :class:`pgq.Client` open on ``pgq_dsn``, without an App: enqueues by name are
    neither checked nor routed to the task's queue (an async fixture: run the test with
    pytest's anyio plugin, ``@pytest.mark.anyio``, or pytest-asyncio)."""
    async with Client(pgq_dsn) as client:
        yield client
