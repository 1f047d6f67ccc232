"""What the garbage collector finds in an in-process worker, per job.

`python benchmarks/bench_gc_census.py [CONCURRENCY]` (default 1,000), two counts:

- **in flight**: the objects the collector tracks, counted by type (``gc.get_objects()``)
  while one claimed job waits on an event, and again, with a worker of its own, while
  CONCURRENCY do; the change, per job beyond the first. The worker's own objects (its pool,
  connections, loops) are in both counts and cancel out; types whose count fell are counted
  too, negatively. These are what the collections traverse while the jobs run; the job's
  own coroutine and what it awaits are among them (two coroutines, a future and its
  iterator).
- **cycles**: 5 × CONCURRENCY jobs that each await 10 ms, drained with the collector off and
  ``gc.DEBUG_SAVEALL`` on; one collection afterwards finds what only the collector could
  free (reference cycles), per job. The worker's start and stop are in it too, so the figure
  is an upper bound for the jobs.

A tool for finding where the collector's share of an untuned worker's CPU
(`bench_gc_share.py`) comes from, not a timing.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import sys

from common import fresh_database, pgq_backlog, pgq_migrate, run

import pgq

app = pgq.App()


class Waiting:
    """The jobs of one census: how many are waiting, and the events around them."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.count = 0
        self.all_in = asyncio.Event()
        self.release = asyncio.Event()


_now = Waiting(0)


@app.task
async def waits(ctx: pgq.JobContext, i: int) -> None:
    """Counts itself in, then waits until the census is taken."""
    _now.count += 1
    if _now.count == _now.expected:
        _now.all_in.set()
    await _now.release.wait()


@app.task
async def sleeps(ctx: pgq.JobContext, i: int) -> None:
    """A job that waits on I/O for 10 ms."""
    await asyncio.sleep(0.010)


def census() -> collections.Counter[str]:
    """The tracked objects, by type."""
    return collections.Counter(
        f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects()
    )


def show(title: str, counts: dict[str, int], per: int) -> None:
    print(f"{title}: {sum(counts.values()) / per:.1f} per job")
    for name, n in sorted(counts.items(), key=lambda kv: -abs(kv[1]))[:15]:
        print(f"  {n / per:6.2f}  {name}")


async def census_with(dsn: str, jobs: int, concurrency: int) -> collections.Counter[str]:
    """The census while ``jobs`` claimed jobs wait in a worker of ``concurrency``."""
    global _now
    _now = Waiting(jobs)
    await pgq_backlog(dsn, app, waits, jobs)
    taken: collections.Counter[str] = collections.Counter()

    async def count_then_release() -> None:
        await _now.all_in.wait()
        gc.collect()
        taken.update(census())
        _now.release.set()

    counting = asyncio.ensure_future(count_then_release())
    await pgq.Worker(app, dsn, concurrency=concurrency, metrics=False).run(burst=True)
    await counting
    return taken


async def in_flight(dsn: str, concurrency: int) -> None:
    one = await census_with(dsn, 1, concurrency)
    many = await census_with(dsn, concurrency, concurrency)
    change = {k: many[k] - one[k] for k in many.keys() | one.keys() if many[k] != one[k]}
    show(f"tracked objects with {concurrency} jobs in flight, against 1", change, concurrency - 1)


async def cycles(dsn: str, concurrency: int) -> None:
    n = 5 * concurrency
    await pgq_backlog(dsn, app, sleeps, n)
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        await pgq.Worker(app, dsn, concurrency=concurrency, metrics=False).run(burst=True)
        gc.collect()
        found = collections.Counter(
            f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage
        )
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    show(f"objects only the collector frees, {n} jobs of 10 ms at {concurrency}", dict(found), n)


async def main() -> None:
    concurrency = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    dsn = await fresh_database("pgq_bench_gc_census")
    await pgq_migrate(dsn)
    print(f"collector: threshold {gc.get_threshold()}, {gc.get_freeze_count()} objects frozen")
    await in_flight(dsn, concurrency)
    await cycles(dsn, concurrency)


if __name__ == "__main__":
    run(main)
