"""A client's wait and its LISTEN connection, cut, stalled, cancelled or closed as the wait
begins to listen: the wait listens on another, or gives its connection back, and the client
still closes."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio
import anyio.abc
import anyio.lowlevel
import asyncpg
import pytest

import pgq
from pgq._db.connections import Pool
from tests.faults.proxy import Proxy
from tests.faults.workers import (
    upstream,
    via_proxy,
)
from tests.tests_support import until

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.timeout(180)]


@contextlib.asynccontextmanager
async def pool_via_proxy(dsn: str) -> AsyncIterator[tuple[Proxy, Pool]]:
    """A TCP proxy to the server and a pool of two connections through it, for the tests
    of a client's wait(); the proxy is healed before the pool closes."""
    proxy = Proxy(*upstream(dsn))
    async with anyio.create_task_group() as tg:
        port = await tg.start(proxy.run)
        pool = await asyncpg.create_pool(via_proxy(dsn, port), min_size=1, max_size=2)
        assert pool is not None
        try:
            yield proxy, pool
        finally:
            proxy.heal()
            with anyio.fail_after(30):
                await pool.close()
        tg.cancel_scope.cancel()


async def both_connections(pool: Pool) -> None:
    """Take both of the pool's connections at once: a place leaked by a wait would make
    this block."""
    with anyio.fail_after(10):
        async with pool.acquire() as a, pool.acquire() as b:
            assert await a.fetchval("SELECT 1") == await b.fetchval("SELECT 1") == 1


async def test_a_wait_whose_connection_is_cut_as_it_begins_to_listen_listens_on_another(
    dsn: str, db: asyncpg.Connection[asyncpg.Record]
) -> None:
    """The connection a waiter takes from its client's pool is cut by the network just as
    its LISTEN leaves (the bytes never reach the server): the wait gives that connection
    back, listens on a new one, and ends when the job does, rather than fail. (CI once
    found the race by ending the LISTEN's server process mid-statement.)"""
    result: list[pgq.Job] = []
    async with pool_via_proxy(dsn) as (proxy, pool), pgq.Client(pool=pool) as client:
        job = await client.enqueue("email", {"to": "a@example.com"})
        proxy.cut_at = b"LISTEN"

        async def waiting() -> None:
            result.append(await client.wait(job.id, timeout=60))

        async def listening() -> bool:
            return bool(
                await db.fetchval(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND query LIKE 'LISTEN%'"
                    " AND state = 'idle'"
                )
            )

        async with anyio.create_task_group() as waits:
            waits.start_soon(waiting)
            with anyio.fail_after(30):
                await proxy.cut_done.wait()
            await until(listening, limit_s=30)
            with anyio.fail_after(30):
                await client.cancel(job.id)
        # The lost connection's place is back in the pool: the listening one and a new one
        # fit in its two.
        with anyio.fail_after(10):
            async with pool.acquire() as spare:
                assert await spare.fetchval("SELECT 1") == 1
    assert result[0].state == pgq.JobState.CANCELLED
    assert proxy.cut_at is None  # the cut happened, once


async def test_a_wait_cancelled_while_it_begins_to_listen_gives_its_connection_back(
    dsn: str,
) -> None:
    """The network stalls the LISTEN of a waiter's connection, and the wait is cancelled
    meanwhile: the connection is ended and its place handed back, so the pool can still
    give both its connections and close (a leaked place would make close() wait forever)."""
    async with pool_via_proxy(dsn) as (proxy, pool), pgq.Client(pool=pool) as client:
        job = await client.enqueue("email", {"to": "a@example.com"})
        proxy.stall_at = b"LISTEN"
        async with anyio.create_task_group() as waits:
            waits.start_soon(client.wait, job.id)
            with anyio.fail_after(30):
                await proxy.stall_done.wait()
            waits.cancel_scope.cancel()
        proxy.heal()
        await both_connections(pool)


async def test_a_client_closed_while_a_wait_begins_to_listen_ends_that_connection(
    dsn: str,
) -> None:
    """The client is closed while a waiter's LISTEN is stalled by the network: close()
    returns without waiting on the network, the connection being set up is ended (its
    place back in the pool), and the wait raises ConfigError rather than listen again.
    (Before, close() found nothing to give back yet, and the connection stayed taken for
    good once the LISTEN went through.)"""
    failures: list[BaseException] = []
    async with pool_via_proxy(dsn) as (proxy, pool):
        client = pgq.Client(pool=pool)
        await client.open()
        job = await client.enqueue("email", {"to": "a@example.com"})
        proxy.stall_at = b"LISTEN"

        async def waiting() -> None:
            try:
                await client.wait(job.id, timeout=60)
            except pgq.ConfigError as exc:
                failures.append(exc)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as waits:
                waits.start_soon(waiting)
                await proxy.stall_done.wait()
                with anyio.fail_after(10):  # the LISTEN is still stalled
                    await client.close()
        proxy.heal()
        await both_connections(pool)
    assert len(failures) == 1
    assert "closed while a wait() was under way" in str(failures[0])


async def test_a_client_whose_listen_connection_stalls_still_closes(
    dsn: str, db: asyncpg.Connection[asyncpg.Record]
) -> None:
    """The network stalls the connection a client listens on for its waits, and the
    client is closed: its UNLISTEN gets no answer, so close() ends the connection after a
    second instead of waiting on the network, and its place is back in the pool."""
    async with pool_via_proxy(dsn) as (proxy, pool):
        client = pgq.Client(pool=pool)
        await client.open()
        job = await client.enqueue("email", {"to": "a@example.com"})
        await client.cancel(job.id)
        with anyio.fail_after(30):
            assert (await client.wait(job.id)).state is pgq.JobState.CANCELLED
        proxy.stall()
        with anyio.fail_after(10):
            await client.close()
        proxy.heal()
        await both_connections(pool)
