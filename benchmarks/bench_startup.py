"""What a worker costs before and after its jobs: how long `Worker.run(burst=True)` takes on
an empty queue (open the pool, check the schema, register, listen, elect, a first claim,
the burst check, resign, close), and how many times its connections asked the server about
a type (asyncpg's introspection, one recursive catalog query each).

`python benchmarks/bench_startup.py [RUNS]` (default 15) migrates a fresh database, runs one
worker untimed (the server's caches warm), then RUNS workers one after another, and prints
the median and the quartiles. Run it with `PYTHONPATH=TREE/src` for each of two versions,
taking turns, to compare them in one sitting: single runs move by 10-20 % on a busy machine.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import asyncpg.connection
from common import drop_database, emit, fresh_database, pgq_migrate, run

import pgq

app = pgq.App()


@app.task
async def noop(ctx: pgq.JobContext) -> None:
    """Never enqueued: the queue stays empty."""


async def main(runs: int) -> None:
    dsn = await fresh_database("bench_pgq_startup")
    await pgq_migrate(dsn)
    introspections = 0
    original: Any = getattr(asyncpg.connection.Connection, "_introspect_types")  # noqa: B009

    async def counted(self: Any, *args: Any) -> Any:
        nonlocal introspections
        introspections += 1
        return await original(self, *args)

    setattr(asyncpg.connection.Connection, "_introspect_types", counted)  # noqa: B010
    await pgq.Worker(app, dsn, concurrency=1_000).run(burst=True)  # warm-up, untimed
    introspections = 0
    seconds = []
    for _ in range(runs):
        started = time.perf_counter()
        await pgq.Worker(app, dsn, concurrency=1_000).run(burst=True)
        seconds.append(time.perf_counter() - started)
    q1, median, q3 = statistics.quantiles(seconds, n=4)
    print(
        f"empty run(burst=True), {runs} runs: median {median * 1000:.1f} ms "
        f"(quartiles {q1 * 1000:.1f}-{q3 * 1000:.1f}), "
        f"{introspections / runs:.1f} type introspections per run"
    )
    emit(
        {
            "system": "pgq",
            "workload": "startup",
            "runs": runs,
            "median_ms": median * 1000,
            "introspections_per_run": introspections / runs,
        }
    )
    await drop_database("bench_pgq_startup")


if __name__ == "__main__":
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    if runs < 2:
        raise SystemExit("RUNS must be 2 or more (the quartiles need two runs)")
    run(lambda: main(runs))
