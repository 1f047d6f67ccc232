"""pgq's own connections: the array codecs they are given up front (instead of asking the
server about each array type on every new connection) read and write what asyncpg's own
would, and neither a worker's run nor a client's enqueues and listings, nor retention, ask
the server about any type."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import anyio
import asyncpg
import asyncpg.connection
import pytest

import pgq
from pgq._db import maintenance
from pgq._db.connections import connect, create_pool

pytestmark = pytest.mark.anyio

# Per declared array type: values with NULL elements, an empty array, and NULL itself.
VALUES: dict[str, list[Any]] = {
    "bool[]": [[True, None, False], [], None],
    "int4[]": [[1, -(2**31), 2**31 - 1, None], [], None],
    "text[]": [["a", "", 'é,"}{', None], [], None],
    "int8[]": [[1, -(2**63), 2**63 - 1, None], [], None],
    "float8[]": [[1.5, -0.0, float("inf"), None], [], None],
    "timestamptz[]": [[datetime(2026, 12, 1, 12, 30, 1, 5, tzinfo=UTC), None], [], None],
    "uuid[]": [[uuid.UUID(int=1), None], [], None],
}


@pytest.fixture
def introspections(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The type oids asyncpg asks the server about, by every connection in this test."""
    seen: list[list[int]] = []
    original = getattr(asyncpg.connection.Connection, "_introspect_types")  # noqa: B009

    async def observed(self: Any, typeoids: Any, *args: Any) -> Any:
        seen.append(sorted(typeoids))
        return await original(self, typeoids, *args)

    monkeypatch.setattr(asyncpg.connection.Connection, "_introspect_types", observed)
    return seen


async def round_trips(conn: Any) -> dict[str, list[Any]]:
    """Each value of VALUES sent as a parameter and read back, per type."""
    return {
        kind: [await conn.fetchval(f"SELECT $1::{kind}", v) for v in values]
        for kind, values in VALUES.items()
    }


async def test_declared_array_codecs_read_and_write_as_asyncpgs_own(
    dsn: str, introspections: list[list[int]]
) -> None:
    plain = await asyncpg.connect(dsn)
    try:
        expected = await round_trips(plain)
    finally:
        await plain.close()
    assert introspections, "a plain asyncpg connection asks the server about array types"
    assert expected == VALUES
    introspections.clear()

    own = await connect(dsn)
    try:
        assert await round_trips(own) == expected
        # Arrays of arrays.
        assert await own.fetchval("SELECT $1::int8[]", [[1, 2], [3, None]]) == [[1, 2], [3, None]]
    finally:
        await own.close()
    pool = await create_pool(dsn, min_size=2, max_size=2)
    try:
        async with pool.acquire() as a, pool.acquire() as b:
            assert await round_trips(a) == expected
            assert await round_trips(b) == expected
    finally:
        await pool.close()
    assert introspections == []


async def test_a_worker_and_a_client_ask_the_server_about_no_type(
    dsn: str, introspections: list[list[int]]
) -> None:
    app = pgq.App()
    done: list[int] = []

    @app.task
    async def add(ctx: pgq.JobContext, a: int) -> int:
        done.append(a)
        if a == 2:
            raise ValueError("a failed attempt has its own outcome statement")
        return a + 1

    async with pgq.Client(dsn, app=app) as client:
        await client.enqueue("add", {"a": 0})
        await client.enqueue_many([add.spec(a=1), add.spec(a=2), add.spec(a=3)])
        with anyio.fail_after(30):
            await pgq.Worker(app, dsn, concurrency=4).run(burst=True)
        # Listings and retention pass job states, pgq's own enum, whose oid differs from
        # database to database: as text, cast in the statement, so asyncpg needs no codec.
        completed = await client.list_jobs(state=pgq.JobState.COMPLETED)
        left = await client.list_jobs()
        deleted = await maintenance.delete_finished(client.pool, pgq.JobState.COMPLETED, 0, 10)
        assert introspections == []
    assert sorted(done) == [0, 1, 2, 3]
    assert len(completed) == 3 and deleted == 3
    assert sorted(j.state.value for j in left) == ["completed"] * 3 + ["retryable"]


async def test_a_limited_claim_reads_its_jobs_without_asking_about_a_type(
    dsn: str, introspections: list[list[int]]
) -> None:
    """The limited claim returns its jobs as an array of anonymous records (tags and
    dependencies, arrays, inside each): read with the declared codecs, no question asked."""
    app = pgq.App()
    seen: list[tuple[int, list[str], list[int] | None]] = []

    @app.task(queue="limited")
    async def step(ctx: pgq.JobContext, i: int) -> None:
        seen.append((i, ctx.job.tags, ctx.job.depends_on))

    async with pgq.Client(dsn, app=app) as client:
        await client.set_queue_limits("limited", concurrency=2, key_concurrency=1)
        first = await client.enqueue("step", {"i": 0}, queue="limited", tags=["a", "b"])
        await client.enqueue("step", {"i": 1}, queue="limited", depends_on=[first], limit_key="k")
        with anyio.fail_after(30):
            await pgq.Worker(app, dsn, concurrency=4).run(burst=True)
        assert introspections == []
    assert seen == [(0, ["a", "b"], None), (1, [], [first.id])]
