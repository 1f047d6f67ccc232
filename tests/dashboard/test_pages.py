"""The dashboard's pages over HTTP, on a real database with jobs in every state."""

from __future__ import annotations

import html
import json
import re

import asyncpg
import httpx
import pytest

import pgq
from pgq.dashboard import create_app
from tests.dashboard.conftest import Scene
from tests.dashboard.seed import ATTRIBUTE, SCRIPT
from tests.tests_support import until

pytestmark = pytest.mark.anyio


def ids_listed(body: str) -> list[int]:
    """The job ids of a listing, in its order."""
    return [int(m) for m in re.findall(r'<td><a href="/jobs/(\d+)">', body)]


async def test_overview_counts_every_state_per_queue(http: httpx.AsyncClient, scene: Scene) -> None:
    page = await http.get("/")
    assert page.status_code == 200
    body = page.text

    def cell(queue: str, state: str) -> str:
        m = re.search(rf'href="/jobs\?queue={queue}&amp;state={state}">([\d,]+)</a>', body)
        assert m, (queue, state)
        return m.group(1)

    assert cell("emails", "completed") == "12"
    assert cell("emails", "discarded") == "2"
    assert cell("emails", "retryable") == "1"
    assert cell("default", "scheduled") == "1"
    assert cell("default", "cancelled") == "1"
    assert cell("held", "available") == "1"
    assert cell("reports", "running") == "1"
    assert '<svg class="chart"' in body
    assert f"leader <b>{scene.worker.name}</b>" in body


async def test_the_leader_counts_throughput_for_the_chart(
    http: httpx.AsyncClient, scene: Scene, conn: asyncpg.Connection[asyncpg.Record]
) -> None:
    async def counted() -> bool:
        n = await conn.fetchval("SELECT sum(completed) FROM pgq_throughput WHERE queue = 'emails'")
        return bool(n == 12)

    await until(counted)
    body = (await http.get("/")).text
    # 12 completed in the last hour, and the two discarded jobs as failed.
    assert re.search(r"12 completed · <span class=\"bad-text\">2 failed", body)
    bars = re.findall(r"UTC: (\d+) completed, (\d+) failed, (\d+) cancelled</title>", body)
    assert len(bars) == 60
    assert [sum(int(b[i]) for b in bars) for i in range(3)] == [12, 2, 1]


@pytest.mark.parametrize(
    ("query", "expect"),
    [
        ("state=discarded", lambda s: [s.jobs.xss, s.jobs.discarded]),
        ("state=running", lambda s: [s.running]),
        ("state=scheduled&state=cancelled", lambda s: [s.jobs.cancelled, s.jobs.scheduled]),
        ("queue=held", lambda s: [s.jobs.available]),
        ("task=flaky", lambda s: [s.jobs.retryable]),
        (
            "tag=welcome&args=%7B%22to%22%3A+%22user3%40example.com%22%7D",
            lambda s: [s.jobs.completed[3]],
        ),
    ],
)
async def test_jobs_filter(http: httpx.AsyncClient, scene: Scene, query: str, expect) -> None:  # type: ignore[no-untyped-def]
    page = await http.get(f"/jobs?{query}")
    assert page.status_code == 200
    assert ids_listed(page.text) == expect(scene)


async def test_a_filter_by_id_shows_that_job(http: httpx.AsyncClient, scene: Scene) -> None:
    page = await http.get(f"/jobs?id={scene.jobs.retryable}")
    assert ids_listed(page.text) == [scene.jobs.retryable]


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("args=%7Bnope", "args must be JSON"),
        ("args=%5B1%2C2%5D", "args must be a JSON object"),
        ("id=seven", "id must be a whole number"),
        ("id=99999999999999999999999", "id must be a whole number from 1 to"),
        ("state=lost", "unknown state lost"),
    ],
)
async def test_a_bad_filter_says_what_to_fix(
    http: httpx.AsyncClient, scene: Scene, query: str, says: str
) -> None:
    page = await http.get(f"/jobs?{query}")
    assert page.status_code == 400  # the page, with its filter form and what to fix
    assert says in html.unescape(page.text)
    assert ids_listed(page.text) == []


async def test_keyset_pages_walk_every_job_once_newest_first(dsn: str, scene: Scene) -> None:
    dashboard = create_app(dsn, page_size=5)
    transport = httpx.ASGITransport(app=dashboard)
    seen: list[int] = []
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        url = "/jobs"
        while url:
            body = (await c.get(url)).text
            seen += ids_listed(body)
            older = re.search(r'rel="next" href="([^"]+)"', body)
            url = html.unescape(older.group(1)) if older else ""
    await dashboard.aclose()
    async with pgq.Client(dsn) as client:
        everything = [j.id for j in await client.list_jobs(limit=1000)]
    assert seen == sorted(everything, reverse=True)


