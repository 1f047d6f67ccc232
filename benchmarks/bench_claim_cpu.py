"""CPU time per claimed job on both sides of the claim: the PostgreSQL backend's, read from
``/proc`` (so the server must run on this machine), and the client's (decoding the rows and
building the jobs), for comparing versions of the claim where wall-clock figures drown in
the noise of a shared machine.

`python benchmarks/bench_claim_cpu.py TREE [TREE ...]` (each TREE a checkout of pgq; the
default is this one; ``BENCH_ROUNDS`` rounds, default 6) fills one fresh database with
20,000 available no-op jobs, migrated by the first tree (the trees must share a schema).
Then, in each round, each tree in turn, in a process of its own with ``PYTHONPATH=TREE/src``,
claims 500 jobs with its own ``claims.claim`` and rolls the claim back, 60 times on one
connection (after 5 unmeasured). It prints, per round and tree, the backend's and the
client's CPU microseconds per claimed job, then the median of each. The backend's figure
comes from clock ticks (10 ms on Linux): 60 claims of 500 take several hundred of them.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from common import emit, fresh_database, pgq_backlog, run
from run import run_one

HERE = Path(__file__).resolve().parent
JOBS = 20_000
BATCH = 500
CLAIMS = 60
WARM_UP = 5


def _backend_cpu_s(pid: int) -> float:
    """User plus system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _child(dsn: str) -> None:
    """One tree's measurement (this process imports that tree's pgq)."""
    import asyncpg

    from pgq._store import claims
    from pgq._store.connections import WORKER_SESSION_SETTINGS

    plan = claims.ClaimPlan("default", ("noop",), (None,), (25,))
    producer = uuid.uuid4()
    conn = await asyncpg.connect(dsn, server_settings=WORKER_SESSION_SETTINGS)
    try:
        pid = await conn.fetchval("SELECT pg_backend_pid()")
        server = client = 0.0
        for i in range(WARM_UP + CLAIMS):
            server_0, client_0 = _backend_cpu_s(pid), time.process_time()
            tx = conn.transaction()
            await tx.start()
            jobs = await claims.claim(conn, plan, producer, "bench", BATCH)
            client_1 = time.process_time()
            await tx.rollback()
            if len(jobs) != BATCH:
                raise RuntimeError(f"claimed {len(jobs)} of {BATCH}")
            if i >= WARM_UP:
                server += _backend_cpu_s(pid) - server_0
                client += client_1 - client_0
    finally:
        await conn.close()
    per_job = CLAIMS * BATCH
    emit({"server_us": server / per_job * 1e6, "client_us": client / per_job * 1e6})


def _measure(tree: Path, dsn: str) -> dict[str, float]:
    """One tree's figures, from a child process that imports that tree's pgq."""
    env = {"PYTHONPATH": f"{tree / 'src'}{os.pathsep}{HERE}"}
    result = run_one("bench_claim_cpu.py", "--child", [dsn], env)
    return {"server_us": float(result["server_us"]), "client_us": float(result["client_us"])}


async def main(trees: list[Path], rounds: int) -> None:
    dsn = await fresh_database("pgq_bench_claim_cpu")
    env = {**os.environ, "PYTHONPATH": str(trees[0] / "src")}
    migrate = [sys.executable, "-m", "pgq", "migrate", "--dsn", dsn]
    await asyncio.to_thread(subprocess.run, migrate, env=env, stdout=subprocess.DEVNULL, check=True)
    import pgq

    app = pgq.App()

    @app.task
    async def noop(ctx: pgq.JobContext, i: int) -> None:
        """A job that does nothing."""

    await pgq_backlog(dsn, app, noop, JOBS)
    figures: dict[str, dict[str, list[float]]] = {
        str(t): {"server_us": [], "client_us": []} for t in trees
    }
    for r in range(rounds):
        for tree in trees:
            result = await asyncio.to_thread(_measure, tree, dsn)
            for key, value in result.items():
                figures[str(tree)][key].append(value)
            print(
                f"round {r + 1}: {tree}: server {result['server_us']:.1f} us, "
                f"client {result['client_us']:.2f} us per claimed job",
                flush=True,
            )
    medians = {
        tree: {key: statistics.median(values) for key, values in per.items()}
        for tree, per in figures.items()
    }
    for tree, m in medians.items():
        print(f"{tree}: median server {m['server_us']:.1f} us, client {m['client_us']:.2f} us")
    emit({"system": "pgq", "workload": "claim_cpu", "figures": figures, "medians": medians})


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "--child":
        run(lambda: _child(args[1]))
    else:
        rounds = int(os.environ.get("BENCH_ROUNDS", "6"))
        asyncio.run(main([Path(a).resolve() for a in args] or [HERE.parent], rounds))
