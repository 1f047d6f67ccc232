"""The examples the docs show are real files; these tests run them."""

import sys
from pathlib import Path

import anyio
import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

import pgq

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
sys.path.insert(0, str(EXAMPLES))

import starlette_service  # noqa: E402
import transactional  # noqa: E402

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


async def test_transactional_enqueue_with_psycopg(dsn: str, client: pgq.Client) -> None:
    import psycopg

    await _users_table(dsn)
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await transactional.signup_psycopg(conn, client, "p@example.com")
        with pytest.raises(psycopg.errors.UniqueViolation):
            await transactional.signup_psycopg(conn, client, "p@example.com")
    assert (await client.count_by_state())[pgq.JobState.AVAILABLE] == 1


@pytest.mark.parametrize("driver", ["asyncpg", "psycopg"])
async def test_transactional_enqueue_with_sqlalchemy(
    dsn: str, client: pgq.Client, driver: str
) -> None:
    from sqlalchemy.exc import IntegrityError

    await _users_table(dsn)
    engine = create_async_engine(f"postgresql+{driver}://" + dsn.split("://", 1)[1])
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


async def test_under_uvicorn_the_logging_config_shows_pgqs_lines(dsn: str) -> None:
    """docs/embedding.md: uvicorn with docs/examples/uvicorn_logging.json prints pgq's
    INFO lines (worker start and stop) as JSON beside uvicorn's own."""
    import json
    import os
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "uvicorn", "starlette_service:service", "--port", str(port),
           "--log-config", str(EXAMPLES / "uvicorn_logging.json")]  # fmt: skip
    env = {**os.environ, "PGQ_DSN": dsn, "PYTHONPATH": str(EXAMPLES)}
    lines: list[dict[str, str]] = []
    async with await anyio.open_process(cmd, env=env) as process:
        assert process.stderr is not None
        buffer = b""
        try:
            with anyio.fail_after(30):
                while not any("started: emails[10]" in line.get("message", "") for line in lines):
                    buffer += await process.stderr.receive()
                    *complete, buffer = buffer.split(b"\n")
                    lines += [json.loads(c) for c in complete if c.strip()]
            process.terminate()
            with anyio.fail_after(30):
                async for chunk in process.stderr:
                    buffer += chunk
        finally:
            if process.returncode is None:
                process.kill()  # a failed wait must not leave uvicorn running
    lines += [json.loads(c) for c in buffer.split(b"\n") if c.strip()]
    loggers = {line["logger"] for line in lines}
    assert {"pgq.worker", "uvicorn.error"} <= loggers
    assert any(
        line["message"].endswith("stopped") for line in lines if line["logger"] == "pgq.worker"
    )


async def test_workflows_example_runs(dsn: str) -> None:
    import workflows

    assert await workflows.main(dsn) == {
        "callback_waited": True,
        "group_total": 600,
        "members": 3,
        "announced": "400 bytes in all",
        "charged": [("acme", 1), ("acme", 2), ("globex", 3)],
    }


async def test_quickstart_example_runs(dsn: str) -> None:
    """The README's example: the job enqueued in the transaction runs and returns."""
    import quickstart

    assert await quickstart.main(dsn) == "welcomed ada@example.com"
