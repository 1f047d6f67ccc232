"""High availability as docs/scaling.md shows it: three PostgreSQL nodes managed by Patroni
with one etcd (tests.faults.patroni, the page's configuration), a fleet of three `pgq
worker` processes on the multi-host DSN draining jobs that write their effect and complete
in one transaction, jobs arriving throughout. Then the primary's node is killed (Patroni
and PostgreSQL, kill -9) or `patronictl switchover` moves the primary; either way nothing
is lost, no outcome is accepted twice, no effect is applied twice, and the fleet's first
job completes on the new primary within 5 s of it accepting writes.

Run by `make chaos` (it sets ``CHAOS_PATRONI_REPORT``, the JSON file that receives the
figures under "patroni"); skipped otherwise: a cluster takes half a minute to build.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest

import pgq
from tests.faults.chaos import RETRYABLE
from tests.faults.patroni import Node, PatroniCluster, patroni_cluster
from tests.faults.workers import WorkerProcess, wait_registered
from tests.tests_support import until

REPORT = os.environ.get("CHAOS_PATRONI_REPORT")

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.faults,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not REPORT, reason="run by `make chaos` (CHAOS_PATRONI_REPORT=FILE)"),
]

#: pgq's defaults but the heartbeat: a crash failover outlasts the fencing bound, and a
#: fenced producer claims again at its first heartbeat on the new primary (docs/scaling.md).
FLEET_SETTINGS: dict[str, float] = {"heartbeat_interval": 1.0, "heartbeat_timeout": 1.0}

#: Seconds from the new primary accepting writes to the fleet's first job completed there.
RESUME_TARGET_S = 5.0

SCHEMA = """
CREATE TABLE starts (job_id bigint, attempt int, worker text, at timestamptz DEFAULT now());
CREATE TABLE effects (job_id bigint, attempt int, worker text, at timestamptz DEFAULT now());
-- Every outcome the database accepted, where and when: a job completed, or a completed job
-- changed again (never legitimate). Written in the accepting transaction itself.
CREATE TABLE outcomes (job_id bigint, attempt int, old_state text, port int,
                       at timestamptz DEFAULT clock_timestamp());
CREATE FUNCTION record_outcome() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO outcomes (job_id, attempt, old_state, port)
    VALUES (NEW.id, NEW.attempt, OLD.state::text, inet_server_port());
    RETURN NULL;
END $$;
CREATE TRIGGER record_outcome AFTER UPDATE ON pgq_jobs FOR EACH ROW
    WHEN (NEW.state = 'completed' OR OLD.state = 'completed')
    EXECUTE FUNCTION record_outcome();
