"""The dashboard's actions and guards over HTTP: CSRF, origin, read-only, auth, binding,
bulk actions bounded by what was counted, and mounting under a prefix."""

from __future__ import annotations

import base64
import html
import re
from typing import TYPE_CHECKING

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount

import pgq
from pgq.dashboard import create_app
from pgq.dashboard._security import check_bind
from pgq.errors import ConfigError
from tests.dashboard.conftest import Scene

if TYPE_CHECKING:
    from tests.tests_support import Conn

pytestmark = pytest.mark.anyio


async def token(http: httpx.AsyncClient, path: str = "/queues") -> str:
    """The CSRF token a page of the dashboard hands out (and its cookie, kept by the client)."""
    page = await http.get(path)
    m = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert m, "the page carries no form token"
    return m.group(1)


async def state_of(conn: Conn, job_id: int) -> str:
    return str(await conn.fetchval("SELECT state::text FROM pgq_jobs WHERE id = $1", job_id))


async def test_retry_a_discarded_job(http: httpx.AsyncClient, scene: Scene, conn: Conn) -> None:
    t = await token(http, f"/jobs/{scene.jobs.discarded}")
    r = await http.post(
        f"/jobs/{scene.jobs.discarded}/retry",
        data={"csrf_token": t, "next": f"/jobs/{scene.jobs.discarded}"},
    )
    assert r.status_code == 303
    assert r.headers["location"] == f"/jobs/{scene.jobs.discarded}?done=retry&n=1"
    assert await state_of(conn, scene.jobs.discarded) == "available"
    page = await http.get(r.headers["location"])
    assert "Retried 1 job(s)" in page.text


async def test_retrying_a_job_whose_unique_key_was_taken_says_it_was_not_retried(
    http: httpx.AsyncClient, client: pgq.Client, conn: Conn
) -> None:
    first = await client.enqueue("t", unique_key="nightly")
    await conn.execute(
        "UPDATE pgq_jobs SET state = 'discarded', finalized_at = now() WHERE id = $1", first.id
    )
    await client.enqueue("t", unique_key="nightly")
    t = await token(http, f"/jobs/{first.id}")
    r = await http.post(f"/jobs/{first.id}/retry", data={"csrf_token": t})
    assert r.status_code == 303
    assert r.headers["location"] == f"/jobs/{first.id}?done=retry_none"
    assert await state_of(conn, first.id) == "discarded"
    page = await http.get(r.headers["location"])
    assert "Not retried: another job has taken its unique key" in page.text
    assert 'class="notice warning"' in page.text


async def test_a_post_without_the_token_changes_nothing(
    http: httpx.AsyncClient, scene: Scene, conn: Conn
) -> None:
    await token(http)  # the cookie is set; the form field is what is missing
    r = await http.post(f"/jobs/{scene.jobs.discarded}/retry", data={"next": "/"})
    assert r.status_code == 403 and "security token" in r.text
    r = await http.post(f"/jobs/{scene.jobs.discarded}/retry", data={"csrf_token": "guess"})
    assert r.status_code == 403
    assert await state_of(conn, scene.jobs.discarded) == "discarded"


async def test_a_post_from_another_site_is_refused(
    http: httpx.AsyncClient, scene: Scene, conn: Conn
) -> None:
    t = await token(http)
    r = await http.post(
        f"/jobs/{scene.jobs.discarded}/delete",
        data={"csrf_token": t},
        headers={"origin": "http://evil.example"},
    )
    assert r.status_code == 403 and "another site" in r.text
    assert await state_of(conn, scene.jobs.discarded) == "discarded"


async def test_a_redirect_never_leaves_the_dashboard(http: httpx.AsyncClient, scene: Scene) -> None:
    t = await token(http)
    for target in ("https://evil.example/", "//evil.example/x", "/\\evil.example"):
        r = await http.post(
            f"/jobs/{scene.jobs.retryable}/retry", data={"csrf_token": t, "next": target}
        )
        assert r.status_code == 303
        assert r.headers["location"].startswith(f"/jobs/{scene.jobs.retryable}?")


async def test_delete_skips_a_running_job_and_cancel_requests_it(
    http: httpx.AsyncClient, scene: Scene, conn: Conn
) -> None:
    t = await token(http)
    r = await http.post(f"/jobs/{scene.running}/delete", data={"csrf_token": t})
    assert r.status_code == 303 and "n=0" in r.headers["location"]
    assert await state_of(conn, scene.running) == "running"
    r = await http.post(f"/jobs/{scene.running}/cancel", data={"csrf_token": t})
    assert "n=1" in r.headers["location"]
    from tests.tests_support import until

    async def cancelled() -> bool:
        return await state_of(conn, scene.running) == "cancelled"

    await until(cancelled)  # its worker heard of it and stopped the task


async def test_bulk_retry_by_filter_counts_first_and_touches_only_what_it_counted(
    http: httpx.AsyncClient, scene: Scene, conn: Conn
) -> None:
    confirm = await http.get("/jobs/bulk?action=retry&state=discarded&queue=emails")
    assert confirm.status_code == 200
    assert "Retry 2 jobs?" in confirm.text
    form = dict(re.findall(r'name="(\w+)" value="([^"]*)"', confirm.text))
    # A job discarded after the count was shown is not part of what was confirmed.
    late = await conn.fetchval(
        "INSERT INTO pgq_jobs (queue, task, state, finalized_at) "
        "VALUES ('emails', 'broken', 'discarded', now()) RETURNING id"
    )
    fields = {k: html.unescape(v) for k, v in form.items()}
    r = await http.post("/jobs/bulk", data=fields)
    assert r.status_code == 303 and "done=retry&n=2" in r.headers["location"]
    assert await state_of(conn, scene.jobs.discarded) == "available"
    assert await state_of(conn, scene.jobs.xss) == "available"
    assert await state_of(conn, late) == "discarded"


