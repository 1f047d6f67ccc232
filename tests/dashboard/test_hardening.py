"""The dashboard against what an outsider sends: a Host it is not served as (DNS rebinding),
bodies past its limit, and bad filters and forms; every error page carries the headers of
every page. (The browser's side of rebinding is in test_browser.py.)"""

from __future__ import annotations

import html
import json
import re
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import pytest

import pgq
from pgq.dashboard import Dashboard, create_app
from pgq.dashboard._security import MAX_BODY_BYTES

if TYPE_CHECKING:
    from tests.tests_support import Conn

pytestmark = pytest.mark.anyio

#: The headers every response of the dashboard carries, error pages included.
SECURITY_HEADERS = (
    "content-security-policy",
    "x-frame-options",
    "x-content-type-options",
    "referrer-policy",
    "cache-control",
)


@pytest.fixture
async def dash(dsn: str) -> AsyncIterator[Dashboard]:
    dashboard = create_app(dsn)
    yield dashboard
    await dashboard.aclose()


def http_for(app: Dashboard, base: str = "http://127.0.0.1") -> httpx.AsyncClient:
    # raise_app_exceptions=False: a 500's exception reaches the server (which logs it) after
    # the page is sent, as under uvicorn.
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url=base)


async def token(http: httpx.AsyncClient, path: str) -> str:
    page = await http.get(path)
    m = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert m, page.text[:500]
    return m.group(1)


async def discarded_jobs(client: pgq.Client, n: int) -> list[int]:
    jobs = await client.enqueue_many([pgq.JobSpec("t", {"i": i}) for i in range(n)])
    await client.cancel_many([j.id for j in jobs])
    return [j.id for j in jobs]


# ---------------------------------------------------------------- 1. DNS rebinding


async def test_a_host_it_is_not_served_as_gets_400_before_anything_runs(
    dash: Dashboard, client: pgq.Client, conn: Conn
) -> None:
    ids = await discarded_jobs(client, 2)
    # A page served from a name that rebinds to 127.0.0.1: its requests carry that name as
    # Host, and as Origin.
    async with http_for(dash, "http://rebind.attacker.example:8181") as evil:
        page = await evil.get("/jobs/bulk?action=delete&state=cancelled")
        assert page.status_code == 400
        assert "--allowed-hosts" in html.unescape(page.text)
        for name in SECURITY_HEADERS:
            assert name in page.headers, name
        # What the page would have handed out (the CSRF token, its cookie): none.
        stolen = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
        assert stolen is None and "set-cookie" not in page.headers
        r = await evil.post(
            "/jobs/bulk",
            data={"action": "delete", "state": "cancelled", "up_to": str(max(ids)),
                  "csrf_token": "stolen"},
            headers={"origin": "http://rebind.attacker.example:8181",
                     "cookie": "pgq_csrf=stolen"},
        )  # fmt: skip
        assert r.status_code == 400
    assert await conn.fetchval("SELECT count(*) FROM pgq_jobs WHERE id = ANY($1)", ids) == 2
    for base in ("http://127.0.0.1:8181", "http://localhost", "http://[::1]:8181",
                 "http://127.0.0.2"):  # fmt: skip
        async with http_for(dash, base) as ok:
            assert (await ok.get("/queues")).status_code == 200, base


async def test_allowed_hosts_names_more_and_auth_turns_the_default_off(
    dsn: str, client: pgq.Client
) -> None:
    cases: list[tuple[dict[str, Any], dict[str, int]]] = [
        ({"allowed_hosts": ["dash.example", "*.corp.example"]},
         {"dash.example": 200, "a.corp.example:80": 200, "corp.example": 400,
          "other.example": 400, "localhost": 200}),
        ({"allowed_hosts": ["*"]}, {"anything.example": 200}),
        ({"auth": "ops:pw"}, {"anything.example": 200}),
        ({"auth": "ops:pw", "allowed_hosts": ["dash.example"]},
         {"dash.example": 200, "anything.example": 400}),
        ({"allowed_hosts": ["0.0.0.0"]}, {"10.1.2.3:8181": 200, "[fd00::1]": 200,
                                           "rebind.example": 400}),
    ]  # fmt: skip
    for options, hosts in cases:
        dashboard = create_app(dsn, **options)
        try:
            async with http_for(dashboard) as c:
                for host, status in hosts.items():
                    r = await c.get("/queues", headers={"host": host}, auth=("ops", "pw"))
                    assert r.status_code == status, (options, host)
        finally:
            await dashboard.aclose()


