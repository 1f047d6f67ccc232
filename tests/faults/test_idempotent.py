"""The side-effect patterns of docs/liveness.md under random kill -9 of real workers."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import anyio
import asyncpg
import pytest

import pgq
from tests.faults.workers import SHORT, WorkerProcess, wait_registered
from tests.tests_support import until

# docs/examples: on the path of the worker processes, and of this test for its schema.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "docs" / "examples"))

import idempotent

# With the chaos test of test_transactions.py: not beside it (see there).
pytestmark = [
    pytest.mark.anyio,
    pytest.mark.faults,
    pytest.mark.timeout(240),
    pytest.mark.xdist_group("many-connections"),
]


async def test_an_idempotency_key_makes_an_effect_happen_once_under_random_kills(
    dsn: str, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(idempotent.SCHEMA)
        names = ["w0", "w1", "w2"]
        procs = {
            n: WorkerProcess(n, dsn, tmp_path, SHORT, concurrency=10, app="idempotent:app")
            for n in names
        }
        workers.extend(procs.values())
        for p in procs.values():
            p.start()
        await wait_registered(conn, *names)
        async with pgq.Client(dsn) as client:
            jobs = await client.enqueue_many(
                [pgq.JobSpec("charge", {"order_id": i, "settle_s": 0.5}) for i in range(150)]
            )
        ids = [j.id for j in jobs]

        async def settled() -> bool:
            n = await conn.fetchval(
                "SELECT count(*) FROM pgq_jobs WHERE id = ANY($1) AND state = 'completed'", ids
            )
            return bool(n == len(ids))

        kills = 0
        with anyio.fail_after(180):
            # Each kill hits a worker that is running jobs right then.
            while kills < 6 and not await settled():
                busy = await conn.fetch(
                    "SELECT DISTINCT p.worker_name FROM pgq_jobs j"
                    " JOIN pgq_producers p ON p.id = j.producer_id WHERE j.state = 'running'"
                )
                names_busy = sorted(r[0] for r in busy if r[0] in procs)
                if not names_busy:
                    await anyio.sleep(0.05)
                    continue
                victim = procs[rng.choice(names_busy)]
                victim.kill9()
                kills += 1
                victim.start()  # a new process, a new producer: the old one is rescued
                await anyio.sleep(rng.uniform(0.3, 1.0))
        await until(settled, limit_s=120)
        charges = await conn.fetch(
            "SELECT order_id, count(*) AS n FROM charges GROUP BY order_id ORDER BY order_id"
        )
        attempts = await conn.fetchval(
            "SELECT count(*) FROM (SELECT job_id FROM charge_attempts GROUP BY job_id"
            " HAVING count(*) > 1) twice"
        )
        rescued = await conn.fetchval(
            "SELECT count(*) FROM pgq_jobs WHERE id = ANY($1) AND errors::text LIKE '%rescued%'",
            ids,
        )
    finally:
        await conn.close()
    print(f"seed {seed}: {rescued} jobs rescued, {attempts} with a repeated fenced effect")
    assert kills >= 1, f"seed {seed}"
    assert rescued > 0, f"seed {seed}: the kills must have hit running jobs"
    assert [(r["order_id"], r["n"]) for r in charges] == [(i, 1) for i in range(150)], (
        f"seed {seed}: every order charged exactly once ({attempts} jobs wrote their fenced "
        "effect more than once)"
    )