"""


@dataclass
class Figures:
    """What one fault did, as the report and docs/scaling.md give it."""

    jobs: int
    lost: int
    outcomes_accepted_twice: int
    effects_applied_twice: int
    #: Jobs that completed on a later attempt (an attempt cut off by the fault fails and
    #: is retried), and jobs rescued from a producer judged stale.
    retried: int
    rescued: int
    #: Seconds from the kill (or the switchover command) to the new primary accepting writes.
    to_promotion_s: float
    #: Seconds from the new primary accepting writes to the first job completed there.
    writable_to_first_completion_s: float
    old_primary: str
    new_primary: str


@pytest.fixture
async def ha(tmp_path: Path) -> AsyncIterator[tuple[PatroniCluster, list[WorkerProcess]]]:
    """A migrated Patroni cluster and a fleet of three workers on it, registered."""
    with patroni_cluster() as cluster:
        with anyio.fail_after(60):
            done = await anyio.run_process(
                [sys.executable, "-m", "pgq", "migrate", "--dsn", cluster.dsn], check=False
            )
        assert done.returncode == 0, done.stderr.decode()
        conn = await asyncpg.connect(cluster.dsn)
        fleet = [
            WorkerProcess(f"ha-{i}", cluster.dsn, tmp_path, FLEET_SETTINGS, concurrency=5)
            for i in range(3)
        ]
        try:
            await conn.execute(SCHEMA)
            for w in fleet:
                w.start()
            await wait_registered(conn, *(w.name for w in fleet))
            await conn.close()
            yield cluster, fleet
        finally:
            conn.terminate()
            with anyio.CancelScope(shield=True):
                async with anyio.create_task_group() as tg:
                    for w in fleet:
                        tg.start_soon(anyio.to_thread.run_sync, w.stop)


async def test_a_killed_primary_node_is_replaced_and_the_fleet_follows(
    ha: tuple[PatroniCluster, list[WorkerProcess]],
) -> None:
    cluster, fleet = ha
    old = cluster.leader()
    assert old is not None
    node = cluster.node(old)

    async def kill() -> None:
        await anyio.to_thread.run_sync(node.kill9)
        with pytest.raises(OSError):  # nothing listens on its port any more
            await anyio.connect_tcp("127.0.0.1", node.port)

    figures = await under_load(cluster, fleet, old, kill, "failover")
    assert figures.new_primary != old


async def test_a_switchover_moves_the_primary_under_the_fleet(
    ha: tuple[PatroniCluster, list[WorkerProcess]],
) -> None:
    cluster, fleet = ha
    old = cluster.leader()
    sync = [m["name"] for m in cluster.members() if m["role"] == "sync_standby"]
    assert old is not None and sync

    async def switchover() -> None:
        await anyio.to_thread.run_sync(cluster.switchover, old, sync[0])

    figures = await under_load(cluster, fleet, old, switchover, "switchover")
    assert figures.new_primary == sync[0]


async def under_load(
    cluster: PatroniCluster,
    fleet: list[WorkerProcess],
    old: str,
    fault: Callable[[], Awaitable[None]],
    kind: str,
) -> Figures:
    """Feed jobs, inject ``fault`` while the fleet runs them, watch the new primary come up
    and the fleet's first completion there, then let every job finish and check."""
    ids: list[int] = []
    stop_feeding = anyio.Event()
    candidates = [n for n in cluster.nodes if n.name != old]
    async with pgq.Client(cluster.dsn) as client, anyio.create_task_group() as tg:
        tg.start_soon(feed, client, ids, stop_feeding)
        probe = await asyncpg.connect(cluster.dsn)
        try:

            async def busy() -> bool:
                done = await probe.fetchval("SELECT count(*) FROM outcomes")
                running = await probe.fetchval(
                    "SELECT count(*) FROM pgq_jobs WHERE state = 'running'"
                )
                return bool(done >= 50 and running > 0)

            await until(busy, limit_s=60)
        finally:
            await probe.close()
        # Opened beforehand: a promotion keeps a standby's connections.
        conns = [(n, await asyncpg.connect(cluster.node_dsn(n))) for n in candidates]
        try:
            async with anyio.create_task_group() as watching:
                writable: list[tuple[Node, float]] = []

                async def watch() -> None:
                    writable.append(await first_writable(conns))

                watching.start_soon(watch)
                started = time.time()
                await fault()
        finally:
            for _, c in conns:
                c.terminate()
        new, writable_at = writable[0]
        first = await first_completion(cluster, new, writable_at)
        # Jobs keep arriving a few seconds on the new primary, then every one must end.
        await anyio.sleep(3)
        stop_feeding.set()
    figures = await check(cluster, ids, old, new, started, writable_at, first)
    print(f"\n{kind}: {json.dumps(asdict(figures))}")
    record(kind, figures)
    assert figures.lost == 0, figures
    assert figures.outcomes_accepted_twice == 0, figures
    assert figures.effects_applied_twice == 0, figures
    assert figures.writable_to_first_completion_s <= RESUME_TARGET_S, figures
    for w in fleet:
        assert w.proc is not None and w.proc.poll() is None, f"{w.name} exited"
    return figures


async def feed(client: pgq.Client, ids: list[int], stop: anyio.Event) -> None:
    """About 20 jobs a second (the fleet runs up to 50), retried through the outage as an
    application would. A batch whose commit was cut off may have landed anyway: its jobs
    are not among those checked (their ids are unknown), which hides nothing."""
    rng = random.Random(59)
    while not stop.is_set():
        specs = [pgq.JobSpec("tx_effect", {"work_s": rng.uniform(0.1, 0.5)}) for _ in range(5)]
        with anyio.fail_after(120):
            while True:
                try:
                    ids.extend(j.id for j in await client.enqueue_many(specs))
                    break
                except RETRYABLE:
                    await anyio.sleep(0.2)
        await anyio.sleep(0.25)


