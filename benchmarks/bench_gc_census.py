"""What the garbage collector finds in an in-process worker, per job.

`python benchmarks/bench_gc_census.py [CONCURRENCY]` (default 1,000), two counts:

- **in flight**: the objects the collector tracks, counted by type (``gc.get_objects()``)
  before the worker starts and again while CONCURRENCY claimed jobs wait on an event, per
  job in flight. These are what its collections traverse while the jobs run; the job's own
  coroutine and what it awaits are among them (two coroutines, a future and its iterator).
- **cycles**: 5 × CONCURRENCY jobs that each await 10 ms, drained with the collector off and
  ``gc.DEBUG_SAVEALL`` on; one collection afterwards finds what only the collector could
  free (reference cycles), per job.

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
_waiting = 0
_all_waiting = asyncio.Event()
_release = asyncio.Event()
_expected = 0


@app.task
async def waits(ctx: pgq.JobContext, i: int) -> None:
    """Counts itself in, then waits until the census is taken."""
    global _waiting
    _waiting += 1
    if _waiting == _expected:
        _all_waiting.set()
    await _release.wait()


@app.task
async def sleeps(ctx: pgq.JobContext, i: int) -> None:
    """A job that waits on I/O for 10 ms."""
    await asyncio.sleep(0.010)


def census() -> collections.Counter[str]:
    """The tracked objects, by type."""
    return collections.Counter(
        f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects()
    )


def show(title: str, counts: collections.Counter[str], per: int) -> None:
    print(f"{title}: {sum(counts.values()) / per:.1f} per job")
    for name, n in counts.most_common(15):
        print(f"  {n / per:6.2f}  {name}")


async def in_flight(dsn: str, concurrency: int) -> None:
    global _expected
    _expected = concurrency
    await pgq_backlog(dsn, app, waits, concurrency)
    gc.collect()
    before = census()

    async def count_then_release() -> None:
        await _all_waiting.wait()
        gc.collect()
        show(f"tracked objects with {concurrency} jobs in flight", census() - before, concurrency)
        _release.set()

    counting = asyncio.ensure_future(count_then_release())
    await pgq.Worker(app, dsn, concurrency=concurrency, metrics=False).run(burst=True)
    await counting


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
    show(f"objects only the collector frees, {n} jobs of 10 ms at {concurrency}", found, n)


async def main() -> None:
    concurrency = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    dsn = await fresh_database("pgq_bench_gc_census")
    await pgq_migrate(dsn)
    print(f"collector: threshold {gc.get_threshold()}, {gc.get_freeze_count()} objects frozen")
    await in_flight(dsn, concurrency)
    await cycles(dsn, concurrency)


if __name__ == "__main__":
    run(main)
