"""An application's own tests with pgq's pytest plugin: run with `pytest` where pgq is
installed (pgq's suite runs this file in a pytest of its own)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest
import signup

import pgq
from pgq import testing

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_signup_enqueues_a_welcome(pgq_client: pgq.Client) -> None:
    await signup.signup(pgq_client, "ada@example.com")
    (job,) = await testing.assert_enqueued(
        pgq_client, signup.send_welcome, {"to": "ada@example.com"}, queue="emails"
    )
    assert job.state is pgq.JobState.SCHEDULED  # an hour from now; nothing ran


@pytest.fixture
async def app_client(pgq_dsn: str) -> AsyncIterator[pgq.Client]:
    """A client with the App: enqueues by name are checked and go to the task's queue."""
    async with pgq.Client(pgq_dsn, app=signup.app) as client:
        yield client


async def test_an_enqueue_by_name_is_checked_and_routed_by_a_client_with_the_app(
    pgq_client: pgq.Client, app_client: pgq.Client
) -> None:
    plain = await pgq_client.enqueue("send_welcome", {"to": "cy@example.com"})
    assert plain.queue == "default"  # pgq_client has no App: not the task's queue
    routed = await app_client.enqueue("send_welcome", {"to": "cy@example.com"})
    assert routed.queue == "emails"
    with pytest.raises(pgq.ConfigError, match="takes no argument email"):
        await app_client.enqueue("send_welcome", {"email": "cy@example.com"})


async def test_drain_runs_delayed_jobs_and_retries_without_waiting(
    pgq_client: pgq.Client, pgq_dsn: str
) -> None:
    await signup.signup(pgq_client, "bob@example.com")
    result = await testing.drain(signup.app, pgq_dsn)  # the delay and the hour of backoff
    (job,) = result.completed
    assert job.result == "welcomed bob@example.com" and job.attempt == 2
    assert signup.sent == ["bob@example.com"]


async def test_the_applications_tables_are_there(pgq_dsn: str) -> None:
    conn = await asyncpg.connect(pgq_dsn)  # migrated by conftest.py's pgq_template_setup
    try:
        await conn.execute("INSERT INTO users (email) VALUES ('ada@example.com')")
    finally:
        await conn.close()


async def test_a_task_called_directly() -> None:
    assert await testing.run_task(signup.count_words, "a few words here") == 4
