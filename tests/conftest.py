"""Test fixtures: a PostgreSQL server, a migrated template, and a fresh database per test.

The server is ``PGQ_TEST_DSN`` when set, else the one at 127.0.0.1:5432 when it answers,
else an embedded server (the ``pgserver`` wheel) started for the session; with
``PGQ_TEST_EMBEDDED=1`` the embedded one whatever answers.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import sys
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

import pgq
from pgq import migrate

# Settings must come from each test, never from the shell that runs the suite.
for _var in list(os.environ):
    if (
        _var.startswith(("PGQ_", "PG")) and _var not in ("PGQ_TEST_DSN", "PGQ_TEST_EMBEDDED")
    ) or _var == "DATABASE_URL":
        del os.environ[_var]

ROOT = Path(__file__).resolve().parent.parent
_counter = itertools.count()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def with_database(dsn: str, database: str) -> str:
    """``dsn`` pointing at another database."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/" + database))


@pytest.fixture(scope="session")
def server_dsn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A DSN of the test server's maintenance database."""
    explicit = os.environ.get("PGQ_TEST_DSN")
    if explicit:
        yield explicit
        return
    # PGQ_TEST_EMBEDDED=1: the path of a machine without a server, even on one that has it.
    if os.environ.get("PGQ_TEST_EMBEDDED") != "1" and _port_open("127.0.0.1", 5432):
        yield "postgresql://postgres@127.0.0.1:5432/postgres"
        return
    with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        import pgserver  # the "embedded" extra

    data = ROOT / ".pgq-embedded" / "tests"
    data.parent.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(data, cleanup_mode="stop")  # type: ignore[attr-defined]
    try:
        yield server.get_uri()
    finally:
        server.cleanup()


async def _admin(server_dsn: str, *statements: str) -> None:
    conn = await asyncpg.connect(server_dsn)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def template_db(server_dsn: str) -> Iterator[str]:
    """Name of a database migrated to head, cloned by each test."""
    name = f"pgq_template_{os.getpid()}"
    asyncio.run(_admin(server_dsn, f"DROP DATABASE IF EXISTS {name}", f"CREATE DATABASE {name}"))
    migrate.upgrade(with_database(server_dsn, name))
    yield name
    asyncio.run(_admin(server_dsn, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


def _fresh_database(server_dsn: str, template: str | None) -> tuple[str, str]:
    name = f"pgq_t_{os.getpid()}_{next(_counter)}"
    source = f" TEMPLATE {template} STRATEGY FILE_COPY" if template else ""
    asyncio.run(
        _admin(server_dsn, f"DROP DATABASE IF EXISTS {name}", f"CREATE DATABASE {name}{source}")
    )
    return name, with_database(server_dsn, name)


@pytest.fixture
def dsn(server_dsn: str, template_db: str) -> Iterator[str]:
    """A migrated database of this test's own."""
    name, url = _fresh_database(server_dsn, template_db)
    yield url
    asyncio.run(_admin(server_dsn, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


@pytest.fixture
def empty_dsn(server_dsn: str) -> Iterator[str]:
    """An empty (unmigrated) database of this test's own."""
    name, url = _fresh_database(server_dsn, None)
    yield url
    asyncio.run(_admin(server_dsn, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


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
