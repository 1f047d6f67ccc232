"""Fixtures for fault tests: worker processes a test starts, and the side-effect tables."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from tests.faults.workers import WorkerProcess


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[list[WorkerProcess]]:
    """Worker processes a test starts; all are stopped (or killed) at the end."""
    started: list[WorkerProcess] = []
    yield started
    for w in started:
        w.stop()


@pytest.fixture
async def db(dsn: str) -> AsyncIterator[asyncpg.Connection[asyncpg.Record]]:
    """A connection to the test database, with the side-effect tables created."""
    conn = await asyncpg.connect(dsn)
    await conn.execute("""
        CREATE TABLE starts (job_id bigint, attempt int, worker text, at timestamptz DEFAULT now());
        CREATE TABLE effects (job_id bigint, attempt int, worker text, at timestamptz DEFAULT now());
    """)
    try:
        yield conn
    finally:
        await conn.close()
