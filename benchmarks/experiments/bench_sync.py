"""Does pgq.SyncClient enqueue as fast as pgq.Client?

Answer: yes: single enqueues at 0.98-1.08 times the async rate and batches of 1,000 at
1.11-1.14 times (target: at least 0.8; docs/transactions.md).

pgq.SyncClient beside pgq.Client: single enqueues and batches, on one database.

`python benchmarks/experiments/bench_sync.py [ROUNDS]` prints jobs/s of each, the median of ROUNDS
(default 5) interleaved rounds, and the sync/async ratio (target >= 0.8).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, run

from common import fresh_database

import pgq
from pgq import migrate

SINGLE = 2000
BATCH_TOTAL, BATCH_SIZE = 20_000, 1000


async def async_single(dsn: str) -> float:
    async with pgq.Client(dsn) as client:
        started = time.perf_counter()
        for i in range(SINGLE):
            await client.enqueue("noop", {"i": i})
        return SINGLE / (time.perf_counter() - started)


async def async_batches(dsn: str) -> float:
    async with pgq.Client(dsn) as client:
        started = time.perf_counter()
        for b in range(BATCH_TOTAL // BATCH_SIZE):
            await client.enqueue_many(
                [pgq.JobSpec("noop", {"i": b * BATCH_SIZE + i}) for i in range(BATCH_SIZE)]
            )
        return BATCH_TOTAL / (time.perf_counter() - started)


def sync_single(dsn: str) -> float:
    with pgq.SyncClient(dsn) as client:
        started = time.perf_counter()
        for i in range(SINGLE):
            client.enqueue("noop", {"i": i})
        return SINGLE / (time.perf_counter() - started)


def sync_batches(dsn: str) -> float:
    with pgq.SyncClient(dsn) as client:
        started = time.perf_counter()
        for b in range(BATCH_TOTAL // BATCH_SIZE):
            client.enqueue_many(
                [pgq.JobSpec("noop", {"i": b * BATCH_SIZE + i}) for i in range(BATCH_SIZE)]
            )
        return BATCH_TOTAL / (time.perf_counter() - started)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    dsn = asyncio.run(fresh_database("pgq_bench_sync"))
    migrate.upgrade(dsn)
    rates: dict[str, list[float]] = {
        k: [] for k in ("async single", "sync single", "async batch", "sync batch")
    }
    for _ in range(rounds):
        rates["async single"].append(asyncio.run(async_single(dsn)))
        rates["sync single"].append(sync_single(dsn))
        rates["async batch"].append(asyncio.run(async_batches(dsn)))
        rates["sync batch"].append(sync_batches(dsn))
    median = {k: statistics.median(v) for k, v in rates.items()}
    for name, rate in median.items():
        print(
            f"{name:<14} {rate:>10,.0f} jobs/s   (rounds: {', '.join(f'{r:,.0f}' for r in rates[name])})"
        )
    for kind in ("single", "batch"):
        ratio = median[f"sync {kind}"] / median[f"async {kind}"]
        print(
            f"sync / async, {kind:<6} {ratio:.2f}  (target >= 0.8: {'met' if ratio >= 0.8 else 'NOT met'})"
        )


if __name__ == "__main__":
    main()
