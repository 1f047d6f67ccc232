"""Screenshots of the dashboard's main pages for docs/dashboard.md, taken in chromium from
`pgq dashboard` on a database with jobs in every state and a worker running one.

`make screenshots` (or `python -m tests.dashboard.screenshots DSN docs/dashboard [MINUTES]`):
first MINUTES (default 4) of real traffic, so the throughput chart has a history.
"""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import anyio
import asyncpg
import httpx
from playwright.async_api import async_playwright

import pgq
from pgq import migrate
from tests.dashboard.conftest import CHROMIUM, free_port
from tests.dashboard.seed import app, seed

PAGES = {
    "overview": "/",
    "jobs": "/jobs",
    "jobs-filtered": "/jobs?state=discarded&state=retryable",
    "job": "/jobs/{discarded}",
    "producers": "/producers",
    "queues": "/queues",
}


async def main(dsn: str, out: Path, minutes: float = 4) -> None:
    await _recreate(dsn)
    jobs = await seed(dsn, completed=40)
    fast = pgq.WorkerSettings(heartbeat_interval=1.0, heartbeat_timeout=0.5, shutdown_timeout=0.1)
    async with (
        pgq.Client(dsn) as client,
        pgq.Worker(app, dsn, queues={"emails": 8}, name="mail-1:2207", settings=fast),
    ):
        await _traffic(client, minutes)
        for month in ("2026-08", "2026-09", "2026-10"):
            await client.enqueue("report", {"month": month}, queue="reports")
        async with pgq.Worker(
            app, dsn, queues={"reports": 2}, name="reports-1:2311", settings=fast
        ):
            await _crashed_worker(dsn)
            await _shoot(dsn, out, {"discarded": jobs.discarded})


async def _crashed_worker(dsn: str) -> None:
    """A worker process that takes a report and is killed -9: fenced on the producers page
    until the leader judges it stale and rescues its job."""
    cmd = [sys.executable, "-m", "pgq", "worker", "tests.dashboard.seed:app", "--dsn", dsn,
           "--queue", "reports:2", "--name", "reports-2:4121", "--heartbeat-interval", "1", "--heartbeat-timeout", "0.5"]  # fmt: skip
    process = await anyio.open_process(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    conn = await asyncpg.connect(dsn)
    try:
        with anyio.fail_after(30):
            while not await conn.fetchval(  # noqa: ASYNC110 - another process's row
                "SELECT count(*) FROM pgq_jobs WHERE state = 'running' AND attempted_by = $1",
                "reports-2:4121",
            ):
                await anyio.sleep(0.2)
    finally:
        await conn.close()
    process.kill()
    await process.wait()
    await anyio.sleep(7)  # past its fencing bound (3 x 1 s + 0.5 s), well before stale_after


async def _traffic(client: pgq.Client, minutes: float) -> None:
    """Jobs at a changing rate, a few of them failing, for the worker to run."""
    rng = random.Random(7)
    with anyio.move_on_after(minutes * 60):
        while True:
            ok = [
                pgq.JobSpec("send_email", {"to": f"u{rng.randrange(9999)}@example.com"},
                            queue="emails", tags=["newsletter"])
                for _ in range(rng.randrange(5, 60))
            ]  # fmt: skip
            bad = [
                pgq.JobSpec("broken", {"note": "mailbox full"}, queue="emails")
                for _ in range(rng.choice([0, 0, 0, 1, 2]))
            ]
            await client.enqueue_many(ok + bad)
            await anyio.sleep(5)


async def _recreate(dsn: str) -> None:
    name = dsn.rsplit("/", 1)[1]
    server = await asyncpg.connect(dsn.rsplit("/", 1)[0] + "/postgres")
    try:
        await server.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await server.execute(f'CREATE DATABASE "{name}"')
    finally:
        await server.close()
    await migrate.upgrade_async(dsn)


async def _shoot(dsn: str, out: Path, ids: dict[str, int]) -> None:
    assert CHROMIUM, "screenshots need chromium: apt-get install chromium"
    port = free_port()
    cmd = [sys.executable, "-m", "pgq", "dashboard", "--dsn", dsn, "--port", str(port)]
    process = await anyio.open_process(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient() as http:
            with anyio.fail_after(30):
                while True:
                    try:
                        if (await http.get(url)).status_code == 200:
                            break
                    except httpx.TransportError:
                        await anyio.sleep(0.1)
        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = await browser.new_page(viewport={"width": 1360, "height": 820})
            for name, path in PAGES.items():
                await page.goto(url + path.format(**ids))
                await page.screenshot(path=str(out / f"{name}.png"), full_page=False)
                print(out / f"{name}.png")
            await browser.close()
    finally:
        process.terminate()
        await process.wait()


if __name__ == "__main__":
    Path(sys.argv[2]).mkdir(parents=True, exist_ok=True)
    anyio.run(main, sys.argv[1], Path(sys.argv[2]), float(sys.argv[3]) if sys.argv[3:] else 4)
