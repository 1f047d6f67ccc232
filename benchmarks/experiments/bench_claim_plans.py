"""Does the claim cost the server less on its cached plan than planned afresh?

Answer: yes: the cached claim's p50 was 0.87 of the claim planned afresh
(docs/architecture.md).

The claim of one job, planned afresh (``plan_cache_mode = force_custom_plan``, the
worker's other connections) against its cached plan (the claim connections); both
connections with the claim connections' settings (index scans only).

`python benchmarks/experiments/bench_claim_plans.py [CLAIMS]` (default 2,000): a fresh database with
pgq's schema and 20,000 jobs of another queue (half finished); then, CLAIMS times in turn
on each of the two connections, one job enqueued and claimed (`CLAIM_JOBS`, asking for 50
as an idle worker's producer does), each claim timed from the driver. The claims commit
without waiting for the WAL's flush (`async_commit`), so the disk's noise stays out of a
figure about the server's CPU. Prints p10/p50/p90 of each and the ratio of the p50s.
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, run

import asyncpg
from common import drop_database, fresh_database, percentile, pgq_migrate, run

from pgq._db import sql
from pgq._db.connections import CLAIM_SESSION_SETTINGS

NAME = "bench_claim_plans"


async def main(claims: int) -> None:
    dsn = await fresh_database(NAME)
    await pgq_migrate(dsn)
    setup = await asyncpg.connect(dsn)
    await setup.execute(
        "INSERT INTO pgq_jobs (queue, task, args) SELECT 'other', 'noop', '{}'"
        " FROM generate_series(1, 20000)"
    )
    await setup.execute(
        "UPDATE pgq_jobs SET state = 'completed', finalized_at = now() WHERE id % 2 = 0"
    )
    await setup.execute("VACUUM ANALYZE pgq_jobs")
    modes = {"planned afresh": "force_custom_plan", "cached plan": "auto"}
    conns = {
        name: await asyncpg.connect(
            dsn, server_settings={**CLAIM_SESSION_SETTINGS, "plan_cache_mode": mode}
        )
        for name, mode in modes.items()
    }
    times: dict[str, list[float]] = {name: [] for name in modes}
    producer = uuid.uuid4()
    args = ("q", ["noop"], 50, producer, [None], [3], "w", True)
    for i in range(claims + 20):
        for name, conn in conns.items():
            await setup.execute(
                "INSERT INTO pgq_jobs (queue, task, args) VALUES ('q', 'noop', '{}')"
            )
            started = time.perf_counter()
            rows = await conn.fetch(sql.CLAIM_JOBS, *args)
            took = time.perf_counter() - started
            assert len(rows) == 1
            if i >= 20:  # the first runs: the statement prepared, the plan chosen
                times[name].append(took * 1000)
    for conn in (setup, *conns.values()):
        await conn.close()
    for name, ms in times.items():
        print(
            f"{name:<16} p10 {percentile(ms, 10):.3f}  p50 {percentile(ms, 50):.3f}  "
            f"p90 {percentile(ms, 90):.3f} ms"
        )
    a, b = (percentile(times[n], 50) for n in modes)
    print(f"cached / afresh, p50: {b / a:.2f}")
    await drop_database(NAME)


if __name__ == "__main__":
    run(lambda: main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000))
