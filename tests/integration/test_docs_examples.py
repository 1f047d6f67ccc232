"""The examples the docs show are real files; these tests run them."""

import sys
from pathlib import Path

import anyio
import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

import pgq
from pgq._dsn import sqlalchemy_url

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "docs" / "examples"))

import starlette_service
import transactional

pytestmark = pytest.mark.anyio


async def test_starlette_lifespan_runs_the_worker(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import httpx

    monkeypatch.setenv("PGQ_DSN", dsn)
    starlette_service.sent.clear()
    service = starlette_service.service
    transport = httpx.ASGITransport(app=service)
    async with (
        service.router.lifespan_context(service),
        httpx.AsyncClient(transport=transport, base_url="http://service") as http,
    ):
        response = await http.post("/signup", json={"email": "ada@example.com"})
        assert response.status_code == 202
        job_id = response.json()["job_id"]
        with anyio.fail_after(20):
            while True:  # polling the service's API, as its users would
                state = (await http.get(f"/jobs/{job_id}")).json()
                if state["state"] == "completed":
                    break
                await anyio.sleep(0.05)
        assert state["result"] == "welcomed ada@example.com"
        assert (await http.get("/jobs/999999")).status_code == 404
    assert starlette_service.sent == ["ada@example.com"]


async def _users_table(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    await conn.execute("CREATE TABLE users (id serial PRIMARY KEY, email text UNIQUE)")
    await conn.close()


async def test_transactional_enqueue_with_asyncpg(dsn: str, client: pgq.Client) -> None:
    await _users_table(dsn)
    await transactional.signup_asyncpg(client.pool, client, "a@example.com")
    with pytest.raises(asyncpg.UniqueViolationError):
        await transactional.signup_asyncpg(client.pool, client, "a@example.com")
    # One user, one job: the failed signup's job rolled back with it.
    assert (await client.count_by_state())[pgq.JobState.AVAILABLE] == 1


async def test_transactional_enqueue_with_sqlalchemy(dsn: str, client: pgq.Client) -> None:
    from sqlalchemy.exc import IntegrityError

    await _users_table(dsn)
    engine = create_async_engine(sqlalchemy_url(dsn))
    try:
        async with AsyncSession(engine) as session:
            await transactional.signup_sqlalchemy(session, client, "b@example.com")
        async with AsyncSession(engine) as session:
            with pytest.raises(IntegrityError):
                await transactional.signup_sqlalchemy(session, client, "b@example.com")
    finally:
        await engine.dispose()
    assert (await client.count_by_state())[pgq.JobState.AVAILABLE] == 1


async def test_lifecycle_example_runs(dsn: str) -> None:
    import lifecycle

    outcome = await lifecycle.main(dsn)
    assert outcome == {
        "result": {"customer": 7, "rows": 42},
        "cancelled": pgq.JobState.CANCELLED,
        "timed": True,
    }


async def test_exactly_once_example_runs(dsn: str) -> None:
    import exactly_once

    recorded, final = await exactly_once.main(dsn)
    assert final == 400 and len(recorded) == 3 and recorded[-1] == 400
