"""A worker host cut off from the network: `pgq worker` processes in network namespaces
joined by veth pairs, reaching Postgres through forwarders on the host side; one namespace's
link goes down mid-job. The cut worker fences itself before its peer may judge it stale, its
jobs are rescued after stale_after, its late outcomes are rejected once the link is back, and
it claims again."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import anyio
import asyncpg
import pytest

from tests.faults.checks import all_completed, assert_exactly_once, enqueue, running_under
from tests.faults.netns import Namespace, namespace
from tests.faults.proxy import Proxy
from tests.faults.workers import SHORT, WorkerProcess, upstream, wait_registered
from tests.tests_support import until

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.timeout(180)]

FENCED = re.compile(r"heartbeats failed in a row .* claiming nothing until one succeeds")


@pytest.fixture
def hosts() -> Iterator[tuple[Namespace, Namespace]]:
    with namespace(0) as a, namespace(1) as b:
        yield a, b


def in_namespace(dsn: str, ns: Namespace, port: int) -> str:
    """``dsn`` as seen from inside ``ns``: through the forwarder on the host's end."""
    user = dsn.split("://", 1)[1].rpartition("@")[0]
    database = dsn.rsplit("/", 1)[1].split("?", 1)[0]
    return f"postgresql://{user + '@' if user else ''}{ns.host_ip}:{port}/{database}"


async def test_a_worker_host_cut_off_from_the_network_fences_itself_and_comes_back(
    hosts: tuple[Namespace, Namespace],
    dsn: str,
    db: asyncpg.Connection[asyncpg.Record],
    workers: list[WorkerProcess],
    tmp_path: Path,
) -> None:
    target = upstream(dsn)
    if target[0].startswith("/"):
        pytest.skip("the embedded server listens on a Unix socket: no host for a forwarder")
    a_ns, b_ns = hosts
    async with anyio.create_task_group() as tg:
        proxies = [Proxy(*target, listen_host=ns.host_ip) for ns in hosts]
        ports = [await tg.start(p.run) for p in proxies]

        def worker(name: str, ns: Namespace, port: int) -> WorkerProcess:
            inner = in_namespace(dsn, ns, port)
            return WorkerProcess(name, inner, tmp_path, SHORT, prefix=tuple(ns.exec_prefix()))

        peer = worker("ns-peer", b_ns, ports[1])
        cut = worker("ns-cut", a_ns, ports[0])
        workers += [peer, cut]
        peer.start()
        await wait_registered(db, "ns-peer")  # first: the peer leads and judges
        cut.start()
        await wait_registered(db, "ns-cut")
        # each worker reached Postgres across its namespace's link, through its forwarder
        assert all(p.connections >= 1 for p in proxies)
        ids = await enqueue(dsn, 10, 2.5)

        async def busy() -> bool:
            return await running_under(db, "ns-cut") >= 1

        await until(busy, limit_s=30)
        held = [
            r[0]
            for r in await db.fetch(
                "SELECT j.id FROM pgq_jobs j JOIN pgq_producers p ON p.id = j.producer_id"
                " WHERE j.state = 'running' AND p.worker_name = 'ns-cut'"
            )
        ]
        cut_at = anyio.current_time()
        a_ns.cut()

        async def fenced() -> bool:
            return FENCED.search(cut.output()) is not None

        await until(fenced, limit_s=SHORT["stale_after"])
        assert anyio.current_time() - cut_at < SHORT["stale_after"]

        await until(lambda: all_completed(db, ids), limit_s=60)
        silent = await db.fetch(
            "SELECT (errors -> 0 ->> 'silent_s')::float8 FROM pgq_jobs WHERE id = ANY($1)", held
        )
        assert silent and all(r[0] >= SHORT["stale_after"] for r in silent)

        a_ns.heal()

        async def rejected() -> bool:
            n = await db.fetchval(
                "SELECT coalesce(sum(rejected_outcomes), 0) FROM pgq_producers"
                " WHERE worker_name = 'ns-cut'"
            )
            return bool(n >= 1)

        await until(rejected, limit_s=30)
        await assert_exactly_once(db, ids)

        # Off the event loop: the peer's clean stop goes through a forwarder this loop runs.
        assert await anyio.to_thread.run_sync(peer.stop) == 0
        more = await enqueue(dsn, 3, 0.1)
        await until(lambda: all_completed(db, more), limit_s=30)
        ran = await db.fetch("SELECT DISTINCT worker FROM effects WHERE job_id = ANY($1)", more)
        assert {r[0] for r in ran} == {"ns-cut"}
        tg.cancel_scope.cancel()