async def test_the_health_port_answers_only_ip_addresses_and_localhost() -> None:
    from pgq._worker.health import serve

    async def ask(port: int, host: str | None) -> bytes:
        async with await anyio.connect_tcp("127.0.0.1", port) as s:
            head = "GET /healthz HTTP/1.1\r\n" + (f"Host: {host}\r\n" if host else "")
            await s.send((head + "\r\n").encode())
            data = b""
            with anyio.fail_after(10):
                while True:
                    try:
                        data += await s.receive()
                    except anyio.EndOfStream:
                        return data

    async with anyio.create_task_group() as tg:
        port = await tg.start(lambda task_status: serve(
            lambda: (True, {"ok": True}), port=0, task_status=task_status))  # fmt: skip
        for host in ("127.0.0.1:9000", "localhost", "[::1]:9000", "10.0.0.7", None):
            assert (await ask(port, host)).startswith(b"HTTP/1.1 200"), host
        for host in ("rebind.attacker.example:9000", "Localhost.evil", "pod.internal"):
            reply = await ask(port, host)
            assert reply.startswith(b"HTTP/1.1 400"), host
            assert b"IP address or localhost" in reply
        tg.cancel_scope.cancel()


# ---------------------------------------------------------------- 2. bad input: 400


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("args=%7B%22a%22%3ANaN%7D", "NaN is not a JSON number"),
        ("args=%7B%22a%22%3AInfinity%7D", "Infinity is not a JSON number"),
        # json.loads refuses it, or, where something raised the recursion limit (mypy,
        # run in-process by another test), pgq's depth limit does.
        ("args=" + "%7B%22a%22%3A" * 3000 + "1" + "%7D" * 3000, "too deeply"),
        ("args=%7B%22a%22%3A%22%5Cu0000%22%7D", "NUL character"),
        ("args=%7B%22a%22%3A%22%5Cud800%22%7D", "lone surrogate"),
        ("queue=%00", "queue: invalid queue name"),
        ("task=%00", "task: invalid task name"),
        ("tag=%00", "tag cannot hold a NUL"),
        ("before=99999999999999999999999", "before must be a whole number from 0 to"),
    ],
)
async def test_a_bad_filter_is_a_400_page_that_says_what_to_fix(
    dash: Dashboard, query: str, says: str
) -> None:
    async with http_for(dash) as c:
        page = await c.get(f"/jobs?{query}")
        assert page.status_code == 400, page.text[:300]
        assert says in html.unescape(page.text)
        confirm = await c.get(f"/jobs/bulk?action=cancel&{query}")
        if not query.startswith("before"):
            assert confirm.status_code == 400 and says in html.unescape(confirm.text)


async def test_bad_forms_are_400_pages_and_change_nothing(
    dash: Dashboard, client: pgq.Client, conn: Conn
) -> None:
    ids = await discarded_jobs(client, 2)
    async with http_for(dash) as c:
        t = await token(c, f"/jobs/{ids[0]}")
        r = await c.post("/jobs/bulk", data={
            "action": "delete", "state": "cancelled", "up_to": "99999999999999999999999",
            "csrf_token": t,
        })  # fmt: skip
        assert r.status_code == 400
        assert "up_to" in html.unescape(r.text) and "start again" in r.text
        r = await c.post("/queues/pause", data={"queue": "\x00", "csrf_token": t})
        assert r.status_code == 400 and "invalid queue name" in html.unescape(r.text)
        r = await c.post("/jobs/bulk", data={
            "action": "delete", "args": '{"a": NaN}', "up_to": "5", "csrf_token": t,
        })  # fmt: skip
        assert r.status_code == 400 and "NaN" in r.text
        page = await c.get("/jobs?done=delete&n=" + "9" * 5000)
        assert page.status_code == 200
    assert await conn.fetchval("SELECT count(*) FROM pgq_jobs WHERE id = ANY($1)", ids) == 2
    assert await conn.fetchval("SELECT count(*) FROM pgq_queues WHERE paused_at IS NOT NULL") == 0


