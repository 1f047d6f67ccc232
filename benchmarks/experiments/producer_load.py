"""What do idle workers cost one Postgres primary?

Answer: 500 idle producers sent 509 statements a second, updated 101 producer rows a second,
wrote 9.6 KB of WAL a second and used 0.15 of a server core (docs/scaling.md).

Heartbeats, idle claims, the leader's lease and rescue rounds, from many producers at pgq's
default intervals.

`python benchmarks/experiments/producer_load.py [WORKERS] [PRODUCERS_PER_WORKER] [SECONDS]`
(default 50 workers x 10 producers = 500 producers, 60 s) simulates the workers in this one
process, each on one connection, running pgq's own store functions (the statements a real
worker sends) on its schedule: one heartbeat per worker every heartbeat_interval (5 s) for all
its producers, one claim per producer every poll_interval (1 s; an idle producer's fetch when
no notification arrives), and, for the leader, the lease every leader_ttl / 3 and a rescue
round every rescue_interval. Prints statements/s, producer rows updated/s, WAL bytes/s and the
CPU the server's processes used (cores), from pg_stat and /proc."""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, run

import asyncpg
from common import drop_database, fresh_database, pgq_migrate

from pgq._db import claims, maintenance, producers
from pgq._db.connections import WORKER_SESSION_SETTINGS
from pgq.settings import WorkerSettings

S = WorkerSettings()


async def worker(dsn: str, index: int, per_worker: int, until: float, counts: list[int]) -> None:
    conn = await asyncpg.connect(dsn, server_settings=WORKER_SESSION_SETTINGS)
    worker_id, name = uuid.uuid4(), f"sim-{index}"
    rows = [
        producers.ProducerRow(uuid.uuid4(), f"q{(index * per_worker + i) % 20}", 10)
        for i in range(per_worker)
    ]
    bounds = producers.Bounds(S.fencing_bound, S.stale_after)
    await producers.register(conn, worker_id, name, rows, bounds)
    lock = asyncio.Lock()  # one connection: one statement at a time, as a pool of one

    async def send(call: object) -> None:
        async with lock:
            await call  # type: ignore[misc]
        counts[0] += 1

    async def heartbeats() -> None:
        await asyncio.sleep(S.heartbeat_interval * (index % 10) / 10)  # spread, as in life
        while time.monotonic() < until:
            beats = [producers.Beat(r.id, 0, True, 0, 0, 0, 0) for r in rows]
            await send(producers.heartbeat(conn, beats))
            await asyncio.sleep(S.heartbeat_interval)

    async def idle_claims(row: producers.ProducerRow, offset: float) -> None:
        plan = claims.ClaimPlan(row.queue, ("noop",), (None,), (20,))
        await asyncio.sleep(offset)
        while time.monotonic() < until:
            await send(claims.claim(conn, plan, row.id, name, 10))
            await asyncio.sleep(S.poll_interval)

    async def leading() -> None:
        next_rescue = 0.0
        while time.monotonic() < until:
            await send(producers.acquire_lease(conn, worker_id, name, S.leader_ttl))
            if time.monotonic() >= next_rescue:
                await send(
                    maintenance.rescue(
                        conn, worker_id, stale_after=S.stale_after, grace=S.rescue_grace, limit=1000
                    )
                )
                next_rescue = time.monotonic() + S.rescue_interval
            await asyncio.sleep(min(S.leader_ttl / 3, S.rescue_interval))

    tasks = [heartbeats(), *(idle_claims(r, (i + index) % 10 / 10) for i, r in enumerate(rows))]
    if index == 0:
        tasks.append(leading())
    try:
        await asyncio.gather(*tasks)
    finally:
        await conn.close()


def server_cpu_s() -> float:
    """CPU seconds used so far by every postgres process on this machine."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)
            if "(postgres" not in stat.read_text().split(")", 1)[0]:
                continue
            values = fields[1].split()
            total += (int(values[11]) + int(values[12])) / tick
        except (OSError, IndexError, ValueError):
            continue
    return total


async def snapshot(dsn: str) -> tuple[int, int, int]:
    conn = await asyncpg.connect(dsn)
    try:
        wal = await conn.fetchval("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
        xacts = await conn.fetchval(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
        )
        updated = await conn.fetchval(
            "SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = 'pgq_producers'"
        )
        return int(wal), int(xacts), int(updated or 0)
    finally:
        await conn.close()


async def main() -> None:
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    per_worker = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 60
    dsn = await fresh_database("pgq_bench_producer_load")
    await pgq_migrate(dsn)
    try:
        counts = [0]
        warmup = 10.0
        until = time.monotonic() + warmup + seconds
        running = asyncio.gather(
            *(worker(dsn, i, per_worker, until, counts) for i in range(workers))
        )
        await asyncio.sleep(warmup)  # every loop started, the heartbeats spread out
        wal0, x0, u0 = await snapshot(dsn)
        cpu0, sent0, t0 = server_cpu_s(), counts[0], time.monotonic()
        # The end is read while every connection is still open: a backend's CPU time is
        # gone from /proc once it exits.
        await asyncio.sleep(until - time.monotonic() - 0.5)
        cpu1, sent1 = server_cpu_s(), counts[0]
        elapsed = time.monotonic() - t0
        await asyncio.sleep(0.6)  # backends flush their statistics at most every 0.5 s
        wal1, x1, u1 = await snapshot(dsn)
        await running
    finally:
        await drop_database("pgq_bench_producer_load")
    print(f"{workers} workers x {per_worker} producers = {workers * per_worker} producers, idle,")
    print(
        f"default intervals (heartbeat {S.heartbeat_interval:g} s, poll {S.poll_interval:g} s, "
        f"rescue {S.rescue_interval:g} s), {elapsed:.0f} s measured"
    )
    print(f"  statements/s            {(sent1 - sent0) / elapsed:10,.0f}")
    print(f"  transactions/s          {(x1 - x0) / elapsed:10,.0f}")
    print(f"  producer rows updated/s {(u1 - u0) / elapsed:10,.0f}")
    print(f"  WAL bytes/s             {(wal1 - wal0) / elapsed:10,.0f}")
    print(f"  server CPU (cores)      {(cpu1 - cpu0) / elapsed:10.3f}")


if __name__ == "__main__":
    asyncio.run(main())