async def test_a_rare_match_is_searched_a_bounded_window_at_a_time(dsn: str) -> None:
    async with pgq.Client(dsn) as client:
        first = await client.enqueue("needle", queue="hay")
        await client.enqueue_many([pgq.JobSpec("straw", queue="hay") for _ in range(120)])
        last = await client.enqueue("needle", queue="hay")
    dashboard = create_app(dsn, page_size=10, scan_window=50)
    transport = httpx.ASGITransport(app=dashboard)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        body = (await c.get("/jobs?task=needle")).text
        # The newest 50 ids hold one needle: shown, and the page offers to search older ones.
        assert ids_listed(body) == [last.id]
        assert "Search older jobs" in body
        found, url, pages = [last.id], None, 0
        while m := re.search(r'rel="next" href="([^"]+)"', body):
            url = html.unescape(m.group(1))
            body = (await c.get(url)).text
            found += ids_listed(body)
            pages += 1
        # An id is found wherever it is, in a window of its own.
        assert ids_listed((await c.get(f"/jobs?id={first.id}")).text) == [first.id]
    await dashboard.aclose()
    assert found == [last.id, first.id]
    assert pages == 2  # 122 ids in windows of 50: two more pages reach the first


async def test_a_job_page_shows_every_attempt_with_its_worker_and_traceback(
    http: httpx.AsyncClient, scene: Scene
) -> None:
    page = await http.get(f"/jobs/{scene.jobs.discarded}")
    assert page.status_code == 200
    text = html.unescape(page.text)
    assert "attempt 1: failed" in text and "attempt 2: failed" in text
    assert text.count('<pre class="message">RuntimeError: SMTP refused once') == 2
    assert "Traceback (most recent call last)" in text
    worker_names = re.findall(r'<span class="who">on ([^ <]+)', page.text)
    assert len(worker_names) == 2 and len(set(worker_names)) == 1
    assert '"note": "once"' in text  # the args


async def test_a_running_job_names_its_worker_and_producer(
    http: httpx.AsyncClient, scene: Scene
) -> None:
    text = html.unescape((await http.get(f"/jobs/{scene.running}")).text)
    assert "attempt 1: running" in text
    assert f"on {scene.worker.name}" in text
    producer = next(p for p in scene.worker.stats()["producers"] if p["queue"] == "reports")
    assert producer["producer_id"] in text


async def test_job_content_is_escaped_everywhere(http: httpx.AsyncClient, scene: Scene) -> None:
    for url in (f"/jobs/{scene.jobs.xss}", "/jobs?state=discarded", "/"):
        body = (await http.get(url)).text
        assert "<script>window.__xss" not in body
        assert "<img src=x" not in body
    body = (await http.get(f"/jobs/{scene.jobs.xss}")).text
    assert html.escape(SCRIPT, quote=False) in body or "&lt;script&gt;" in body
    assert ATTRIBUTE in html.unescape(body)
    page = await http.get("/")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-frame-options"] == "DENY"


async def test_producers_page_shows_the_protocol(http: httpx.AsyncClient, scene: Scene) -> None:
    body = (await http.get("/producers")).text
    assert scene.worker.name in body
    assert 'class="status status-healthy">healthy' in body
    assert "leader</span>" in body
    # running as the producer last reported it (at its heartbeat) / as the jobs table has it
    assert re.search(r"<td class=\"n\">[01] / 1</td>", body)


async def test_queues_page_lists_schedules_recorded_by_the_leader(
    http: httpx.AsyncClient, scene: Scene, conn: asyncpg.Connection[asyncpg.Record]
) -> None:
    async def recorded() -> bool:
        return bool(await conn.fetchval("SELECT count(*) FROM pgq_periodic"))

    await until(recorded)
    body = html.unescape((await http.get("/queues")).text)
    assert "nightly-report" in body and "*/5 * * * * (UTC)" in body
    assert re.search(r"in \d+ (min|s)", body)  # the next run


async def test_a_missing_job_is_a_404_page(http: httpx.AsyncClient, scene: Scene) -> None:
    page = await http.get("/jobs/999999")
    assert page.status_code == 404
    assert "No job 999999" in page.text


async def test_an_unmigrated_database_says_to_migrate(empty_dsn: str) -> None:
    dashboard = create_app(empty_dsn)
    transport = httpx.ASGITransport(app=dashboard)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        page = await c.get("/")
    assert page.status_code == 503
    assert "pgq migrate" in page.text


async def test_a_database_that_is_down_is_a_503_without_the_password() -> None:
    dashboard = create_app("postgresql://pgq:s3cret-pw@127.0.0.1:1/app")
    transport = httpx.ASGITransport(app=dashboard)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        page = await c.get("/jobs")
    assert page.status_code == 503
    assert "s3cret-pw" not in page.text
    assert "127.0.0.1:1" in page.text


