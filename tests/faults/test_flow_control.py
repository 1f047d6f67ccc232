"""Flow control across worker processes: a queue's global concurrency and rate limits hold at
every instant of a drain (sampled from the database throughout), whatever the number of
workers, and slots held by a worker killed with kill -9 come back through the rescuer."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import anyio
import asyncpg
import pytest

import pgq
from tests.faults.checks import all_completed, assert_exactly_once, enqueue
from tests.faults.workers import SHORT, WorkerProcess, wait_registered
from tests.tests_support import until

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.timeout(180)]


async def start_workers(
    db: asyncpg.Connection[asyncpg.Record], dsn: str, tmp_path: Path, n: int
) -> list[WorkerProcess]:
    procs = [WorkerProcess(f"fc-{i}", dsn, tmp_path, SHORT, concurrency=5) for i in range(n)]
    for p in procs:
        p.start()
    await wait_registered(db, *(p.name for p in procs))
    return procs


async def sample_running_until_done(
    db: asyncpg.Connection[asyncpg.Record], ids: list[int], limit_s: float
) -> list[int]:
    """The number of the queue's running jobs, read every few milliseconds until every job
    of ``ids`` has completed."""
    samples: list[int] = []
    with anyio.fail_after(limit_s):
        while True:
            row = await db.fetchrow(
                "SELECT count(*) FILTER (WHERE state = 'running') AS running,"
                " count(*) FILTER (WHERE state = 'completed' AND id = ANY($1)) AS done"
                " FROM pgq_jobs WHERE queue = 'default'",
                ids,
            )
            assert row is not None
            samples.append(row["running"])
            if row["done"] == len(ids):
                return samples
            await anyio.sleep(0.005)


async def kill_a_slot_holder(
    db: asyncpg.Connection[asyncpg.Record], procs: list[WorkerProcess]
) -> None:
    """kill -9 the worker that holds the most running jobs, once one holds any."""
    found: list[str] = []

    async def some_worker_holds_slots() -> bool:
        name: str | None = await db.fetchval(
            "SELECT p.worker_name FROM pgq_jobs j JOIN pgq_producers p ON p.id = j.producer_id"
            " WHERE j.state = 'running' GROUP BY p.worker_name ORDER BY count(*) DESC LIMIT 1"
        )
        found.extend([name] if name is not None else [])
        return name is not None

    await until(some_worker_holds_slots, limit_s=30)
    next(p for p in procs if p.name == found[-1]).kill9()


async def test_a_global_concurrency_limit_holds_at_every_instant_across_workers(
    dsn: str, db: asyncpg.Connection[asyncpg.Record], workers: list[WorkerProcess], tmp_path: Path
) -> None:
    async with pgq.Client(dsn) as client:
        await client.set_queue_limits("default", concurrency=4)
    workers += await start_workers(db, dsn, tmp_path, 3)  # 15 slots between them
    ids = await enqueue(dsn, 60, 0.1)
    samples = await sample_running_until_done(db, ids, 90)
    assert max(samples) <= 4
    assert max(samples) == 4  # the limit was used, not just respected
    await assert_exactly_once(db, ids)


async def test_slots_held_by_a_killed_worker_come_back_through_the_rescuer(
    dsn: str, db: asyncpg.Connection[asyncpg.Record], workers: list[WorkerProcess], tmp_path: Path
) -> None:
    async with pgq.Client(dsn) as client:
        await client.set_queue_limits("default", concurrency=4)
    procs = await start_workers(db, dsn, tmp_path, 3)
    workers += procs
    ids = await enqueue(dsn, 24, 1.0)
    await kill_a_slot_holder(db, procs)
    samples = await sample_running_until_done(db, ids, 90)
    assert max(samples) <= 4  # the dead worker's jobs count until they are rescued
    rescued = await db.fetchval(
        "SELECT count(*) FROM pgq_jobs WHERE id = ANY($1) AND errors::text LIKE '%rescued%'", ids
    )
    assert rescued >= 1
    assert await all_completed(db, ids)


async def test_a_rate_limit_holds_in_every_window_across_workers(
    dsn: str, db: asyncpg.Connection[asyncpg.Record], workers: list[WorkerProcess], tmp_path: Path
) -> None:
    async with pgq.Client(dsn) as client:
        await client.set_queue_limits("default", rate=(5, 1.0))
    workers += await start_workers(db, dsn, tmp_path, 3)
    ids = await enqueue(dsn, 20, 0.01)
    await until(lambda: all_completed(db, ids), limit_s=60)
    starts = sorted(
        r[0] for r in await db.fetch("SELECT attempted_at FROM pgq_jobs WHERE id = ANY($1)", ids)
    )
    window = timedelta(seconds=1)
    busiest = max(sum(1 for t in starts if s <= t < s + window) for s in starts)
    assert busiest <= 5
    assert starts[-1] - starts[0] >= timedelta(seconds=3)  # 20 starts at 5 a second


async def sample_running_per_key_until_done(
    db: asyncpg.Connection[asyncpg.Record], ids: list[int], limit_s: float
) -> list[dict[str | None, int]]:
    """Running jobs per limit key, read every few milliseconds until every job of ``ids``
    has completed."""
    samples: list[dict[str | None, int]] = []
    with anyio.fail_after(limit_s):
        while not await all_completed(db, ids):
            rows = await db.fetch(
                "SELECT limit_key, count(*) AS n FROM pgq_jobs WHERE state = 'running'"
                " GROUP BY limit_key"
            )
            samples.append({r["limit_key"]: r["n"] for r in rows})
            await anyio.sleep(0.005)
    return samples


async def enqueue_keyed(dsn: str, keys: str, per_key: int, seconds: float) -> list[int]:
    async with pgq.Client(dsn) as client:
        jobs = await client.enqueue_many(
            [
                pgq.JobSpec("effect", {"seconds": seconds}, limit_key=k)
                for k in keys
                for _ in range(per_key)
            ]
        )
    return [j.id for j in jobs]


async def test_a_per_key_limit_holds_at_every_instant_across_workers(
    dsn: str, db: asyncpg.Connection[asyncpg.Record], workers: list[WorkerProcess], tmp_path: Path
) -> None:
    async with pgq.Client(dsn) as client:
        await client.set_queue_limits("default", concurrency=5, key_concurrency=2)
    procs = await start_workers(db, dsn, tmp_path, 3)  # 15 slots between them
    workers += procs
    ids = await enqueue_keyed(dsn, "abcd", 8, 0.1)
    samples = await sample_running_per_key_until_done(db, ids, 120)
    assert max(max(s.values(), default=0) for s in samples) <= 2  # per key
    assert max(sum(s.values()) for s in samples) <= 5  # the queue's own limit as well
    assert max(len([n for n in s.values() if n == 2]) for s in samples) >= 2  # used, not idle
    await assert_exactly_once(db, ids)


async def test_per_key_slots_held_by_a_killed_worker_come_back(
    dsn: str, db: asyncpg.Connection[asyncpg.Record], workers: list[WorkerProcess], tmp_path: Path
) -> None:
    async with pgq.Client(dsn) as client:
        await client.set_queue_limits("default", key_concurrency=1)
    procs = await start_workers(db, dsn, tmp_path, 2)
    workers += procs
    ids = await enqueue_keyed(dsn, "abc", 4, 1.0)
    await kill_a_slot_holder(db, procs)
    samples = await sample_running_per_key_until_done(db, ids, 120)
    assert max(max(s.values(), default=0) for s in samples) <= 1
    rescued = await db.fetchval(
        "SELECT count(*) FROM pgq_jobs WHERE id = ANY($1) AND errors::text LIKE '%rescued%'", ids
    )
    assert rescued >= 1


async def test_dependencies_hold_across_workers_and_kills(
    dsn: str, db: asyncpg.Connection[asyncpg.Record], workers: list[WorkerProcess], tmp_path: Path
) -> None:
    """Chains and groups drained by three worker processes, one killed with kill -9
    mid-drain: every job completes, no dependent starts before all its parents completed,
    and every group callback saw all its members' results."""
    procs = await start_workers(db, dsn, tmp_path, 3)
    workers += procs
    async with pgq.Client(dsn) as client:
        ids: list[int] = []
        callbacks: list[int] = []
        for _ in range(6):
            chain = await client.enqueue_chain(
                [pgq.JobSpec("effect", {"seconds": 0.2}) for _ in range(4)]
            )
            members, callback = await client.enqueue_group(
                [pgq.JobSpec("effect", {"seconds": 0.3}) for _ in range(4)],
                pgq.JobSpec("gather"),
            )
            ids += [j.id for j in chain] + [j.id for j in members] + [callback.id]
            callbacks.append(callback.id)

    async def some_running() -> bool:
        return bool(await db.fetchval("SELECT count(*) FROM pgq_jobs WHERE state = 'running'"))

    await until(some_running, limit_s=30)
    procs[0].kill9()
    await until(lambda: all_completed(db, ids), limit_s=120)
    early = await db.fetch(
        "SELECT c.id, p.id AS parent FROM pgq_jobs c"
        " CROSS JOIN LATERAL unnest(c.depends_on) AS d(pid)"
        " JOIN pgq_jobs p ON p.id = d.pid"
        " JOIN starts s ON s.job_id = c.id"
        " WHERE s.at < p.finalized_at"
    )
    assert early == []  # no attempt of a dependent began before a parent had completed
    seen = await db.fetch("SELECT job_id, attempt FROM effects WHERE job_id = ANY($1)", callbacks)
    assert sorted(r["job_id"] for r in seen) == sorted(callbacks)
    assert {r["attempt"] for r in seen} == {4}  # each callback saw its 4 members' results