async def first_writable(
    conns: list[tuple[Node, asyncpg.Connection[asyncpg.Record]]],
) -> tuple[Node, float]:
    """The first node to accept writes, and when (its clock, epoch seconds), seen over a
    connection to each."""
    with anyio.fail_after(120):
        while True:
            for node, conn in conns:
                row = await conn.fetchrow(
                    "SELECT pg_is_in_recovery() AS standby,"
                    " extract(epoch FROM clock_timestamp())::float8 AS at"
                )
                assert row is not None
                if not row["standby"]:
                    return node, float(row["at"])
            await anyio.sleep(0.02)  # another process's state, polled on a deadline


async def first_completion(cluster: PatroniCluster, node: Node, since: float) -> float:
    """When (epoch seconds) the first job completed on ``node`` after ``since``."""
    conn = await asyncpg.connect(cluster.node_dsn(node))
    try:
        at: float | None = None

        async def completed() -> bool:
            nonlocal at
            at = await conn.fetchval(
                "SELECT extract(epoch FROM min(at))::float8 FROM outcomes"
                " WHERE port = $1 AND at >= to_timestamp($2) AND old_state <> 'completed'",
                node.port,
                since,
            )
            return at is not None

        await until(completed, limit_s=60, every_s=0.05)
        assert at is not None
        return at
    finally:
        await conn.close()


async def check(
    cluster: PatroniCluster,
    ids: list[int],
    old: str,
    new: Node,
    started: float,
    writable_at: float,
    first: float,
) -> Figures:
    """Wait for every job fed to end, then count what went wrong."""
    conn = await asyncpg.connect(cluster.dsn)
    try:

        async def all_final() -> bool:
            n = await conn.fetchval(
                "SELECT count(*) FROM pgq_jobs WHERE id = ANY($1)"
                " AND state IN ('completed', 'discarded', 'cancelled')",
                ids,
            )
            return bool(n == len(ids))

        with contextlib.suppress(TimeoutError):  # what is left unfinished counts as lost
            await until(all_final, limit_s=120, every_s=0.2)
        lost = await conn.fetchval(
            "SELECT count(*) FROM unnest($1::bigint[]) AS i(id) WHERE NOT EXISTS"
            " (SELECT 1 FROM pgq_jobs j WHERE j.id = i.id AND j.state = 'completed')",
            ids,
        )
        accepted_twice = await conn.fetchval(
            "SELECT count(*) FROM (SELECT job_id FROM outcomes WHERE job_id = ANY($1)"
            " GROUP BY job_id HAVING count(*) > 1) t",
            ids,
        )
        effects_twice = await conn.fetchval(
            "SELECT count(*) FROM (SELECT job_id FROM effects WHERE job_id = ANY($1)"
            " GROUP BY job_id HAVING count(*) > 1) t",
            ids,
        )
        again = await conn.fetchrow(
            "SELECT count(*) FILTER (WHERE attempt > 1) AS retried,"
            " count(*) FILTER (WHERE errors::text LIKE '%rescued%') AS rescued"
            " FROM pgq_jobs WHERE id = ANY($1)",
            ids,
        )
        assert again is not None
        # The counts above prove something only if every completion left both its rows.
        unrecorded = await conn.fetchval(
            "SELECT count(*) FROM pgq_jobs j WHERE id = ANY($1) AND state = 'completed' AND"
            " NOT (EXISTS (SELECT 1 FROM outcomes o WHERE o.job_id = j.id)"
            " AND EXISTS (SELECT 1 FROM effects e WHERE e.job_id = j.id))",
            ids,
        )
        assert unrecorded == 0, f"{unrecorded} completed jobs lack an outcome or effect row"
    finally:
        await conn.close()
    return Figures(
        jobs=len(ids),
        lost=int(lost),
        outcomes_accepted_twice=int(accepted_twice),
        effects_applied_twice=int(effects_twice),
        retried=int(again["retried"]),
        rescued=int(again["rescued"]),
        to_promotion_s=round(writable_at - started, 2),
        writable_to_first_completion_s=round(first - writable_at, 2),
        old_primary=old,
        new_primary=new.name,
    )


def record(kind: str, figures: Figures) -> None:
    """Add the figures to the report file (`make chaos`: the chaos run's report)."""
    assert REPORT is not None
    path = Path(REPORT)
    report: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    report.setdefault("patroni", {})[kind] = asdict(figures)
    path.write_text(json.dumps(report, indent=2))