async def test_queues_page_shows_flow_control_limits(
    http: httpx.AsyncClient, scene: Scene, dsn: str
) -> None:
    async with pgq.Client(dsn) as client:
        await client.set_queue_limits(
            "emails", concurrency=3, rate=(100, 60), key_concurrency=1, key_rate=(5, 1)
        )
    body = html.unescape((await http.get("/queues")).text)
    assert "3 at once, 100/60s; per key: 1 at once, 5/1s" in body


async def test_a_job_whose_arguments_python_cannot_decode_says_so_on_its_pages(
    http: httpx.AsyncClient, scene: Scene
) -> None:
    """A row written around pgq's checks (an integer of more digits than int() converts):
    its page and the list say why its arguments are not shown, rather than showing {}."""
    conn = await asyncpg.connect(scene.dsn)
    try:
        job_id = await conn.fetchval(
            "INSERT INTO pgq_jobs (task, queue, args, state) VALUES ('echo', 'odd',"
            " jsonb_build_object('n', repeat('9', 5000)::numeric), 'scheduled')"
            " RETURNING id"
        )
    finally:
        await conn.close()
    page = await http.get(f"/jobs/{job_id}")
    assert page.status_code == 200
    assert "(not shown: its stored arguments, metadata or result could not be decoded" in (
        page.text
    )
    listed = await http.get(f"/jobs?id={job_id}")
    assert "(not shown: its stored arguments" in listed.text


def timeline_lines(body: str) -> list[str]:
    """The bold line of each timeline entry of a job page, tags stripped."""
    section = body.split('<ol class="timeline">', 1)[1].split("</ol>", 1)[0]
    return [html.unescape(re.sub(r"<[^>]+>", "", b)) for b in re.findall(r"<b>(.*?)</b>", section)]


async def test_a_delayed_job_is_due_and_a_failed_one_runs_again(
    http: httpx.AsyncClient, scene: Scene
) -> None:
    """A job enqueued with a delay has not run: its timeline says when it is due, not that
    it runs again; a job whose first attempt failed runs again as attempt 2."""
    delayed = timeline_lines((await http.get(f"/jobs/{scene.jobs.scheduled}")).text)
    assert delayed == ["enqueued on queue default", "due"]
    failed = timeline_lines((await http.get(f"/jobs/{scene.jobs.retryable}")).text)
    assert failed[0] == "enqueued on queue emails"
    assert failed[-1] == "attempt 2: runs again"


async def test_a_rescue_says_who_took_the_attempt_back(
    http: httpx.AsyncClient, scene: Scene
) -> None:
    """The leader's rescue and a restarted worker's are told apart on the job's page (the
    entries as pgq's rescue statement writes them)."""
    entries = [
        {"attempt": 1, "kind": "rescued", "reason": "producer stale", "message": "m1"},
        {"attempt": 2, "kind": "rescued", "reason": "worker restarted", "message": "m2"},
    ]
    conn = await asyncpg.connect(scene.dsn)
    try:
        job_id = await conn.fetchval(
            "INSERT INTO pgq_jobs (task, queue, args, state, attempt, attempted_at, errors)"
            " VALUES ('echo', 'odd', '{}', 'retryable', 2, now(), $1::jsonb) RETURNING id",
            json.dumps(entries),
        )
    finally:
        await conn.close()
    lines = timeline_lines((await http.get(f"/jobs/{job_id}")).text)
    assert lines[1:3] == [
        "attempt 1: rescued by the leader: producer stale",
        "attempt 2: rescued by its worker's next run (the worker restarted)",
    ]


async def test_a_job_id_past_the_largest_is_not_found(
    http: httpx.AsyncClient, scene: Scene
) -> None:
    page = await http.get("/jobs/99999999999999999999999")
    assert page.status_code == 404


async def test_queues_page_says_which_jobs_no_live_worker_serves(
    http: httpx.AsyncClient, scene: Scene, conn: asyncpg.Connection[asyncpg.Record]
) -> None:
    # Jobs of a task the App never registered (enqueued by name, or renamed by a deploy),
    # due for longer than stale_after on a queue the scene's worker serves.
    await conn.execute(
        "INSERT INTO pgq_jobs (task, queue, args, state, scheduled_at)"
        " SELECT 'retired_task', 'reports', '{}', 'available', now() - interval '1 hour'"
        " FROM generate_series(1, 2)"
    )
    body = html.unescape((await http.get("/queues")).text)
    assert re.search(
        r"<strong>2</strong> job\(s\) of task <code>retired_task</code> wait on queue "
        r"<a [^>]+>reports</a> and no live worker of that queue serves the task",
        body,
    ), body