async def test_limits_are_checked_and_cleared(client: pgq.Client) -> None:
    with pytest.raises(pgq.ConfigError, match="not '\\*'"):
        await client.set_queue_limits("*", concurrency=1)
    with pytest.raises(pgq.ConfigError, match="from 1 to"):
        await client.set_queue_limits("emails", concurrency=0)
    with pytest.raises(pgq.ConfigError, match="above 0"):
        await client.set_queue_limits("emails", rate=(10, 0))
    with pytest.raises(pgq.ConfigError, match="a year"):
        await client.set_queue_limits("emails", rate=(10, float("inf")))
    with pytest.raises(pgq.ConfigError, match="from 1 to"):
        await client.set_queue_limits("emails", concurrency=2**40)
    with pytest.raises(pgq.ConfigError, match=r"\(count, seconds\)"):
        await client.set_queue_limits("emails", rate=(10, 60, 1))  # type: ignore[arg-type]
    await client.set_queue_limits("emails", concurrency=3, rate=(10, 60))
    assert await client.queue_limits("emails") == pgq.QueueLimits(3, 10, 60.0)
    await client.set_queue_limits("emails", key_concurrency=2, key_rate=(5, 1))
    assert await client.queue_limits("emails") == pgq.QueueLimits(None, None, None, 2, 5, 1.0)
    with pytest.raises(pgq.ConfigError, match="key_concurrency"):
        await client.set_queue_limits("emails", key_concurrency=-1)
    with pytest.raises(pgq.ConfigError, match="key_rate"):
        await client.set_queue_limits("emails", key_rate=(5, -1))
    await client.set_queue_limits("emails")
    assert not (await client.queue_limits("emails")).limited