async def test_a_job_id_of_thousands_of_digits_is_a_404_page(dash: Dashboard) -> None:
    long_id = "9" * 5000  # past what int() takes from text
    async with http_for(dash) as c:
        for path in (f"/jobs/{long_id}", f"/jobs/{long_id}/args.json"):
            assert (await c.get(path)).status_code == 404, path
        assert (await c.post(f"/jobs/{long_id}/retry")).status_code == 404


async def test_every_error_page_carries_the_same_headers(
    dash: Dashboard, client: pgq.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = await client.enqueue("t")

    def broken(job: pgq.Job) -> list[object]:
        raise RuntimeError("a bug in a page")

    # A bug stands for every unexpected error: it reaches Starlette's last-resort handler.
    monkeypatch.setattr("pgq.dashboard._pages.timeline", broken)
    async with http_for(dash) as c:
        pages = {
            200: await c.get("/queues"),
            400: await c.get("/jobs?queue=%00"),
            404: await c.get("/no/such/page"),
            405: await c.get("/queues/pause"),
            413: await c.post("/queues/pause", content=b"q" * (MAX_BODY_BYTES + 1),
                              headers={"content-type": "application/x-www-form-urlencoded"}),
            500: await c.get(f"/jobs/{job.id}"),
        }  # fmt: skip
    for status, page in pages.items():
        assert page.status_code == status
        assert page.headers["content-type"] == "text/html; charset=utf-8", status
        for name in SECURITY_HEADERS:
            assert page.headers[name] == pages[200].headers[name], (status, name)
    assert "a bug in a page" not in pages[500].text
    assert "its log has the traceback" in pages[500].text


# ---------------------------------------------------------------- 3. bodies


async def test_a_body_is_refused_at_the_limit_as_it_streams(
    dsn: str, client: pgq.Client, conn: Conn
) -> None:
    ids = await discarded_jobs(client, 1)
    for options in ({}, {"auth": "ops:pw"}):
        dashboard = create_app(dsn, **options)
        sent = 0

        async def body() -> AsyncIterator[bytes]:
            nonlocal sent
            chunk = b"x" * 65536
            for _ in range(400 * 16):  # 400 MB, were it all read
                sent += len(chunk)
                yield chunk

        try:
            async with http_for(dashboard) as c:
                # Chunked, without a length: refused once the limit is passed.
                sent = 0
                r = await c.post(f"/jobs/{ids[0]}/cancel", content=body(), auth=("ops", "pw"))
                assert r.status_code == 413 and "larger than 65,536 bytes" in r.text
                assert sent <= MAX_BODY_BYTES + 2 * 65536
                # A length past the limit: refused before any of it is read, or auth.
                sent = 0
                r = await c.post(
                    f"/jobs/{ids[0]}/cancel", content=body(),
                    headers={"content-length": str(400 * 2**20)},
                )  # fmt: skip
                assert r.status_code == 413 and sent <= 65536
                for name in SECURITY_HEADERS:
                    assert name in r.headers
        finally:
            await dashboard.aclose()
    assert await conn.fetchval("SELECT state::text FROM pgq_jobs WHERE id = $1", ids[0]) == (
        "cancelled"
    )


# ---------------------------------------------------------------- 4. bounded pages


async def test_pages_render_a_bounded_preview_of_any_value_and_download_it_whole(
    dash: Dashboard, client: pgq.Client, conn: Conn
) -> None:
    big = "x" * 5_000_000  # a 5 MB argument: pgq accepts it (jsonb holds 256 MB)
    job = await client.enqueue("t", {"blob": big, "n": 1}, metadata={"note": "m" * 100_000})
    # Rows written before tags were bounded (or by hand): 1,000 tags of 1,000 characters,
    # and 300 failed attempts with long messages.
    await conn.execute(
        "UPDATE pgq_jobs SET tags = array_fill(repeat('t', 1000), ARRAY[1000]), errors = ("
        " SELECT jsonb_agg(jsonb_build_object('attempt', i, 'kind', 'exception',"
        "  'message', repeat('e', 20000), 'traceback', repeat('b', 60000)))"
        " FROM generate_series(1, 300) i) WHERE id = $1",
        job.id,
    )
    async with http_for(dash) as c:
        page = await c.get(f"/jobs/{job.id}")
        assert page.status_code == 200
        assert len(page.content) < 600_000, len(page.content)  # 3 GB of HTML before
        text = html.unescape(page.text)
        size = len(json.dumps({"blob": big, "n": 1}, separators=(",", ":")))
        assert f"Showing the start of {size:,} bytes of JSON" in text
        assert f'href="/jobs/{job.id}/args.json"' in page.text
        assert "and 968 more" in text and "all 1,000 tags" in text
        assert "251 earlier events not shown" in text  # of 301: the enqueue, and 300 attempts
        assert "(20,000 characters in all)" in text and "(60,000 characters in all)" in text
        assert f'href="/jobs/{job.id}/errors.json"' in page.text
        # The live refresh swaps the head and timeline: the values are not even encoded.
        partial = await c.get(f"/jobs/{job.id}", headers={"hx-request": "true"})
        assert "Showing the start" not in partial.text and len(partial.content) < 600_000
        listing = await c.get("/jobs")
        assert listing.status_code == 200 and len(listing.content) < 50_000
        assert "+995" in listing.text
        # The whole value, on demand.
        whole = await c.get(f"/jobs/{job.id}/args.json")
        assert whole.status_code == 200
        assert whole.headers["content-type"] == "application/json"
        assert "attachment" in whole.headers["content-disposition"]
        assert whole.json() == {"blob": big, "n": 1}
        assert len((await c.get(f"/jobs/{job.id}/tags.json")).json()) == 1000
        assert len((await c.get(f"/jobs/{job.id}/errors.json")).json()) == 300
        assert (await c.get(f"/jobs/{job.id}/nope.json")).status_code == 404
        assert (await c.get("/jobs/99999999999/args.json")).status_code == 404


def test_pgq_dashboard_answers_its_bind_address_and_the_hosts_it_is_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pgq._cli.dashboard_command import allowed_hosts
    from pgq._cli.parser import build_parser

    def hosts(*argv: str) -> list[str] | None:
        return allowed_hosts(build_parser().parse_args(["dashboard", *argv]))

    assert hosts() == ["127.0.0.1"]
    assert hosts("--host", "10.0.0.5", "--read-only") == ["10.0.0.5"]
    assert hosts("--auth", "ops:pw") is None  # any host: no credentials follow a rebinding
    assert hosts("--auth", "ops:pw", "--allowed-hosts", "a.example, *.b.example") == [
        "a.example", "*.b.example", "127.0.0.1"
    ]  # fmt: skip
    monkeypatch.setenv("PGQ_DASHBOARD_ALLOWED_HOSTS", "dash.example")
    assert hosts() == ["dash.example", "127.0.0.1"]


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("https://dash.example", "it is a URL: give its host alone"),
        ("dash.example/jobs", "it is a URL: give its host alone"),
        ("dash.example:8181", "a name with a port: a Host's port is not compared"),
        ("[::1]:8181", "a name with a port"),
        ("dash example", "a name with a space in it"),
        ("*.", "a suffix with no name after '*.'"),
        ("a.*.example", "a '*' where only a leading '*.'"),
        ("-dash", "not a host name, a suffix or an IP address"),
    ],
)
def test_an_allowed_host_that_can_never_match_is_refused_saying_what_would(
    given: str, says: str, dsn: str, python: str, tmp_path: Any
) -> None:
    """Each would be kept and never match a Host header, so the page would answer 400 to
    the very name it was told to serve: refused at construction, and by `pgq dashboard`."""
    import subprocess

    with pytest.raises(pgq.ConfigError, match="can never match a request's Host") as info:
        create_app(dsn, allowed_hosts=["ok.example", given])
    assert says in str(info.value) and repr(given) in str(info.value)
    assert "*.example.com" in str(info.value), "says what a valid value looks like"
    out = subprocess.run(
        [python, "-m", "pgq", "dashboard", "--dsn", dsn, "--allowed-hosts", f"ok.example,{given}"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith("pgq: error: allowed_hosts (--allowed-hosts, "), out.stderr


def test_every_kind_of_allowed_host_that_can_match_is_taken(dsn: str) -> None:
    for given in ("dash.example", "dash.example.", "my_service", "*.example.com", "*",
                  "10.0.0.5", "[::1]", "::1", "0.0.0.0", " Dash.Example ", ""):  # fmt: skip
        create_app(dsn, allowed_hosts=[given])