async def test_bulk_delete_by_args_filter(
    http: httpx.AsyncClient, scene: Scene, conn: Conn
) -> None:
    confirm = await http.get(
        "/jobs/bulk", params={"action": "delete", "task": "send_email", "tag": "welcome"}
    )
    assert "Delete 12 jobs?" in confirm.text
    fields = {
        k: html.unescape(v) for k, v in re.findall(r'name="(\w+)" value="([^"]*)"', confirm.text)
    }
    r = await http.post("/jobs/bulk", data=fields)
    assert "done=delete&n=12" in r.headers["location"]
    assert await conn.fetchval("SELECT count(*) FROM pgq_jobs WHERE 'welcome' = ANY(tags)") == 0


async def test_pause_and_resume_a_queue(http: httpx.AsyncClient, scene: Scene, conn: Conn) -> None:
    t = await token(http, "/queues")
    r = await http.post("/queues/pause", data={"csrf_token": t, "queue": "held"})
    assert r.status_code == 303
    assert await conn.fetchval("SELECT paused_at IS NOT NULL FROM pgq_queues WHERE name = 'held'")
    assert "Paused queue held" in (await http.get(r.headers["location"])).text
    r = await http.post("/queues/resume", data={"csrf_token": t, "queue": "held"})
    assert await conn.fetchval("SELECT paused_at IS NULL FROM pgq_queues WHERE name = 'held'")
    r = await http.post("/queues/pause", data={"csrf_token": t, "queue": "no-such-queue"})
    assert r.status_code == 404


async def test_read_only_shows_no_action_and_refuses_every_post(scene: Scene, conn: Conn) -> None:
    dashboard = create_app(scene.dsn, read_only=True)
    transport = httpx.ASGITransport(app=dashboard)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        page = await c.get(f"/jobs/{scene.jobs.discarded}")
        assert "read-only" in page.text and "/retry" not in page.text
        assert "Pause" not in (await c.get("/queues")).text
        cookie = c.cookies.get("pgq_csrf")
        r = await c.post(f"/jobs/{scene.jobs.discarded}/retry", data={"csrf_token": cookie})
        assert r.status_code == 403
    await dashboard.aclose()
    assert await state_of(conn, scene.jobs.discarded) == "discarded"


async def test_basic_auth_when_configured(scene: Scene) -> None:
    dashboard = create_app(scene.dsn, auth="ops:correct horse")
    transport = httpx.ASGITransport(app=dashboard)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        r = await c.get("/")
        assert r.status_code == 401 and "Basic" in r.headers["www-authenticate"]
        bad = base64.b64encode(b"ops:wrong").decode()
        assert (await c.get("/", headers={"authorization": f"Basic {bad}"})).status_code == 401
        assert (await c.get("/static/pgq.css")).status_code == 401
        r = await c.get("/", auth=("ops", "correct horse"))
        assert r.status_code == 200
    await dashboard.aclose()


def test_a_public_bind_needs_a_password_or_read_only() -> None:
    from pgq.dashboard._security import Credentials

    check_bind("127.0.0.1", auth=None, read_only=False)
    check_bind("::1", auth=None, read_only=False)
    check_bind("localhost", auth=None, read_only=False)
    with pytest.raises(ConfigError, match="without a password"):
        check_bind("0.0.0.0", auth=None, read_only=False)
    with pytest.raises(ConfigError, match="--auth USER:PASSWORD"):
        check_bind("10.1.2.3", auth=None, read_only=False)
    check_bind("0.0.0.0", auth=Credentials("a", "b"), read_only=False)
    check_bind("0.0.0.0", auth=None, read_only=True)
    with pytest.raises(ConfigError, match="USER:PASSWORD"):
        Credentials.parse("no-colon")


async def test_mounted_under_a_prefix_in_a_host_app(scene: Scene, conn: Conn) -> None:
    async with pgq.Client(scene.dsn) as client:
        dashboard = create_app(client=client)
        host = Starlette(routes=[Mount("/ops/pgq", app=dashboard)])
        transport = httpx.ASGITransport(app=host)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            page = await c.get("/ops/pgq/jobs?state=discarded")
            assert page.status_code == 200
            assert f'href="/ops/pgq/jobs/{scene.jobs.discarded}"' in page.text
            assert 'href="/ops/pgq/static/pgq.css"' in page.text
            assert (await c.get("/ops/pgq/static/htmx.min.js")).status_code == 200
            page = await c.get(f"/ops/pgq/jobs/{scene.jobs.discarded}")
            assert f'action="/ops/pgq/jobs/{scene.jobs.discarded}/retry"' in page.text
            t = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
            assert t is not None
            r = await c.post(
                f"/ops/pgq/jobs/{scene.jobs.discarded}/retry",
                data={"csrf_token": t.group(1), "next": f"/ops/pgq/jobs/{scene.jobs.discarded}"},
            )
            assert r.headers["location"] == f"/ops/pgq/jobs/{scene.jobs.discarded}?done=retry&n=1"
    assert await state_of(conn, scene.jobs.discarded) == "available"
