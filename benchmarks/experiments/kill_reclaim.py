"""How long after `kill -9` of a worker are its running jobs claimed again?

Answer: restarted at once, 19.0 s under a stable name (the fencing bound plus a 2 s margin)
against 30.3 s under a dynamic one (`stale_after`; docs/liveness.md).

`python benchmarks/experiments/kill_reclaim.py [TRIALS]` runs with pgq's default liveness
settings and prints each trial beside the bound the settings promise: the victim's last
heartbeat is at most `heartbeat_interval` old at the kill, a peer judges it stale `stale_after`
after that heartbeat, and the leader looks every `rescue_interval`.

`python benchmarks/experiments/kill_reclaim.py restart [TRIALS]`: no peer; the killed worker is
started again at once, under its stable name (`--name`: it takes over once its predecessor's
heartbeat is past the fencing bound plus heartbeat_timeout) and, in turn, under a fresh dynamic
name (host:pid: its jobs wait for the leader's stale_after, and the lease for leader_ttl)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, run

import asyncpg
from common import drop_database, emit, fresh_database, pgq_migrate

import pgq
from pgq.settings import WorkerSettings

HERE = Path(__file__).resolve().parent


def start(name: str | None, dsn: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    env.pop("PGQ_WORKER_NAME", None)
    named = ["--name", name] if name else []
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pgq",
            "--log-level",
            "WARNING",
            "worker",
            "reclaim_app:app",
            "--dsn",
            dsn,
            *named,
            "--concurrency",
            "50",
        ],
        cwd=HERE,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def wait_for(
    conn: asyncpg.Connection[asyncpg.Record], query: str, *args: object, limit_s: float = 120
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while not await conn.fetchval(query, *args):
        if loop.time() > deadline:
            raise TimeoutError(query)
        await asyncio.sleep(0.05)


async def trial(n: int) -> float:
    name = f"bench_reclaim_{n}"
    dsn = await fresh_database(name)
    await pgq_migrate(dsn)
    # The victim starts alone and claims every job; then the peer joins. The victim leads
    # too, so the peer must first take the lease over (within leader_ttl) before it can
    # judge the victim stale: the measured time covers both.
    victim = start("victim", dsn)
    peer: subprocess.Popen[bytes] | None = None
    conn = await asyncpg.connect(dsn)
    try:
        await wait_for(conn, "SELECT count(*) > 0 FROM pgq_producers WHERE worker_name = 'victim'")
        async with pgq.Client(dsn) as client:
            await client.enqueue_many(
                [pgq.JobSpec("long_job", {"seconds": 600}) for _ in range(20)]
            )
        await wait_for(conn, "SELECT count(*) = 20 FROM pgq_jobs WHERE state = 'running'")
        held = [r[0] for r in await conn.fetch("SELECT id FROM pgq_jobs")]
        peer = start("peer", dsn)
        await wait_for(conn, "SELECT count(*) > 0 FROM pgq_producers WHERE worker_name = 'peer'")
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        killed_at = await conn.fetchval("SELECT now()")
        await wait_for(
            conn,
            "SELECT bool_and(attempt = 2 AND state = 'running') FROM pgq_jobs WHERE id = ANY($1)",
            held,
        )
        first = await conn.fetchval(
            "SELECT min(attempted_at) FROM pgq_jobs WHERE id = ANY($1)", held
        )
        return float((first - killed_at).total_seconds())
    finally:
        for p in (victim, peer):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
        await conn.close()
        await drop_database(name)


async def restart_trial(n: int, stable: bool) -> float:
    """kill -9 of the only worker, started again at once: seconds to the re-claim."""
    name = f"bench_restart_{n}"
    dsn = await fresh_database(name)
    await pgq_migrate(dsn)
    worker_name = "stable-victim" if stable else None
    victim = start(worker_name, dsn)
    successor: subprocess.Popen[bytes] | None = None
    conn = await asyncpg.connect(dsn)
    try:
        await wait_for(conn, "SELECT count(*) > 0 FROM pgq_producers")
        async with pgq.Client(dsn) as client:
            await client.enqueue_many(
                [pgq.JobSpec("long_job", {"seconds": 600}) for _ in range(20)]
            )
        await wait_for(conn, "SELECT count(*) = 20 FROM pgq_jobs WHERE state = 'running'")
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        killed_at = await conn.fetchval("SELECT now()")
        successor = start(worker_name, dsn)
        await wait_for(conn, "SELECT bool_and(attempt = 2 AND state = 'running') FROM pgq_jobs")
        first = await conn.fetchval("SELECT min(attempted_at) FROM pgq_jobs WHERE attempt = 2")
        return float((first - killed_at).total_seconds())
    finally:
        for p in (victim, successor):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
        await conn.close()
        await drop_database(name)


async def restarts(trials: int) -> None:
    s = WorkerSettings()
    for n in range(trials):
        for stable in (True, False):
            seconds = await restart_trial(n, stable)
            kind = "stable name" if stable else "dynamic name"
            # a stable name waits for the fencing bound plus its heartbeat_timeout as a margin
            bound = s.fencing_bound + s.heartbeat_timeout if stable else s.stale_after
            print(
                f"trial {n + 1}, {kind}: re-claimed {seconds:.1f}s after kill -9 and restart "
                f"(the wait it is bound by: {bound:g}s after the last heartbeat)",
                flush=True,
            )
            emit(
                {
                    "system": "pgq",
                    "workload": "kill_restart_reclaim",
                    "stable_name": stable,
                    "seconds": seconds,
                    "bound_s": bound,
                }
            )


async def main() -> None:
    if sys.argv[1:2] == ["restart"]:
        await restarts(int(sys.argv[2]) if len(sys.argv) > 2 else 2)
        return
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    s = WorkerSettings()
    upper = s.stale_after + s.rescue_interval
    lower = s.stale_after - s.heartbeat_interval
    for n in range(trials):
        seconds = await trial(n)
        print(
            f"trial {n + 1}: re-claimed {seconds:.1f}s after kill -9 "
            f"(settings promise {lower:g}s to {upper:g}s plus a moment)",
            flush=True,
        )
        emit(
            {
                "system": "pgq",
                "workload": "kill_reclaim",
                "seconds": seconds,
                "bound_s": upper,
                "settings": {
                    "stale_after": s.stale_after,
                    "rescue_interval": s.rescue_interval,
                    "heartbeat_interval": s.heartbeat_interval,
                },
            }
        )


if __name__ == "__main__":
    asyncio.run(main())
