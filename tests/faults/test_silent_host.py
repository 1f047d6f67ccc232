"""A multi-host DSN whose first host is gone without a word: a powered-off machine (or a
cut network) answers no SYN, so a connection to it waits rather than fails. A worker must
still reach the primary listed after it within its heartbeat timeout, as libpq does (its
``connect_timeout`` applies to each host in turn).

asyncpg's connect timeout covers the whole host list: handed one budget, the silent host
spends it all and a fleet whose DSN lists a silently dead old primary first never reaches
the new one. pgq tries the hosts one at a time, each with the whole budget, the one that
answered last first; a limit around a connect (a heartbeat's, an election's) covers the
list; and a statement cut short on a silent host gives its connection up after a bounded
cancellation, so a pool's slot comes back.
"""

from __future__ import annotations

import contextlib
import socket
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import anyio
import pytest

import pgq
from pgq._db.connections import CONNECT_TIMEOUT_S, connect, connect_budget_s, create_pool
from pgq._worker.leader.elector import Elector
from tests.faults.cluster import Server, lone_server, primary_and_standby
from tests.faults.proxy import Proxy
from tests.faults.workers import upstream

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.timeout(60)]


@contextlib.contextmanager
def silent_port() -> Iterator[int]:
    """A loopback port that drops every new SYN: its listener's accept queue is full, and
    the kernel then drops SYNs without a reply, as a dead host's network does."""
    with contextlib.ExitStack() as stack:
        listener = stack.enter_context(socket.socket())
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = int(listener.getsockname()[1])
        for _ in range(4):  # fill the accept queue; never accepted
            filler = stack.enter_context(socket.socket())
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
        probe = stack.enter_context(socket.socket())
        probe.settimeout(0.5)
        silent = False
        try:
            probe.connect(("127.0.0.1", port))
        except TimeoutError:
            silent = True
        except OSError:
            pass
        if not silent:
            pytest.skip("this kernel answers SYNs past a full accept queue: no silent host")
        yield port


@pytest.fixture
def server() -> Iterator[Server]:
    with lone_server() as s:
        yield s


async def test_a_heartbeat_reaches_the_primary_past_a_silent_host(server: Server) -> None:
    with silent_port() as dead:
        dsn = (
            f"postgresql://postgres@127.0.0.1:{dead},127.0.0.1:{server.port}/postgres"
            "?target_session_attrs=read-write"
        )
        with anyio.fail_after(10):
            # the heartbeat's connect, with the default heartbeat_timeout
            conn = await connect(dsn, timeout_s=2.0)
        try:
            assert await conn.fetchval("SELECT inet_server_port()") == server.port
        finally:
            await conn.close()


async def test_the_host_that_answered_last_is_tried_first(server: Server) -> None:
    # Once the primary listed after a silent host has answered, the next connection goes
    # to it first: only the first connection after a failover waits out the silent host.
    with silent_port() as dead:
        dsn = (
            f"postgresql://postgres@127.0.0.1:{dead},127.0.0.1:{server.port}/postgres"
            "?target_session_attrs=read-write"
        )
        took = []
        for _ in range(3):
            began = anyio.current_time()
            with anyio.fail_after(20):
                conn = await connect(dsn, timeout_s=4.0)
            took.append(anyio.current_time() - began)
            await conn.close()
    assert took[0] >= 4.0, "the first connection waited for the silent host"
    assert max(took[1:]) < 4.0, took


async def test_prefer_standby_tries_each_host_in_turn_and_a_silent_one_once() -> None:
    # prefer-standby went to asyncpg whole: one budget for the list, spent by a silent host.
    with silent_port() as dead, primary_and_standby() as cluster:
        hosts = (
            f"127.0.0.1:{dead}",
            f"127.0.0.1:{cluster.primary_port}",
            f"127.0.0.1:{cluster.standby_port}",
        )
        for listed, lands_on in ((hosts, cluster.standby_port), (hosts[:2], cluster.primary_port)):
            dsn = f"postgresql://postgres@{','.join(listed)}/postgres"
            dsn += "?target_session_attrs=prefer-standby"
            began = anyio.current_time()
            with anyio.fail_after(connect_budget_s(dsn, 3.0) + 5):
                conn = await connect(dsn, timeout_s=3.0)
            try:
                assert await conn.fetchval("SELECT inet_server_port()") == lands_on, listed
                # The silent host was waited for once, not once for each pass.
                assert anyio.current_time() - began < 2 * 3.0, listed
            finally:
                await conn.close()


