"""The dashboard in a real browser (Debian's chromium, driven by Playwright), served by the
`pgq dashboard` command itself: filter, open, retry, pause, bulk, live refresh, and no
script from job content ever runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import anyio.abc
import httpx
import pytest
from playwright.async_api import Browser, Dialog, Page, async_playwright, expect

import pgq
from tests.dashboard.conftest import CHROMIUM, Scene, free_port
from tests.dashboard.seed import ATTRIBUTE, SCRIPT

if TYPE_CHECKING:
    from tests.tests_support import Conn

pytestmark = pytest.mark.anyio

if CHROMIUM is None and not os.environ.get("PGQ_TEST_NO_BROWSER"):
    pytest.fail(
        "the dashboard's browser tests need chromium: apt-get install chromium "
        "(or set PGQ_TEST_NO_BROWSER=1 to skip them knowingly)",
        pytrace=False,
    )
if CHROMIUM is None:
    pytest.skip("PGQ_TEST_NO_BROWSER is set", allow_module_level=True)


@dataclass
class Served:
    url: str
    process: anyio.abc.Process


@pytest.fixture
async def served(scene: Scene, tmp_path: Path) -> AsyncIterator[Served]:
    """`pgq dashboard` on a free loopback port, refreshing pages every half second."""
    port = free_port()
    log = tmp_path / "dashboard.log"
    with log.open("wb") as out:
        process = await anyio.open_process(
            [sys.executable, "-m", "pgq", "dashboard", "--dsn", scene.dsn, "--port", str(port),
             "--refresh", "0.5"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient() as http:
            with anyio.fail_after(30):
                while True:
                    assert process.returncode is None, log.read_text()
                    try:
                        if (await http.get(url + "/")).status_code == 200:
                            break
                    except httpx.TransportError:
                        await anyio.sleep(0.1)
        yield Served(url, process)
    finally:
        process.terminate()
        with anyio.fail_after(10):
            await process.wait()


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as p:
        b = await p.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        try:
            yield b
        finally:
            await b.close()


@pytest.fixture
async def page(browser: Browser) -> AsyncIterator[Page]:
    context = await browser.new_context(viewport={"width": 1400, "height": 900})
    page = await context.new_page()
    dialogs: list[str] = []

    async def on_dialog(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        await dialog.dismiss()

    page.on("dialog", on_dialog)
    yield page
    await context.close()
    assert dialogs == [], f"a script opened a dialog: {dialogs}"


async def test_filter_open_a_job_and_retry_it(
    served: Served, page: Page, scene: Scene, conn: Conn
) -> None:
    await page.goto(served.url + "/jobs")
    await page.get_by_label("discarded").check()
    await page.get_by_role("button", name="Filter").click()
    rows = page.locator("table.jobs tbody tr")
    await expect(rows).to_have_count(2)
    await expect(rows.locator(".state")).to_have_text(["discarded", "discarded"])
    await page.get_by_role("link", name=str(scene.jobs.discarded), exact=True).click()
    await expect(page.locator("h1")).to_contain_text(f"Job {scene.jobs.discarded}")
    await expect(page.locator("ol.timeline")).to_contain_text("attempt 2: failed")
    await page.get_by_role("button", name="Retry").click()
    await expect(page.locator(".notice")).to_contain_text("Retried 1 job(s)")
    state = await conn.fetchval(
        "SELECT state::text FROM pgq_jobs WHERE id = $1", scene.jobs.discarded
    )
    assert state == "available"


async def test_pause_a_queue(served: Served, page: Page, conn: Conn) -> None:
    await page.goto(served.url + "/queues")
    row = page.locator("tr", has_text="held")
    await row.get_by_role("button", name="Pause").click()
    await expect(page.locator(".notice")).to_contain_text("Paused queue held")
    await expect(page.locator("tr", has_text="held").locator(".badge-paused")).to_be_visible()
    assert await conn.fetchval("SELECT paused_at IS NOT NULL FROM pgq_queues WHERE name = 'held'")


async def test_bulk_retry_by_the_current_filter(
    served: Served, page: Page, scene: Scene, conn: Conn
) -> None:
    await page.goto(served.url + "/jobs?state=discarded")
    await page.get_by_role("button", name="Retry all…").click()
    await expect(page.locator("h1")).to_have_text("Retry 2 jobs?")
    await page.get_by_role("button", name="Retry 2 jobs").click()
    await expect(page.locator(".notice")).to_contain_text("Retried 2 job(s)")
    states = await conn.fetch(
        "SELECT state::text FROM pgq_jobs WHERE id = ANY($1::bigint[])",
        [scene.jobs.discarded, scene.jobs.xss],
    )
    assert [r[0] for r in states] == ["available", "available"]


async def test_job_content_never_runs_as_script(served: Served, page: Page, scene: Scene) -> None:
    for path in (f"/jobs/{scene.jobs.xss}", "/jobs", "/jobs?state=discarded", "/"):
        await page.goto(served.url + path)
        assert await page.evaluate("window.__xss") is None, path
    await page.goto(served.url + f"/jobs/{scene.jobs.xss}")
    # Shown as text: the args, the tag and the error message all hold the payloads.
    await expect(page.locator("pre.json").first).to_contain_text(SCRIPT)
    await expect(page.locator(".tag")).to_have_text([ATTRIBUTE])
    await expect(page.locator("pre.message").first).to_contain_text(ATTRIBUTE)
    assert await page.locator("script").count() == 1  # only htmx, from /static


async def test_pages_refresh_themselves(served: Served, page: Page, scene: Scene) -> None:
    await page.goto(served.url + f"/jobs/{scene.jobs.scheduled}")
    badge = page.locator("h1 .state")
    await expect(badge).to_have_text("scheduled")
    await page.evaluate("window.__loaded_once = true")
    async with pgq.Client(scene.dsn) as client:
        await client.retry([scene.jobs.scheduled])
    await expect(badge).to_have_text("available", timeout=15_000)
    # The same document: refreshed in place, not reloaded.
    assert await page.evaluate("window.__loaded_once") is True


#: The script of a page served from a name that rebinds to 127.0.0.1 (DNS rebinding): in the
#: name's origin, it reads the confirm page's CSRF token and posts a bulk delete.
REBINDING_ATTACK = """async () => {
    const confirm = await fetch('/jobs/bulk?action=delete&state=discarded');
    const text = await confirm.text();
    const token = (text.match(/name="csrf_token" value="([^"]+)"/) || [])[1] || '';
    const upTo = (text.match(/name="up_to" value="([0-9]+)"/) || [])[1] || '0';
    const body = new URLSearchParams(
        {action: 'delete', state: 'discarded', up_to: upTo, csrf_token: token});
    const r = await fetch('/jobs/bulk', {method: 'POST', body, redirect: 'manual'});
    return [confirm.status, r.status];
}"""


async def test_a_page_of_a_rebinding_name_can_neither_read_nor_act(
    served: Served, scene: Scene, conn: Conn
) -> None:
    port = served.url.rsplit(":", 1)[1]
    async with async_playwright() as p:
        b = await p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-dev-shm-usage",
                  "--host-resolver-rules=MAP rebind.test 127.0.0.1"],
        )  # fmt: skip
        try:
            page = await b.new_page()
            response = await page.goto(f"http://rebind.test:{port}/")
            assert response is not None and response.status == 400
            await expect(page.locator("h1")).to_have_text("Bad request")
            assert await page.evaluate(REBINDING_ATTACK) == [400, 400]
            # The same browser, by a name the dashboard is served as: the page works.
            response = await page.goto(f"http://localhost:{port}/jobs?state=discarded")
            assert response is not None and response.status == 200
        finally:
            await b.close()
    left = await conn.fetchval(
        "SELECT count(*) FROM pgq_jobs WHERE id = ANY($1::bigint[])",
        [scene.jobs.discarded, scene.jobs.xss],
    )
    assert left == 2


def resident_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return (
        int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1])
        / 1024
    )


async def test_a_huge_unauthenticated_post_costs_the_served_dashboard_no_memory(
    served: Served, scene: Scene, conn: Conn
) -> None:
    before = resident_mb(served.process.pid)
    chunk = b"x" * 65536

    async def body() -> AsyncIterator[bytes]:
        for _ in range(200 * 16):  # 200 MB, chunked: no length to refuse it by
            yield chunk

    async with httpx.AsyncClient(timeout=60) as http:
        r = await http.post(f"{served.url}/jobs/{scene.jobs.scheduled}/cancel", content=body())
        assert r.status_code == 413
    assert resident_mb(served.process.pid) - before < 30  # read no further than its limit
    # A length past the limit is refused by that alone: the reply comes before the body.
    host, port = served.url.removeprefix("http://").split(":")
    async with await anyio.connect_tcp(host, int(port)) as s:
        await s.send(
            f"POST /jobs/{scene.jobs.scheduled}/cancel HTTP/1.1\r\nHost: {host}\r\n"
            f"Content-Length: {400 * 2**20}\r\n\r\n".encode()
            + b"x" * 100
        )
        with anyio.fail_after(10):
            assert (await s.receive()).startswith(b"HTTP/1.1 413 ")
    assert (
        await conn.fetchval("SELECT state::text FROM pgq_jobs WHERE id = $1", scene.jobs.scheduled)
        == "scheduled"
    )


async def test_a_huge_value_shows_its_start_and_downloads_whole(
    served: Served, page: Page, scene: Scene, tmp_path: Path
) -> None:
    big = {"blob": "x" * 2_000_000}
    async with pgq.Client(scene.dsn) as client:
        job = await client.enqueue("report", big, queue="held")
    await page.goto(f"{served.url}/jobs/{job.id}")
    await expect(page.locator("p.clipped")).to_contain_text("Showing the start of 2,000,011 bytes")
    assert len(await page.content()) < 100_000
    async with page.expect_download() as info:
        await page.get_by_role("link", name="download the whole args").click()
    download = await info.value
    saved = tmp_path / download.suggested_filename
    await download.save_as(saved)
    assert download.suggested_filename == f"job-{job.id}-args.json"
    assert json.loads(saved.read_text()) == big
