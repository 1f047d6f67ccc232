"""Graphile Worker's side of the benchmark: `python bench_graphile.py WORKLOAD [ARGS]`.

Graphile Worker is a Node.js queue: it is installed by npm into `benchmarks/graphile/`
(`npm ci`, the version its lock file pins; `make bench` does it) and runs as Node.js
processes (`graphile/driver.mjs`). This script makes the databases, enqueues through
Graphile Worker's SQL functions (`graphile_worker.add_job`, `add_jobs`) from Python with
asyncpg, as the other systems' runners enqueue, and times the workers.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
from pathlib import Path

import asyncpg
from common import Timer, dispatch, drop_database, emit, fresh_database

HERE = Path(__file__).resolve().parent
GRAPHILE = HERE / "graphile"
DRIVER = GRAPHILE / "driver.mjs"
N = 20_000


def node() -> str:
    """Node.js, with Graphile Worker installed beside the driver (else a clear error)."""
    found = shutil.which("node")
    if found is None:
        raise SystemExit("Graphile Worker's benchmark needs Node.js >= 18 (`make node`)")
    if not (GRAPHILE / "node_modules" / "graphile-worker").is_dir():
        raise SystemExit("Graphile Worker is not installed: `cd benchmarks/graphile && npm ci`")
    return found


async def setup(name: str) -> str:
    """A fresh database with Graphile Worker's schema, installed by Graphile Worker."""
    dsn = await fresh_database(name)
    proc = await asyncio.create_subprocess_exec(node(), str(DRIVER), "migrate", dsn)
    if await proc.wait() != 0:
        raise RuntimeError(f"graphile-worker migrate failed with exit code {proc.returncode}")
    return dsn


async def latency() -> None:
    import latency as driver

    dsn = await setup("bench_graphile_latency")
    conn = await asyncpg.connect(dsn)

    async def enqueue(seq: int) -> None:
        await conn.execute(
            "SELECT graphile_worker.add_job('stamp', json_build_object('seq', $1::int))", seq
        )

    out = Path(tempfile.mkdtemp()) / "graphile.json"
    result = await driver.drive(DRIVER, dsn, enqueue, out, command=(node(),))
    await conn.close()
    emit(
        {
            "system": "graphile",
            "workload": "latency",
            **result,
            "settings": {"concurrentJobs": 24, "maxPoolSize": 25},
        }
    )
    await drop_database("bench_graphile_latency")


async def drain(processes: int) -> None:
    """20,000 no-op jobs drained by ``processes`` Node.js processes in run-once mode (each
    exits when it finds no job left), at the settings of Graphile Worker's performance
    page; timed from the processes' start until the last has exited."""
    name = f"bench_graphile_drain_{processes}"
    dsn = await setup(name)
    conn = await asyncpg.connect(dsn)
    for start in range(0, N, 5_000):
        await conn.execute(
            "SELECT count(*) FROM graphile_worker.add_jobs(ARRAY("
            " SELECT ROW('noop', json_build_object('i', i), NULL, NULL, NULL, NULL, NULL, NULL)"
            "::graphile_worker.job_spec FROM generate_series($1::int, $2::int) i))",
            start,
            start + 4_999,
        )
    await conn.execute("VACUUM ANALYZE graphile_worker._private_jobs")
    argv = [node(), str(DRIVER), "drain", dsn]
    with Timer() as t:
        procs = [
            subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            for _ in range(processes)
        ]
        for proc in procs:
            _, err = await asyncio.to_thread(proc.communicate)
            assert proc.returncode == 0, err.decode()[-2000:]
    left = await conn.fetchval("SELECT count(*) FROM graphile_worker._private_jobs")
    await conn.close()
    assert left == 0, f"{left} jobs left"
    emit(
        {
            "system": "graphile",
            "workload": "drain",
            "jobs": N,
            "seconds": t.seconds,
            "rate": N / t.seconds,
            "settings": {
                "processes": processes,
                "concurrentJobs": 24,
                "maxPoolSize": 25,
                "localQueue.size": 500,
                "completeJobBatchDelay": 0,
            },
        }
    )
    await drop_database(name)


if __name__ == "__main__":
    dispatch(
        {
            "latency": latency,
            "drain": lambda processes="2": drain(int(processes)),
        }
    )