async def test_the_leader_is_elected_through_a_pool_that_connects_past_a_silent_host(
    dsn: str,
) -> None:
    # An election round's limit was one renewal interval, connect included: a pool's new
    # connection that waits out a silent host first never reached the next host in time.
    with silent_port() as dead:
        host, port = upstream(dsn)
        multi = listing(dsn, f"127.0.0.1:{dead}", f"{host}:{port}")
        pool = await create_pool(multi, min_size=0, max_size=1, timeout_s=3.0)
        try:
            elector = Elector(
                pool, worker_id=uuid.uuid4(), worker_name="past-silence", ttl_s=6.0,
                connect_s=connect_budget_s(multi, 3.0),
            )  # fmt: skip
            with anyio.fail_after(15):
                assert await elector.attempt(), "elected on the pool's first connection"
        finally:
            await pool.close()


def test_a_connect_budget_covers_every_host_of_the_list() -> None:
    one = "postgresql://u@db1/app"
    assert connect_budget_s(one, 2.0) == 2.0
    assert connect_budget_s("postgresql://u@db1,db2:5433,db3/app", 2.0) == 6.0
    assert connect_budget_s("postgresql://u@db1,db2/app?connect_timeout=5") == 10.0
    assert (
        connect_budget_s("postgresql://u@db1,db2/app?target_session_attrs=prefer-standby", 2.0)
        == 8.0
    )
    assert connect_budget_s(one) == CONNECT_TIMEOUT_S


def listing(dsn: str, *hosts: str) -> str:
    """``dsn`` with ``hosts`` (``host:port`` each) in place of its own host, asking for a
    writable server."""
    parts = urlsplit(dsn)
    if "host=/" in parts.query:
        pytest.skip("the embedded server listens on a Unix socket only: no host list to make")
    user, _, _host = parts.netloc.rpartition("@")
    netloc = ",".join(hosts)
    query = "&".join(q for q in [parts.query, "target_session_attrs=read-write"] if q)
    return urlunsplit(parts._replace(netloc=f"{user}@{netloc}" if user else netloc, query=query))


def noting_app(done: set[int]) -> pgq.App:
    app = pgq.App()

    @app.task
    async def note(ctx: pgq.JobContext, n: int) -> None:
        done.add(n)

    return app


@pytest.mark.timeout(90)
async def test_a_default_worker_runs_its_jobs_past_a_silent_first_host(dsn: str) -> None:
    # Each new connection of the worker's pools used to wait out the silent host first,
    # and its heartbeat never landed (one host's budget for the whole list): none of 200
    # jobs ran in 30 s. The host that answered is tried first once it has answered.
    done: set[int] = set()
    app = noting_app(done)
    async with pgq.Client(dsn, app=app) as client:
        await client.enqueue_many([app.get("note").spec(n=i) for i in range(200)])
    with silent_port() as dead:
        host, port = upstream(dsn)
        multi = listing(dsn, f"127.0.0.1:{dead}", f"{host}:{port}")
        with anyio.fail_after(30):
            async with pgq.Worker(app, multi) as worker:
                while len(done) < 200:  # noqa: ASYNC110 - the jobs come at their own pace
                    await anyio.sleep(0.05)
                assert all(p["healthy"] for p in worker.stats()["producers"])


@pytest.mark.timeout(120)
async def test_a_fleet_reaches_the_new_primary_when_the_old_one_listed_first_goes_silent(
    dsn: str,
) -> None:
    # A failover as a fleet sees it when the old primary's machine loses power: the host
    # listed first accepts TCP and never answers again (a proxy that stalls), and the
    # next host serves. Every heartbeat used to spend its whole budget on the silent host:
    # none landed, every worker fenced itself and new jobs sat available.
    done: set[int] = set()
    app = noting_app(done)
    old, new = Proxy(*upstream(dsn)), Proxy(*upstream(dsn))
    async with anyio.create_task_group() as tg, pgq.Client(dsn, app=app) as client:
        multi = listing(
            dsn, f"127.0.0.1:{await tg.start(old.run)}", f"127.0.0.1:{await tg.start(new.run)}"
        )
        fleet = [pgq.Worker(app, multi, name=f"w{i}") for i in range(2)]
        async with contextlib.AsyncExitStack() as stack:
            for worker in fleet:
                await stack.enter_async_context(worker)
            await client.enqueue_many([app.get("note").spec(n=i) for i in range(20)])
            with anyio.fail_after(30):
                while len(done) < 20:  # noqa: ASYNC110 - the jobs come at their own pace
                    await anyio.sleep(0.05)
            assert new.connections == 0, "the first host served until it went silent"
            beats = [w.stats()["heartbeats"] for w in fleet]
            old.stall()
            await client.enqueue_many([app.get("note").spec(n=i) for i in range(20, 220)])
            with anyio.fail_after(60):
                while len(done) < 220:  # noqa: ASYNC110 - the jobs come at their own pace
                    await anyio.sleep(0.05)
            for worker, before in zip(fleet, beats, strict=True):
                stats = worker.stats()
                assert stats["heartbeats"] > before, worker.name
                assert all(p["healthy"] for p in stats["producers"]), worker.name
        tg.cancel_scope.cancel()
