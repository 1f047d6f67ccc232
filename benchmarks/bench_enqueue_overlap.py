"""How much a plain batch gains from beginning its transaction while its jobs are prepared.

`python benchmarks/bench_enqueue_overlap.py [BATCH] [ROUNDS]` (default 1,000 jobs, 300
rounds) enqueues, in one process and on one client, batches of ``BATCH`` no-op jobs of a
registered task that set no option, two ways taking turns batch by batch (so the drift of a
shared machine falls on both): ``sequential``, every job prepared first and then written by
``copy`` (BEGIN, the ids' allocation, COPY, COMMIT: what ``enqueue_many`` did before), and
``overlapped``, ``enqueue_many`` itself (BEGIN and the allocation under way while the jobs
are prepared). It prints the median batch of each, leaving out the first 20 rounds, and
their ratio. Separate processes taking turns cannot show a change of this size: a run of
20,000 jobs moves by 15 % from one process to the next here.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from typing import Any

from common import drop_database, emit, fresh_database, pgq_migrate

import pgq
from pgq._enqueue import prepare
from pgq._store import jobs as store_jobs

app = pgq.App()


@app.task
async def noop(ctx: pgq.JobContext, i: int) -> None:
    """A job that does nothing: measures the enqueue, not the work."""


async def main(batch: int, rounds: int) -> None:
    dsn = await fresh_database("bench_enqueue_overlap")
    await pgq_migrate(dsn)
    async with pgq.Client(dsn, app=app) as client:

        async def sequential(specs: list[pgq.JobSpec[Any]]) -> int:
            rows = [prepare(i, spec, app) for i, spec in enumerate(specs)]
            async with client.pool.acquire() as conn:
                return len(await store_jobs.copy(conn, rows))

        async def overlapped(specs: list[pgq.JobSpec[Any]]) -> int:
            return len(await client.enqueue_many(specs))

        took: dict[str, list[float]] = {"sequential": [], "overlapped": []}
        ways = [("sequential", sequential), ("overlapped", overlapped)]
        for k in range(rounds):
            for name, way in ways if k % 2 else ways[::-1]:
                specs = [noop.spec(i=i) for i in range(batch)]
                started = time.perf_counter()
                assert await way(specs) == batch
                took[name].append(time.perf_counter() - started)
    await drop_database("bench_enqueue_overlap")
    before, after = (statistics.median(took[n][20:]) for n in ("sequential", "overlapped"))
    print(
        f"batch of {batch:,}: sequential {before * 1000:.2f} ms, overlapped "
        f"{after * 1000:.2f} ms, overlapped / sequential {after / before:.3f}"
    )
    emit(
        {
            "workload": "enqueue_overlap",
            "batch": batch,
            "sequential_ms": before * 1000,
            "overlapped_ms": after * 1000,
            "ratio": after / before,
        }
    )


if __name__ == "__main__":
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    asyncio.run(main(size, count))
