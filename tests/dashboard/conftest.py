"""Fixtures for the dashboard: a database with jobs in every state (a worker holds one
running), the dashboard app, an HTTP client for it, and a served copy for the browser."""

from __future__ import annotations

import shutil
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
import httpx
import pytest

import pgq
from pgq.dashboard import Dashboard, create_app
from tests.dashboard.seed import Seeded, app, seed


@dataclass
class Scene:
    """A seeded database, with a worker running one ``report`` job for the test's length."""

    dsn: str
    jobs: Seeded
    running: int
    worker: pgq.Worker


@pytest.fixture
async def scene(dsn: str) -> AsyncIterator[Scene]:
    jobs = await seed(dsn)
    async with pgq.Client(dsn) as client:
        running = (await client.enqueue("report", {"month": "2026-10"}, queue="reports")).id
        async with pgq.Worker(
            app, dsn, queues={"reports": 2}, schedule_interval=0.2, shutdown_timeout=0.1
        ) as worker:

            async def started() -> bool:
                job = await client.get_job(running)
                return job is not None and job.state is pgq.JobState.RUNNING

            with anyio.fail_after(15):
                while not await started():  # noqa: ASYNC110 - a row, no event to await
                    await anyio.sleep(0.05)
            yield Scene(dsn, jobs, running, worker)


@pytest.fixture
def dashboard(scene: Scene) -> Dashboard:
    return create_app(scene.dsn, refresh_s=0.5)


@pytest.fixture
async def http(dashboard: Dashboard) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=dashboard)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        yield c
    await dashboard.aclose()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
