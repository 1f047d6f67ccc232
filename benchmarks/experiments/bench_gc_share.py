"""How much of a worker's CPU does the garbage collector take, by jobs in flight?

Answer: with jobs of 10 ms at Python's settings, 9 % with 100 in flight, 19 % with 300 and
25 % with 1,000; tuned, 0.1 %, 0.2 % and 6 % (docs/embedding.md).

`python benchmarks/experiments/bench_gc_share.py [ROUNDS [CONCURRENCY ...]]` (defaults: 3
rounds; 100 300 1000) drains, per run, 30,000 jobs that each await 10 ms with an in-process
worker (uvloop when installed, metrics off) and prints the process's CPU time during
`run(burst=True)` (`time.process_time`), the time spent in collections (timed from
`gc.callbacks`), their share, and how many collections of each generation ran. Then the median
share per concurrency. With ``BENCH_GC=tuned`` the collector is set up first as `pgq worker`
sets up its own; by default it is left at Python's settings, as an embedded worker leaves its
host's. The shares are what the worker's start-up note (``pgq._core.gc.untuned_note``) and
docs/embedding.md quote."""

from __future__ import annotations

import asyncio
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, run

from common import emit, fresh_database, pgq_backlog, pgq_migrate, run

import pgq

N = 30_000
DURATION = 0.010
app = pgq.App()


@app.task
async def io_job(ctx: pgq.JobContext, i: int) -> None:
    """A job that waits on I/O for DURATION."""
    await asyncio.sleep(DURATION)


class CollectionClock:
    """Times every collection, by generation, while installed in ``gc.callbacks``."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.count = [0, 0, 0]
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            generation = info["generation"]
            self.seconds[generation] += time.perf_counter() - self._began
            self.count[generation] += 1


async def run_once(dsn: str, concurrency: int) -> dict[str, Any]:
    """Drain one backlog at ``concurrency``; the collector's time against the CPU's."""
    await pgq_backlog(dsn, app, io_job, N)
    gc.collect()
    clock = CollectionClock()
    gc.callbacks.append(clock)
    cpu = time.process_time()
    try:
        await pgq.Worker(app, dsn, concurrency=concurrency, metrics=False).run(burst=True)
    finally:
        cpu = time.process_time() - cpu
        gc.callbacks.remove(clock)
    in_gc = sum(clock.seconds)
    return {
        "concurrency": concurrency,
        "cpu_s": round(cpu, 3),
        "gc_s": round(in_gc, 3),
        "gc_share": round(in_gc / cpu, 3),
        "collections": clock.count,
        "gc_s_by_generation": [round(s, 3) for s in clock.seconds],
    }


async def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    levels = [int(c) for c in sys.argv[2:]] or [100, 300, 1000]
    dsn = await fresh_database("pgq_bench_gc_share")
    await pgq_migrate(dsn)
    shares: dict[int, list[float]] = {c: [] for c in levels}
    print(f"collector: threshold {gc.get_threshold()}, {gc.get_freeze_count()} objects frozen")
    for r in range(rounds):
        for concurrency in levels:
            result = await run_once(dsn, concurrency)
            shares[concurrency].append(result["gc_share"])
            print(
                f"round {r + 1} c{concurrency}: cpu {result['cpu_s']:.2f} s, collector "
                f"{result['gc_s']:.3f} s ({result['gc_share']:.0%}), collections by "
                f"generation {result['collections']}",
                flush=True,
            )
            emit({"workload": "gc_share", "round": r + 1, **result})
    for concurrency, values in shares.items():
        print(f"c{concurrency}: median share {statistics.median(values):.0%} of {values}")


if __name__ == "__main__":
    run(main)
